"""`SetupRefused`: an environment that will not start for a reason the user must fix — no
isolation on this machine can keep agent code in, a path it needs is missing — said in one line
that names the cause and the fix.

`harness_envs` imports nothing of `hsjax`, so it cannot raise `hsjax.infra.errors.UserError`;
`run.py` prints this one the same way (one line, exit status 2, the traceback under `--verbose`).
It subclasses `ValueError` so code that catches bad values keeps working.
"""
from __future__ import annotations


class SetupRefused(ValueError):
    """An environment's refusal to start, with a message naming the cause and the fix."""
