"""`UserError`: a mistake in what the user gave — a config value, a path, a pool or task file —
that one line can explain.

`run.py` prints its message as one line (exit status 2) instead of a traceback; `--verbose` shows
the traceback too. It subclasses `ValueError` so code that catches bad values keeps working.
Raise it only where the cause is certainly the user's input and the message names the thing and
the fix; a bug must keep its traceback.
"""
from __future__ import annotations

import contextlib
import json

from harness_envs.errors import SetupRefused


class UserError(ValueError):
    """Bad user input, with a message naming the thing and the fix."""


class RunStopped(UserError):
    """A run that cannot go on for a cause outside the code, which the user must act on: the disk
    is full, the update went non-finite, every checkpoint is unusable. Not a bug, so `run.py`
    prints it as one line like a `UserError`; the message names the cause, what was kept, and the fix."""


# What `run.py` prints as one line: the user's mistakes, and an environment's refusal to start
# (`harness_envs` cannot raise `UserError`: it imports nothing of hsjax).
ONE_LINE_ERRORS = (UserError, SetupRefused)

# What loading a user-named file or directory raises when the file is missing, unreadable or garbage.
LOAD_ERRORS = (OSError, ValueError, KeyError, TypeError, json.JSONDecodeError, UnicodeDecodeError)


@contextlib.contextmanager
def user_input(what: str, fix: str):
    """Turns the errors of loading `what` (e.g. "model.hf_dir='x'") into one `UserError` line:
    "<what>: <the error> — <fix>". A `UserError` raised inside passes through unchanged."""
    try:
        yield
    except UserError:
        raise
    except LOAD_ERRORS as e:
        detail = " ".join(str(e).split()).rstrip(".") or type(e).__name__
        raise UserError(f"{what}: {type(e).__name__}: {detail[:300]}. {fix}") from e
