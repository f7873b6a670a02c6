"""The Harness-S rescuer of the training loop: the router's top-k for each all-fail group, mapped
back to harness specs; rescue outcomes fed back to the router, which re-anchors on schedule."""
from __future__ import annotations

from typing import Any, Sequence

from hsjax.harness_s.rescue import Rescuer
from hsjax.harness_s.router.profiles import Profiles
from hsjax.harness_s.router.router import Decision, Router


class HarnessSRescuer(Rescuer):
    """The Harness-S rescuer for the trainer: the router's top-k, mapped back to harness specs."""

    def __init__(self, pool: Sequence[Any], router: Router | None = None, **router_kwargs):
        self.pool = list(pool)
        self.by_name = {spec.name: spec for spec in self.pool}
        if len(self.by_name) != len(self.pool):
            raise ValueError(f"HarnessSRescuer pool has duplicate names: {[s.name for s in self.pool]}")
        if router is None:
            router = Router(list(self.by_name), Profiles.from_pool(self.pool), **router_kwargs)
        elif router_kwargs:
            raise ValueError(f"HarnessSRescuer: pass either a router or router options, not both "
                             f"(got {sorted(router_kwargs)})")
        missing = [n for n in router.pool_names if n not in self.by_name]
        if missing:
            raise ValueError(f"router candidates {missing} are not in the pool {sorted(self.by_name)}")
        self.router = router
        self.k = router.k
        self.last_decision: Decision | None = None

    def choose(self, step, group_index, task, failed_results):
        self.last_decision = self.router.top_k(task, failed_results, step=step, group_index=group_index)
        return [self.by_name[h] for h in self.last_decision.harnesses]

    def observe(self, step, outcomes):
        self.router.observe(outcomes)
        if self.router.reanchor_due(step):
            self.router.reanchor(step)

    def drain_log(self) -> list[dict]:
        return self.router.drain_log()

    def metrics(self) -> dict[str, float]:
        """Per-step router metrics (since the last call) and the cumulative counters."""
        return {**self.router.pop_step_metrics(), **self.router.metrics()}

    def state_dict(self) -> dict:
        return {"router": self.router.state_dict()}

    def save_artifacts(self, workdir: str) -> None:
        """`<workdir>/profiles.json`: the router's current (re-anchored) profiles, which Rank-1 reads
        (`rank1.profiles`) to pick one harness per task with what training learned."""
        self.router.profiles.save(workdir)

    def load_state_dict(self, state: dict) -> None:
        if "router" not in state:
            raise ValueError(f"HarnessSRescuer state lacks 'router' (keys: {sorted(state)}); was it "
                             "saved by another rescuer kind?")
        self.router.load_state_dict(state["router"])
