"""A stop asked for by SIGTERM, taken at a step boundary: the loop saves and exits.

Schedulers end a job with SIGTERM and, some seconds later, SIGKILL (a session or a Slurm time limit
ending, a preempted VM). A loop that saves every N steps loses up to N steps to that. Inside
`stop_on_sigterm()` SIGTERM only raises a flag; the loop checks it after each step, saves a
checkpoint of that step and ends with `Stopped` (exit status 143, the shell's 128 + SIGTERM), and
the same command resumes from that step exactly. A step in flight when the signal comes finishes
first: the grace a scheduler gives must exceed one step.

On several hosts the signal reaches each process at its own moment, and a collective save that
only some processes enter would hang; so a multi-process loop asks at every step boundary whether
any process was signalled (`hsjax.infra.distributed.any_process`, one tiny collective) and all of
them stop at that step together. Used by the training loop (hsjax/modes/train.py) and the testbed's
warm start (studies/testbed/warmstart.py).
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
