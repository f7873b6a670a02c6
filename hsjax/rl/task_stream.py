"""The order in which training tasks are drawn: an endless, reproducible stream."""
from __future__ import annotations

import numpy as np


class TaskStream:
    """An endless, reproducible stream of training tasks: a fresh permutation per epoch.

    Its whole state is the position, so checkpointing it makes resumed runs draw the same tasks.
    """

    def __init__(self, tasks, seed: int):
        if not tasks:
            raise ValueError("the training split has no tasks")
        self.tasks, self.seed, self.position = list(tasks), seed, 0

    def _order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.tasks))

    def next(self, count: int) -> list:
        out = []
        for _ in range(count):
            epoch, offset = divmod(self.position, len(self.tasks))
            out.append(self.tasks[self._order(epoch)[offset]])
            self.position += 1
        return out

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = int(state["position"])
