"""Failure taxonomy: one failure mode per finished SWE-Gym episode, by ordered rules.

`assign(trace, report)` is a pure function of the episode's trace (`Trace`: how it ended and what
its calls did) and the scorer's report (`scoring.Report`, or None when scoring did not run). The
first rule that holds names the mode; causes the episode shows come before what the tests show,
and a cause that explains the others comes first:

 1. success              the scorer resolved the patch (every FAIL_TO_PASS and PASS_TO_PASS test
                         passes), however the episode ended, as SWE-bench scores the final patch
 2. context_overflow     the engine aborted the episode for its context budget
 3. policy_error         the engine aborted it because the policy could not answer
 4. env_error            any other abort; the workspace, runtime or scorer failed
 5. malformed_tool_call  it ended on the malformed-call budget
 6. iteration_limit      it ended on the iteration limit (whatever its patch)
 7. syntax_error         a Python file the patch touches does not compile
 8. edit_failed          the patch is empty and at least one editor edit failed (old_str not found
                         or not unique, a refused edit, a bad line number)
 9. no_edit              the patch is empty
10. patch_does_not_apply the patch, or the test patch after it, does not apply (the agent edited
                         files the test patch changes)
11. test_tampering       the scorer refused the patch for touching test infrastructure (conftest.py,
                         pytest configuration, sitecustomize, .pth files, plugin entry points), or
                         the test run's reporting was tampered with; its own mode, so that a policy
                         that learns to game the tests shows in the failure table instead of
                         reading as a broken regression (docs/swegym.md, "Scoring")
12. blind_edit           tests fail and the first edit of an existing file came before any command
                         that ran Python (no reproduction)
13. p2p_broken           a PASS_TO_PASS test fails
14. f2p_failing          a FAIL_TO_PASS test fails (also: the tests ran past their time limit, or
                         the test run ended without its report)
"""
from __future__ import annotations

import dataclasses

from harness_envs.base import ABORT_CONTEXT_OVERFLOW, ABORT_POLICY_ERROR

FAILURE_MODES = (
    "success",
    "malformed_tool_call",
    "iteration_limit",
    "syntax_error",
    "edit_failed",
    "no_edit",
    "patch_does_not_apply",
    "test_tampering",
    "blind_edit",
    "p2p_broken",
    "f2p_failing",
    "context_overflow",
    "policy_error",
    "env_error",
)
# How an episode ended.
STATUSES = ("finished", "iteration_limit", "malformed", "aborted", "env_error")
_APPLY_FAILURES = ("patch_does_not_apply", "test_patch_does_not_apply")
_TAMPERING_FAILURES = ("test_infrastructure", "test_run_tampered")


@dataclasses.dataclass(frozen=True)
class Trace:
    """What the taxonomy reads of an episode. `blind`: the first edit of an existing file came before
    any command that ran Python; `syntax_errors`: {path: error} of the patch's Python files."""

    status: str
    abort_reason: str | None = None
    patch: str = ""
    failed_edits: int = 0
    blind: bool = False
    syntax_errors: dict = dataclasses.field(default_factory=dict)


def assign(trace: Trace, report) -> str:
    """The failure mode of a finished episode (module docstring). `report`: the scorer's report
    (`resolved`, `failure`, `p2p_passed`, `p2p_total`), or None when scoring did not run."""
    if trace.status not in STATUSES:
        raise ValueError(f"episode status {trace.status!r} is not one of {STATUSES}")
    if report is not None and report.resolved:
        return "success"
    if trace.status == "aborted":
        if trace.abort_reason == ABORT_CONTEXT_OVERFLOW:
            return "context_overflow"
        return "policy_error" if trace.abort_reason == ABORT_POLICY_ERROR else "env_error"
    if trace.status == "env_error" or report is None:
        return "env_error"
    if trace.status == "malformed":
        return "malformed_tool_call"
    if trace.status == "iteration_limit":
        return "iteration_limit"
    if trace.syntax_errors:
        return "syntax_error"
    if not trace.patch.strip():
        return "edit_failed" if trace.failed_edits else "no_edit"
    if report.failure in _APPLY_FAILURES:
        return "patch_does_not_apply"
    if report.failure in _TAMPERING_FAILURES:
        return "test_tampering"
    if trace.blind:
        return "blind_edit"
    if report.p2p_passed < report.p2p_total or report.failure == "p2p_broken":
        return "p2p_broken"
    return "f2p_failing"
