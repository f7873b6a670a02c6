"""JSON out of a model's reply: shared by the voters (`parse_ranking`) and the evolution proposer
(`parse_proposals`).

Models wrap the JSON they were asked for in prose or code fences. `json_values(text)` yields, in
order, every JSON value it can find, each with `whole`: True when the value is the whole text or
a whole ``` fence body (optionally tagged, e.g. ```json), False when it was decoded from a `{` in
the middle of prose. Callers accept a bare list only when whole: a list inside prose is more often
an example than the answer.

The work is bounded: `json.JSONDecoder.raw_decode` is tried from at most `MAX_OBJECT_STARTS` `{`
positions (and at most as many fences), so a reply made of braces costs
O(MAX_OBJECT_STARTS * len(text)), not O(len(text)**2). Objects starting after that many braces
are not found.
"""
from __future__ import annotations

import itertools
import json
import re
from typing import Any, Callable, Iterator

MAX_OBJECT_STARTS = 256
_FENCE = re.compile(r"```[A-Za-z0-9_-]*\s*\n?(.*?)```", re.S)
_DECODER = json.JSONDecoder()
# RecursionError: deeply nested brackets exhaust the C scanner's recursion guard.
_DECODE_ERRORS = (ValueError, RecursionError)


def json_values(text: str) -> Iterator[tuple[Any, bool]]:
    """Yields (value, whole) for the JSON in `text`: the whole text, each fence body, then each
    object decoded from a `{` onwards (see the module docstring for the bound)."""
    fences = (m.group(1) for m in _FENCE.finditer(text))
    for chunk in itertools.chain([text], itertools.islice(fences, MAX_OBJECT_STARTS)):
        try:
            yield json.loads(chunk.strip()), True
        except _DECODE_ERRORS:
            pass
    start = text.find("{")
    for _ in range(MAX_OBJECT_STARTS):
        if start < 0:
            return
        try:
            value, _end = _DECODER.raw_decode(text, start)
        except _DECODE_ERRORS:
            pass
        else:
            yield value, False
        start = text.find("{", start + 1)


def find_json(text: str, accept: Callable[[Any, bool], Any]) -> Any:
    """The first `accept(value, whole)` that is not None over `json_values(text)`, else None.

    `accept` picks what the caller wants out of a value (e.g. `value["ranking"]`) or returns None
    to pass it over.
    """
    for value, whole in json_values(text):
        picked = accept(value, whole)
        if picked is not None:
            return picked
    return None
