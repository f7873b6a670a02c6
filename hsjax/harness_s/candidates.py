"""Candidate harnesses along a repair direction: knob values to try, no-op detection, and the
enumeration of single- and two-knob mutations of a base harness.

Everything reads the spec's own knob schema (`HarnessSpec.schema`), so it works for any benchmark.
A knob with `enabled_by` acts only when another knob has one of the given values; setting it alone
changes nothing and is not a candidate. Free-text knobs (a hint line) are never enumerated: only an
LLM proposer fills them.
"""
from __future__ import annotations

import itertools
import json
import random

from harness_envs.harness import Direction, HarnessSpec


def knob_values(spec: HarnessSpec, name: str) -> list:
    """Values tried for a knob, its default excluded: every choice (or the other bool), or for
    an int a ladder around the default (half, double, quadruple; 10/20/50 for a default of 0)."""
    knob = spec.schema[name]
    if knob.type is bool:
        return [not knob.default]
    if knob.choices is not None:
        return [c for c in knob.choices if c != knob.default]
    if knob.type is int:
        ladder = [10, 20, 50] if knob.default == 0 else [knob.default // 2, knob.default * 2, knob.default * 4]
        lo, hi = knob.min if knob.min is not None else -10**9, knob.max if knob.max is not None else 10**9
        return sorted({min(hi, max(lo, v)) for v in ladder} - {knob.default})
    return []


def is_no_op(base: HarnessSpec, changes: dict) -> bool:
    """True if `changes` leaves the base's behaviour unchanged: every value equals the base's, or a
    dependent knob is set while the knob it depends on does not enable it."""
    resolved = {**base.resolved(), **changes}
    effective = {}
    for k, v in changes.items():
        enabled_by = base.schema[k].enabled_by
        if enabled_by is not None:
            parent, enabling = enabled_by
            if resolved[parent] not in enabling:
                continue
        if v != base.knob(k):
            effective[k] = v
    return not effective


def changes_key(changes: dict) -> str:
    return json.dumps(changes, sort_keys=True)


def enumerate_candidates(base: HarnessSpec, direction: Direction, *, max_candidates: int = 12,
                         max_knobs: int = 2, seed: int = 0) -> list[dict]:
    """Knob changes to try along `direction`: every single-knob mutation, then two-knob ones drawn
    with `seed` until `max_candidates`. If the singles alone pass the cap, a seeded sample of them."""
    singles = [{k: v} for k in direction.knobs for v in knob_values(base, k)]
    singles = [c for c in singles if not is_no_op(base, c)]
    rng = random.Random(f"{seed}/candidates/{direction.name}")
    if len(singles) >= max_candidates:
        picked = sorted(rng.sample(range(len(singles)), max_candidates))
        return [singles[i] for i in picked]
    out, seen = list(singles), {changes_key(c) for c in singles}
    if max_knobs >= 2:
        pairs = [{a: va, b: vb} for a, b in itertools.combinations(direction.knobs, 2)
                 for va in knob_values(base, a) for vb in knob_values(base, b)]
        rng.shuffle(pairs)
        for c in pairs:
            if len(out) >= max_candidates:
                break
            if changes_key(c) not in seen and not is_no_op(base, c):
                seen.add(changes_key(c))
                out.append(c)
    return out
