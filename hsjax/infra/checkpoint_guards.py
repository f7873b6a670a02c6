"""What a checkpoint save refuses before, or recognises during, orbax's write: NaN or inf in the
state, and a disk without room (docs/checkpoints.md, "What a save refuses"). Both end a run with
one line (`RunStopped`); `hsjax.infra.checkpoint.Checkpointer.save` calls these."""
from __future__ import annotations

import contextlib
import errno
import logging
import pathlib
import sys

import jax
import jax.numpy as jnp

from hsjax.infra.errors import RunStopped


class DiskFull(RunStopped):
    """A save found, or ran into, too little space; the steps saved before are untouched."""


class NonFiniteState(RunStopped):
    """A save was asked to write NaN or inf; refused, so no checkpoint ever holds them."""


def is_disk_full(error: BaseException) -> bool:
    """Whether `error`, or an error it was raised from, is ENOSPC (orbax passes tensorstore's as a
    ValueError whose text holds "No space left on device")."""
    while error is not None:
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            return True
        if "No space left on device" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def directory_bytes(path: pathlib.Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


@jax.jit
def _finite_leaves(leaves):
    return [jnp.all(jnp.isfinite(x)) for x in leaves]


def refuse_nonfinite(step: int, state_pytree) -> None:
    """NonFiniteState naming the first leaves holding NaN or inf; one reduction per float leaf and
    one transfer of the flags, little next to writing the state."""
    named = [(jax.tree_util.keystr(path), leaf)
             for path, leaf in jax.tree_util.tree_flatten_with_path(state_pytree)[0]
             if hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jnp.inexact)]
    if not named:
        return
    flags = jax.device_get(_finite_leaves([leaf for _, leaf in named]))
    bad = [name for (name, _), ok in zip(named, flags) if not ok]
    if bad:
        raise NonFiniteState(
            f"Refusing to save checkpoint step {step}: {len(bad)} arrays hold NaN or inf "
            f"({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}); the steps saved before are "
            "kept. Find where the values went non-finite (docs/training.md, loss.nonfinite)")


def _orbax_aftermath(unraisable) -> bool:
    """An unraisable error left by an orbax save that failed: its abandoned array writes finishing
    onto the event loop orbax closed, or their coroutines collected at interpreter exit."""
    error = unraisable.exc_value
    return ((isinstance(error, RuntimeError) and str(error) == "Event loop is closed")
            or "write_fragment" in repr(unraisable.object))


@contextlib.contextmanager
def quiet_abandoned_writes():
    """Drops the noise of a failed orbax save, and only that.

    orbax runs a step's array writes under `asyncio.gather` in an event loop of its own, which it
    closes as soon as one write fails (ENOSPC). The other writes, still pending in tensorstore,
    then report `RuntimeError: Event loop is closed` through `sys.unraisablehook` as they finish,
    during the save and after it, and their coroutines do again when collected at exit: a screen of
    tracebacks after the one line that says what happened. The filter is in place for the save and
    stays after a failed one (the writes outlive it); a successful save restores the hook.

    orbax also logs each failed write thread at ERROR with its traceback, and asyncio logs "Task
    exception was never retrieved" for each abandoned write task when it is collected, at a moment
    no one chooses (during the save, after it or at exit: CI once saw it on the console). Both kinds
    of record are lowered to INFO, so they stay in log.txt and leave the console to `DiskFull`'s
    one line."""
    previous = sys.unraisablehook

    def hook(unraisable, _previous=previous, _aftermath=_orbax_aftermath):
        if not _aftermath(unraisable):
            _previous(unraisable)

    loggers = [logging.getLogger(name) for name in _LOGGERS_OF_ABANDONED_WRITES]
    sys.unraisablehook = hook
    for logger in loggers:
        logger.addFilter(_lower_disk_full_records)
    yield
    sys.unraisablehook = previous
    for logger in loggers:
        logger.removeFilter(_lower_disk_full_records)


_LOGGERS_OF_ABANDONED_WRITES = ("absl", "asyncio")


def _lower_disk_full_records(record: logging.LogRecord) -> bool:
    if record.levelno >= logging.ERROR and "No space left on device" in record.getMessage():
        record.levelno, record.levelname = logging.INFO, "INFO"
    return True
