"""Problem statements for built instances, written as issue reports from what the failing tests show.

A statement names the affected function (`module.qualname`) and shows, for up to three of the
FAIL_TO_PASS tests, the line of the test's own code where it failed and the exception or assertion
lines of the pytest log (`E   ...`), with how many checks fail in all. Excerpts are sanitized:
object addresses and machine paths would make the text differ between builds. It never shows the package's
source: no traceback line from the package (the mutated line could be among them), no diff, no
word on what kind of change broke it. One of `TEMPLATES` is chosen by a hash of the instance id, so
the text is deterministic.

`leaks(statement, patch)` is the guard: a statement must contain no line the gold patch adds or
removes (stripped, 6 characters or longer, so that `)` or `else:` do not count). `write` falls back
to fewer excerpts (errors only, then the bare function name) when an excerpt happens to contain one.
"""
from __future__ import annotations

import hashlib
import re

from harness_envs.swegym.builder.testrun import Failure

MAX_SHOWN = 3
MAX_ERROR_LINES = 6
MAX_LINE = 240
MIN_LEAK = 6

TEMPLATES = (
    ("`{target}` returns wrong results",
     "With {package} {version}, `{target}` (in `{module}`) no longer does what it should.{doc}\n\n"
     "In the project's own test suite {checks} {fail}. For example:\n\n{blocks}\n\n"
     "Expected: these calls behave as documented, and the existing tests keep passing."),
    ("Regression in {module}: {name} misbehaves",
     "I'm seeing incorrect behaviour from `{target}` in {package} {version}.{doc}\n\n{blocks}\n\n"
     "({checks} in all.) Could `{name}` be fixed so that these give the expected results?"),
    ("{name}() gives unexpected output",
     "Steps to reproduce, against {package} {version}:\n\n{blocks}\n\n"
     "The function involved is `{target}`.{doc} In all, {checks} {fail}; the rest of the suite "
     "is fine."),
    ("Bug in `{target}`",
     "`{target}` seems broken.{doc}\n\nWhat I ran and what happened:\n\n{blocks}\n\n"
     "Expected: no error, and the result the assertion asks for. In all, {checks} {fail}."),
)


_ADDRESS = re.compile(r"\b0x[0-9a-fA-F]{4,}\b")
_STDLIB = re.compile(r"(?:/[\w.+~-]+)+/lib/python3\.\d+/(?:site-packages/)?")


def sanitize(line: str, roots: tuple[str, ...] = ()) -> str:
    """A log line without what differs between machines and runs: object addresses (`at 0x7f...`
    -> `at 0x...`), the work tree's absolute path (dropped, leaving tree-relative paths) and the
    interpreter's library directory (`/usr/lib/python3.11/operator.py` -> `operator.py`)."""
    for root in roots:
        line = line.replace(root.rstrip("/") + "/", "")
    return _ADDRESS.sub("0x...", _STDLIB.sub("", line))


def _clip(line: str) -> str:
    return line if len(line) <= MAX_LINE else line[:MAX_LINE - 3] + "..."


def _block(failure: Failure, with_code: bool, with_error: bool, roots: tuple[str, ...]) -> str:
    parts = []
    if with_code and failure.test_lines:
        code = "\n".join(_clip(sanitize(line, roots)) for line in failure.test_lines[-3:])
        parts.append(f"```python\n{code}\n```")
    errors = [_clip(sanitize(e, roots)) for e in failure.error if e.strip()][:MAX_ERROR_LINES]
    if with_error and errors:
        joined = "\n".join(errors)
        parts.append(f"fails with:\n\n```\n{joined}\n```" if parts else f"```\n{joined}\n```")
    return "\n\n".join(parts)


def changed_lines(patch: str) -> list[str]:
    """The stripped lines a patch adds or removes that are long enough to be telling."""
    out = []
    for line in patch.splitlines():
        if line.startswith(("+++", "---")) or not line.startswith(("+", "-")):
            continue
        text = line[1:].strip()
        if len(text) >= MIN_LEAK:
            out.append(text)
    return out


def leaks(statement: str, patch: str) -> bool:
    return any(line in statement for line in changed_lines(patch))


def write(instance_id: str, package: str, version: str, module: str, qualname: str, doc: str,
          failures: list[Failure], n_failing: int, patch: str, roots: tuple[str, ...] = ()) -> str:
    """The statement for one instance (see the module docstring); `roots` are absolute paths of the
    run (the work tree) that `sanitize` cuts from the excerpts."""
    choice = int(hashlib.sha256(instance_id.encode()).hexdigest(), 16) % len(TEMPLATES)
    title, body = TEMPLATES[choice]
    name = qualname.rsplit(".", 1)[-1]
    doc_line = f" Its docstring says: \"{_clip(doc)}\"" if doc else ""
    checks, fail = (f"{n_failing} check", "fails") if n_failing == 1 else (f"{n_failing} checks", "fail")
    fields = dict(target=f"{module}.{qualname}", module=module, name=name, package=package, version=version)
    for with_code, with_error in ((True, True), (False, True), (False, False)):
        blocks = [b for b in (_block(f, with_code, with_error, roots) for f in failures[:MAX_SHOWN]) if b]
        text = ("\n\n".join(blocks) if blocks
                else f"Calling `{name}` the way the documentation describes gives wrong results.")
        statement = (title.format(**fields) + "\n\n" + body.format(**fields, doc=doc_line, checks=checks, fail=fail,
                                                                   blocks=text)).strip() + "\n"
        if not leaks(statement, patch):
            return statement
    return f"`{module}.{qualname}` gives wrong results in {package} {version}.\n"
