"""What a run prints, and where the libraries' chatter goes.

The console shows a run's progress: the progress bar, a line per step every few steps, and the
result. Every log record at INFO and above (orbax, httpx, the voter servers, hsjax itself) goes
to `<workdir>/log.txt`; the console gets only warnings and errors (less orbax's
`EXPECTED_WARNINGS`), unless `verbose` brings INFO back (`run.py --verbose`). Both handlers
redact every registered secret (`hsjax.infra.secrets`) from each record before it is written.
"""
from __future__ import annotations

import logging
import os
import sys
from typing import Mapping

import tqdm

from hsjax.infra import secrets
from hsjax.infra.metrics import encodable_text

LOG_FILE = "log.txt"
# Warnings orbax logs on every read hsjax makes on purpose that way: a read-only manager (export,
# probe, eval of a workdir) and a params-only restore that leaves the "host" item (the run's
# data-loader and router state) unread. They stay in log.txt; on the console they read as faults.
EXPECTED_WARNINGS = ("CheckpointManagerOptions.read_only=True", "Given directory is read only=",
                     'Item "host" was found in the checkpoint, but could not be restored')
_quiet = False  # set on every process but the first of a multi-process run
_FORMAT = "%(asctime)s %(levelname).1s %(name)s: %(message)s"
_MARK = "_hsjax_handler"


class _DropExpectedWarnings(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.WARNING
                    and record.getMessage().startswith(EXPECTED_WARNINGS))


class _EncodableFormatter(logging.Formatter):
    """A record may quote an agent's text, lone surrogates and all (`metrics.encodable_text`): it is
    written escaped, where a strict stream would drop it with a "--- Logging error ---" dump."""

    def format(self, record: logging.LogRecord) -> str:
        return encodable_text(super().format(record))


def setup_logging(workdir: str, *, verbose: bool = False, process_index: int = 0) -> str:
    """Routes logging: INFO and above to `<workdir>/log.txt`, the console WARNING (INFO if
    `verbose`). Replaces the handlers on the root logger (absl's included); returns the log path.
    Each handler carries a `secrets.RedactingFilter`, so no registered key reaches either.

    In a multi-process run, process i > 0 logs to `log.process<i>.txt` and prints nothing but its
    warnings and errors: the console is process 0's."""
    global _quiet
    _quiet = process_index > 0
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, LOG_FILE if process_index == 0 else f"log.process{process_index}.txt")
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
        if getattr(handler, _MARK, False):
            handler.close()
    file_handler = logging.FileHandler(path, encoding="utf-8", errors="backslashreplace")
    file_handler.setLevel(logging.INFO)
    file_handler.setFormatter(_EncodableFormatter(_FORMAT))
    console = logging.StreamHandler(sys.stderr)
    console.setLevel(logging.INFO if verbose else logging.WARNING)
    console.setFormatter(_EncodableFormatter("%(levelname)s %(name)s: %(message)s"))
    console.addFilter(_DropExpectedWarnings())
    for handler in (file_handler, console):
        setattr(handler, _MARK, True)
        handler.addFilter(secrets.RedactingFilter())
        root.addHandler(handler)
    root.setLevel(logging.INFO)
    return path


def route_native_stdout(log_path: str) -> None:
    """Points file descriptor 1 at the log file and keeps Python's `sys.stdout` (the console) on a
    duplicate of what it was. Native libraries write to descriptor 1 themselves, past `logging`:
    gloo, JAX's CPU collectives, prints a connection line per peer from several threads, which
    interleave mid-line. For `run.py` only: it changes the process's descriptors for good."""
    sys.stdout.flush()
    console_fd = os.dup(1)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log_fd, 1)
    os.close(log_fd)
    # backslashreplace, as Python's own stderr: a printed string holding a lone surrogate (an agent's
    # output) is shown escaped instead of ending the run with UnicodeEncodeError.
    sys.stdout = os.fdopen(console_fd, "w", buffering=1, encoding=sys.stdout.encoding or "utf-8",
                           errors="backslashreplace")


def say(text: str) -> None:
    """A line for the console (beside a progress bar, if one is drawn); process 0's only."""
    if _quiet:
        return
    tqdm.tqdm.write(encodable_text(text), file=sys.stdout)  # a stdout with errors="strict" may be anyone's
    sys.stdout.flush()


def step_line(step: int, total: int, metrics: Mapping[str, float], keys: Mapping[str, str]) -> str:
    """`step 5/10 | reward 0.25 | rescue 3 | ...`: the metrics `keys` ({label: metric name}) present."""
    parts = [f"step {step}/{total}"]
    for label, name in keys.items():
        value = metrics.get(name)
        if value is None:
            continue
        parts.append(f"{label} {value:.3g}" if isinstance(value, float) else f"{label} {value}")
    return " | ".join(parts)
