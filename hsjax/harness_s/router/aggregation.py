"""The router's pure parts: vote aggregation, score combination and ranking, and the failed
group as the voters and the profiles see it (mode frequencies, a short summary, outcomes)."""
from __future__ import annotations

import collections
from typing import Any, Sequence

AGGREGATIONS = ("majority", "borda", "weighted")
_TIE_DIGITS = 12  # scores equal to 12 decimals are ties, whatever order the sums ran in


def aggregate(rankings: dict[str, list[str]], candidates: Sequence[str], rule: str,
              weights: dict[str, float] | None = None) -> dict[str, float]:
    """Vote scores in [0, 1] for every candidate from voter rankings (best first, possibly partial).

    majority: share of voters that ranked h first.
    borda:    a voter gives n-1-i points to its i-th name (n candidates; unranked names get 0);
              h's points over the most possible, n-1 per voter.
    weighted: borda with voter v's points multiplied by weights[v], divided by the sum of weights.
    Majority and Borda count one vote per voter; only `weighted` uses the weights.
    """
    if rule not in AGGREGATIONS:
        raise ValueError(f"aggregation={rule!r}: expected one of {AGGREGATIONS}")
    scores = {h: 0.0 for h in candidates}
    if not rankings:
        return scores
    n = len(candidates)
    if rule == "majority":
        for ranking in rankings.values():
            if ranking and ranking[0] in scores:
                scores[ranking[0]] += 1.0
        return {h: s / len(rankings) for h, s in scores.items()}
    w = {v: (weights or {}).get(v, 1.0) if rule == "weighted" else 1.0 for v in rankings}
    total = sum(w.values()) * max(n - 1, 1)
    if total <= 0:
        return scores
    for v, ranking in rankings.items():
        for i, h in enumerate(ranking):
            if h in scores:
                scores[h] += w[v] * (max(n - 1 - i, 0) if n > 1 else 1)
    return {h: s / total for h, s in scores.items()}


def combine(profile_scores: dict[str, float], vote_scores: dict[str, float] | None,
            profile_weight: float) -> dict[str, float]:
    if vote_scores is None:
        return dict(profile_scores)
    return {h: profile_weight * p + (1.0 - profile_weight) * vote_scores.get(h, 0.0)
            for h, p in profile_scores.items()}


def ranked(scores: dict[str, float], profile_scores: dict[str, float],
           tie_order: Sequence[str] | None = None) -> list[str]:
    """Candidates best first; ties by profile score, then by their place in `tie_order` (the
    router's seeded shuffle), then by name."""
    place = {h: i for i, h in enumerate(tie_order or ())}
    return sorted(scores, key=lambda h: (-round(scores[h], _TIE_DIGITS),
                                         -round(profile_scores.get(h, 0.0), _TIE_DIGITS),
                                         place.get(h, len(place)), h))


def mode_frequencies(failed_results: Sequence[dict]) -> dict[str, float]:
    """Share of each failure mode in the failed group (sorted by name; empty if none is known)."""
    modes = [r.get("failure_mode") for r in failed_results if r.get("failure_mode")]
    counts = collections.Counter(modes)
    return {m: counts[m] / len(modes) for m in sorted(counts)}


def dominant_mode(freqs: dict[str, float]) -> str | None:
    return min(freqs, key=lambda m: (-freqs[m], m)) if freqs else None


def task_field(obj: Any, name: str, default=None):
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def group_summary(failed_results: Sequence[dict]) -> str:
    """A few lines on the failed group for the voters."""
    n = len(failed_results)
    modes = collections.Counter(r.get("failure_mode") or "unknown" for r in failed_results)
    by_count = sorted(modes.items(), key=lambda kv: (-kv[1], kv[0]))
    parts = [f"{n} rollouts under the base harness, all failed.",
             "failure modes: " + ", ".join(f"{m} x{c}" for m, c in by_count)]
    turns = [r["num_turns"] for r in failed_results if isinstance(r.get("num_turns"), (int, float))]
    if turns:
        parts.append(f"mean turns: {sum(turns) / len(turns):.1f}")
    for r in failed_results[:2]:
        snip = _snippet(r)
        if snip:
            parts.append(f"example ({r.get('failure_mode') or 'unknown'}): {snip}")
    return "\n".join(parts)


def _snippet(result: dict, chars: int = 240) -> str:
    if result.get("snippet"):
        return " ".join(str(result["snippet"]).split())[:chars]
    turns = result.get("turns") or []
    if turns and isinstance(turns[-1], dict) and turns[-1].get("reply"):
        return f"last reply ({turns[-1].get('kind')}): " + " ".join(str(turns[-1]["reply"]).split())[:chars]
    return ""


def rescue_outcome(outcome: dict, pending: dict | None) -> dict:
    """An episode result of a rescue rollout as a profile outcome. The result's own `failure_mode`
    is the rescue rollout's; the base group's mode comes from `base_failure_mode` or the decision."""
    success = outcome.get("success")
    if success is None:
        success = float(outcome.get("reward") or 0.0) > 0.0
    mode = outcome.get("base_failure_mode")
    if mode is None and pending is not None:
        mode = pending.get("failure_mode")
    task_type = outcome.get("task_type", outcome.get("type"))
    if task_type is None and pending is not None:
        task_type = pending.get("task_type")
    return {"harness": outcome["harness"], "task_type": task_type, "base_failure_mode": mode,
            "success": bool(success), "num_turns": outcome.get("num_turns"),
            "num_tokens": outcome.get("num_tokens"), "snippet": _snippet(outcome) or None,
            "base_valid": outcome.get("base_valid")}
