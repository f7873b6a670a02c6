"""A pytest plugin for the builder's one traced run of a pristine suite: which test files execute
which lines of the package's source.

Loaded as `-p _hsjax_linetrace` from a copy of this file (the test process must not import hsjax).
`HSJAX_TRACE_FILES` lists the source files to watch (os.pathsep-separated real paths),
`HSJAX_TRACE_OUT` is where the JSON {"file:line": [test files]} goes at the end. Lines run outside
a test (imports during collection) are attributed to "*" (every test file). Standard library only.
"""
import json
import os
import sys
import threading

import pytest

_WATCH = set(os.environ.get("HSJAX_TRACE_FILES", "").split(os.pathsep)) - {""}
_current = ["*"]
_hits = {}
_known = {}


def _watched(filename):
    hit = _known.get(filename)
    if hit is None:
        hit = _known[filename] = os.path.realpath(filename) in _WATCH
    return hit


def _local(frame, event, arg):
    if event == "line":
        key = (frame.f_code.co_filename, frame.f_lineno)
        seen = _hits.get(key)
        if seen is None:
            seen = _hits[key] = set()
        seen.add(_current[0])
    return _local


def _global(frame, event, arg):
    return _local if _watched(frame.f_code.co_filename) else None


def pytest_configure(config):
    sys.settrace(_global)
    threading.settrace(_global)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _current[0] = item.nodeid.split("::", 1)[0]
    yield
    _current[0] = "*"


def pytest_unconfigure(config):
    sys.settrace(None)
    threading.settrace(None)
    out = {f"{os.path.realpath(f)}:{line}": sorted(files) for (f, line), files in _hits.items()}
    with open(os.environ["HSJAX_TRACE_OUT"], "w", encoding="utf-8") as f:
        json.dump(out, f)
