"""A stop asked for by SIGTERM, taken at a step boundary: the loop saves and exits.

Schedulers end a job with SIGTERM and, some seconds later, SIGKILL (a session or a Slurm time limit
ending, a preempted VM). A loop that saves every N steps loses up to N steps to that. Inside
`stop_on_sigterm()` SIGTERM only raises a flag; the loop checks it after each step, saves a
checkpoint of that step and ends with `Stopped` (exit status 143, the shell's 128 + SIGTERM), and
the same command resumes from that step exactly. A step in flight when the signal comes finishes
first: the grace a scheduler gives must exceed one step.

Single-process loops only (the warm starts of studies/testbed). On several hosts the processes
would first have to agree on the step to stop at (the signal reaches each at its own step), or
their collective save would hang; the multi-host training loop keeps its periodic checkpoints.
"""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

EXIT_STATUS = 128 + signal.SIGTERM


class Stopped(SystemExit):
    """The loop saved at a step boundary after SIGTERM; the same command resumes."""

    def __init__(self, step: int):
        super().__init__(EXIT_STATUS)
        self.step = step


class StopFlag:
    def __init__(self):
        self.signum: int | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[StopFlag]:
    """While inside, SIGTERM sets the yielded flag instead of ending the process; the previous
    handler is restored on exit. Outside the main thread (where Python cannot set handlers) the flag
    never rises and SIGTERM keeps its usual effect."""
    flag = StopFlag()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def raise_flag(signum, frame):
        flag.signum = signum

    previous = signal.signal(signal.SIGTERM, raise_flag)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGTERM, previous)
