"""Every rescue kind in one table: `rescue.kind` -> the keys of `config.rescue` it reads (a typed
config) and the constructor of its rescuer.

    none        plain GRPO: an all-fail group gives no signal
    random      k siblings of the pool drawn per failed group (`rescue.k`)
    fixed       the siblings `rescue.siblings` names, for every failed group
    hint        Guide-GRPO's rescuer: one hint-augmented copy of the base harness (`rescue.hint`)
    harness_s   the Harness-S router (the `router` block) choosing k siblings per failed group

Adding a kind is one config class and one row of `RESCUE_KINDS`. `rescue.m` (rollouts per chosen
harness) is read by the training loop for every kind that rescues.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from harness_envs.harness import Pool
from hsjax.harness_s.rescue import FixedSiblings, NoRescue, RandomSiblings, Rescuer
from hsjax.harness_s.router import HarnessSRescuer, Profiles, Router, VoterSpec
from hsjax.infra import config_blocks

# router.validity: "replay" checks every successful rescue against the base harness
# (hsjax.harness_s.replay) and weighs siblings by the share that was valid; "off" checks nothing.
VALIDITY_CHECKS = ("off", "replay")


@dataclasses.dataclass(frozen=True)
class NoRescueConfig(config_blocks.BlockConfig):
    """`rescue.kind=none`: reads nothing."""

    def harnesses(self, pool: Pool) -> list:
        """The harnesses this kind's rescuer chooses from (the harness ids of a training run)."""
        return list(pool.siblings)


@dataclasses.dataclass(frozen=True)
class RandomRescueConfig(NoRescueConfig):
    k: int
    m: int


@dataclasses.dataclass(frozen=True)
class FixedRescueConfig(NoRescueConfig):
    siblings: tuple
    m: int


@dataclasses.dataclass(frozen=True)
class HintRescueConfig(NoRescueConfig):
    hint: str
    m: int

    def harnesses(self, pool: Pool) -> list:
        return [pool.base.with_knobs(name="hint", direction="hint", hint=self.hint)]


@dataclasses.dataclass(frozen=True)
class HarnessSRescueConfig(NoRescueConfig):
    k: int
    m: int


@dataclasses.dataclass(frozen=True)
class BuildContext:
    """What a rescuer is built from besides its own block: the run's seed, its `router` block
    (None when the config has none) and the voters the run started itself."""

    seed: int = 0
    router: object = None
    extra_voters: Sequence = ()


def _fixed(cfg: FixedRescueConfig, candidates: list, ctx: BuildContext) -> Rescuer:
    by_name = {spec.name: spec for spec in candidates}
    missing = [n for n in cfg.siblings if n not in by_name]
    if missing:
        raise ValueError(f"rescue.siblings names {missing} not in the pool {sorted(by_name)}")
    return FixedSiblings([by_name[n] for n in cfg.siblings])


def _harness_s(cfg: HarnessSRescueConfig, candidates: list, ctx: BuildContext) -> Rescuer:
    if ctx.router is None:
        raise ValueError("rescue.kind=harness_s needs the router block: use the :harness_s variant")
    return build_harness_s_rescuer(ctx.router, candidates, cfg.k, ctx.extra_voters, seed=ctx.seed)


@dataclasses.dataclass(frozen=True)
class RescueKind:
    """One rescue kind: its typed config and `build(config, candidate harnesses, context)`."""

    config: type[NoRescueConfig]
    build: Callable[..., Rescuer]


RESCUE_KINDS: dict[str, RescueKind] = {
    "none": RescueKind(NoRescueConfig, lambda cfg, candidates, ctx: NoRescue()),
    "random": RescueKind(RandomRescueConfig,
                         lambda cfg, candidates, ctx: RandomSiblings(candidates, cfg.k, ctx.seed)),
    "fixed": RescueKind(FixedRescueConfig, _fixed),
    "hint": RescueKind(HintRescueConfig, lambda cfg, candidates, ctx: FixedSiblings(candidates)),
    "harness_s": RescueKind(HarnessSRescueConfig, _harness_s),
}


def rescue_config(block, path: str = "rescue") -> NoRescueConfig:
    """The typed config of the kind `block.kind` names (a `ValueError` for a kind not in the table)."""
    kind = block["kind"]
    if kind not in RESCUE_KINDS:
        raise ValueError(f"{path}.kind={kind!r}: expected one of {', '.join(map(repr, RESCUE_KINDS))}")
    return RESCUE_KINDS[kind].config.from_block(block, path)


def make_rescuer(block, pool: Pool, ctx: BuildContext) -> Rescuer:
    """The rescuer `block.kind` names, choosing from that kind's harnesses of `pool`."""
    cfg = rescue_config(block)
    return RESCUE_KINDS[block["kind"]].build(cfg, cfg.harnesses(pool), ctx)


def unread(block, path: str = "rescue") -> dict[str, str]:
    """The keys of the rescue block its kind never reads."""
    return config_blocks.unread(block, path, {kind: row.config for kind, row in RESCUE_KINDS.items()})


def build_harness_s_rescuer(r, pool, k: int, extra_voters=(), *, seed: int = 0) -> HarnessSRescuer:
    """The Harness-S rescuer from a `router` block (aggregation, profile_weight, explore, selection,
    tie_break, validity, validity_weight, validity_floor, decay, reanchor_every, voters: list of VoterSpec field
    dicts) over the sibling specs `pool`; `seed` seeds its random choices (the run's seed)."""
    profiles = Profiles.from_pool(pool)
    voters = []
    fields = [f.name for f in dataclasses.fields(VoterSpec)]
    for i, v in enumerate(r.voters or ()):
        v = dict(v)
        unknown = set(v) - set(fields)
        if unknown:
            raise ValueError(f"config.router.voters[{i}] has unknown keys {sorted(unknown)}; "
                             f"VoterSpec takes {fields}")
        voters.append(VoterSpec(**v))
    # Voters started by the run itself (local servers): their URLs change between runs, so they
    # never enter the config; the router's records of them are keyed by their stable names.
    voters.extend(VoterSpec(**dict(v)) for v in extra_voters)
    if r.validity not in VALIDITY_CHECKS:
        raise ValueError(f"router.validity={r.validity!r}: expected one of {VALIDITY_CHECKS}")
    router = Router([s.name for s in pool], profiles, voters, k=k, aggregation=r.aggregation,
                    profile_weight=r.profile_weight, explore=r.explore, decay=r.decay,
                    reanchor_every=r.reanchor_every, selection=r.selection, tie_break=r.tie_break,
                    seed=seed, validity_weight=r.validity_weight if r.validity == "replay" else 0.0,
                    validity_floor=r.validity_floor if r.validity == "replay" else 0.0)
    return HarnessSRescuer(pool, router)
