"""Scripted agents as plans: one generator per episode that yields the agent's replies and is sent
each new observation. Every benchmark's oracle and slipping agents are `PlanAgent`s.

    class Oracle(PlanAgent):
        def _new_plan(self, info):            # info: the episode's info dict, with info["task"]
            return oracle_plan(info["task"])

A `PlanAgent` is a chat policy (`chat(contexts, sampling, infos)`); episodes are told apart by
`info["episode_id"]` (else task, harness and sample index). At most `MAX_TRACKED_EPISODES` plans are
kept, the oldest dropped first, so a long run of agents that are never told an episode ended holds
bounded memory.

A `SlipDrawingAgent` is the oracle with slips: deliberate mistakes (`Slip`), each failing under the base
harness with one failure mode and repaired by one sibling of the shipped pool. A benchmark's
subclass names its `SLIPS` and writes `_new_plan`; the slips of an episode are drawn from a random
stream of (seed, task id, sample index) alone, never the harness, so the agent behaves the same
under every harness.
"""
from __future__ import annotations

import collections
import dataclasses
import random
from typing import ClassVar, Generator

Plan = Generator[str, str, None]
MAX_TRACKED_EPISODES = 50_000


class PlanAgent:
    """Runs one plan generator per episode; each call sends it the latest observation."""

    def __init__(self):
        self._plans: collections.OrderedDict[str, Plan] = collections.OrderedDict()

    def _new_plan(self, info: dict) -> Plan:
        raise NotImplementedError

    def chat(self, contexts: list[list[dict]], sampling=None, infos: list[dict] | None = None) -> list[str]:
        if infos is None or len(infos) != len(contexts):
            raise ValueError(f"{type(self).__name__}.chat needs one info dict per context (episode.info); "
                             f"got {0 if infos is None else len(infos)} for {len(contexts)} contexts")
        return [self._reply(ctx, info) for ctx, info in zip(contexts, infos)]

    def _reply(self, context: list[dict], info: dict) -> str:
        if "task" not in info:
            raise KeyError(f"{type(self).__name__} reads the gold from info['task']; got keys {sorted(info)}")
        key = info.get("episode_id") or f"{info.get('task_id')}/{info.get('harness')}/{info.get('sample_index', 0)}"
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._new_plan(info)
            while len(self._plans) > MAX_TRACKED_EPISODES:
                self._plans.popitem(last=False)
            return next(plan)
        last = context[-1]["content"] if context and context[-1].get("role") == "user" else ""
        return plan.send(last)

    def forget(self, episode_id: str) -> None:
        self._plans.pop(episode_id, None)


@dataclasses.dataclass(frozen=True)
class Slip:
    failure_mode: str  # under the base harness
    sibling: str  # the shipped sibling that repairs it
    doc: str


class SlipDrawingAgent(PlanAgent):
    """The oracle with slips: `noise` maps slip names of `SLIPS` to probabilities per episode."""

    SLIPS: ClassVar[dict[str, Slip]]
    slip_noun: ClassVar[str] = "slip"  # how an unknown slip's error names it ("AppWorld slip")

    def __init__(self, noise: dict[str, float] | None = None, seed: int = 0):
        super().__init__()
        noise = {k: float(v) for k, v in (noise or {}).items()}
        unknown = sorted(set(noise) - set(self.SLIPS))
        if unknown:
            raise ValueError(f"unknown {self.slip_noun}(s) {unknown}; known slips: {sorted(self.SLIPS)}")
        bad = {k: p for k, p in noise.items() if not 0.0 <= p <= 1.0}
        if bad:
            raise ValueError(f"slip probabilities must be in [0, 1], got {bad}")
        self.noise, self.seed = noise, int(seed)

    def episode_random(self, info: dict) -> random.Random:
        """The episode's random stream; its first draws pick the slips (`slips_for`)."""
        return random.Random(f"{self.seed}/{info['task_id']}/{info.get('sample_index', 0)}")

    def draw_slips(self, rng: random.Random) -> frozenset[str]:
        return frozenset(name for name in self.SLIPS if rng.random() < self.noise.get(name, 0.0))

    def slips_for(self, info: dict) -> frozenset[str]:
        """The slips of the episode of `info`; a pure function of (seed, task id, sample index)."""
        return self.draw_slips(self.episode_random(info))
