"""Final answers as DBBench scores them: read as a list of strings, normalized on request.

The `answer_normalization` knob applies `normalize_answer` before scoring; the taxonomy's
`answer_format` mode asks whether the strip normalization would have made an answer right.
"""
from __future__ import annotations

import ast
import json
import math
import re

NORMALIZATIONS = ("none", "strip", "numeric")
_QUOTES = "'`"


def _clean_item(text: str) -> str:
    """Strips whitespace and surrounding single quotes/backticks (copied from raw SQL results such as
    `[('Vienna',)]`). Double quotes stay: gold answers may contain them (e.g. a quoted title)."""
    prev = None
    while prev != text:
        prev = text
        text = text.strip()
        if len(text) >= 2 and text[0] == text[-1] and text[0] in _QUOTES:
            text = text[1:-1]
    return text


_PLAIN_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)")


def _canonical_number(text: str) -> str:
    """'12' -> '12.0', '3.50' -> '3.5' (the labels' float style); other text unchanged."""
    if _PLAIN_NUMBER.fullmatch(text) and len(text) <= 15:
        value = float(text)
        if math.isfinite(value):
            return repr(value)
    return text


def answer_items(answer: str) -> list[str]:
    """The answer as a list of strings, read the way the scorer reads it (a list literal, else one item)."""
    text = answer.strip()
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return [answer]
    if isinstance(value, (list, tuple, set)):
        return [str(v) for v in value]
    return [str(value)]


def normalize_answer(answer: str | None, mode: str) -> str | None:
    """none: unchanged. strip: each item loses surrounding whitespace, single quotes and backticks.
    numeric: strip, then plain numbers in the labels' float style ('12' -> '12.0'). The result is a
    JSON list of strings, which the scorer reads as the same list."""
    if answer is None or mode == "none":
        return answer
    if mode not in NORMALIZATIONS:
        raise ValueError(f"answer_normalization {mode!r} is not one of {NORMALIZATIONS}")
    items = [_clean_item(x) for x in answer_items(answer)]
    if mode == "numeric":
        items = [_canonical_number(x) for x in items]
    return json.dumps(items, ensure_ascii=False)


def is_empty_answer(answer: str | None) -> bool:
    """True for a missing answer, blank text, or an answer list whose items are all blank."""
    if answer is None or not answer.strip():
        return True
    return all(not _clean_item(x).strip('"') for x in answer_items(answer))
