"""DBBench scoring: AgentBench v0.2 rules (default) and the later lenient rule.

v0.2: INSERT/UPDATE(/DELETE) items are correct when the table hash after the episode equals
`answer_md5` as a string. SELECT-family answers are parsed as a Python literal and listed
(`list(eval(answer))` upstream; here `ast.literal_eval`, never `eval`), falling back to
`[answer]`; one answer against one label compares as floats when both parse, else as exact
strings; otherwise the two sets must be equal.

lenient (AgentBench main branch): answers and labels are cleaned (quotes and whitespace stripped,
`%` and thousands separators removed, None/null/nan/inf/"" read as "0"); numbers compare with
tolerance 1e-2, several numbers as multisets with tolerance, anything else as sets.
"""
from __future__ import annotations

import ast
from typing import Iterable

from harness_envs.benchmark import percent_table
from harness_envs.dbbench.data import CATEGORIES, MODIFY_TYPES, SELECT_TYPES, DBTask, category, is_modification

RULES = ("v0.2", "lenient")
FLOAT_TOLERANCE = 1e-2
_MAX_ANSWER_CHARS = 100_000  # literal parsing of huge strings is slow; such answers stay strings


def parse_answer_list(answer: str) -> list:
    """`list(eval(answer))` with a literal-only parser; `[answer]` when that fails."""
    if len(answer) > _MAX_ANSWER_CHARS:
        return [answer]
    try:
        return list(ast.literal_eval(answer))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return [answer]


def _float_or_none(value):
    try:
        return float(value)
    except (ValueError, TypeError, OverflowError):
        return None


def _select_correct_v02(answer: str, label: tuple[str, ...]) -> bool:
    ans = parse_answer_list(answer)
    if len(ans) == 1 and len(label) == 1:
        a, g = _float_or_none(ans[0]), _float_or_none(label[0])
        if a is not None and g is not None:
            return a == g
        return ans[0] == label[0]
    try:
        return set(ans) == set(label)
    except TypeError:  # unhashable items (nested lists): never equal to a set of strings
        return False


# ----------------------------------------------------------------------------------------------
# lenient rule

_SPECIAL_AS_ZERO = {"none", "null", "undefined", "nan", "inf", "infinity", "-inf", "-infinity", ""}


def _normalize_value(value) -> str:
    text = "0" if value is None else str(value).strip()
    if text.endswith("%"):
        text = text[:-1].strip()
    if "," in text and not (text.startswith("[") or text.endswith("]")):
        text = text.replace(",", "")
    return "0" if text.lower() in _SPECIAL_AS_ZERO else text


def _strip_item(value) -> str:
    if isinstance(value, tuple) and len(value) == 1:
        value = value[0]
    return str(value).strip().strip("'\"")


def _split_outside_quotes(inner: str) -> list[str]:
    items, current, in_quotes = [], "", False
    for ch in inner:
        if ch in "'\"":
            in_quotes = not in_quotes
        elif ch == "," and not in_quotes:
            if current:
                items.append(current)
            current = ""
        else:
            current += ch
    if current:
        items.append(current)
    return items


def clean_lenient(answer) -> list[str]:
    """The lenient rule's cleaned list of answer strings."""
    if answer is None:
        return ["0"]
    if isinstance(answer, (list, tuple)):
        return [_normalize_value(_strip_item(x)) for x in answer]
    text = str(answer).strip()
    if text.startswith("[") and text.endswith("]"):
        parsed = None
        if len(text) <= _MAX_ANSWER_CHARS:
            try:
                parsed = ast.literal_eval(text)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                parsed = None
        if isinstance(parsed, list):
            return [_normalize_value(_strip_item(x)) for x in parsed]
        return [_normalize_value(x.strip().strip("'\"")) for x in _split_outside_quotes(text[1:-1])]
    return [_normalize_value(text.strip("'\""))]


def _close(a: str, b: str) -> bool:
    fa, fb = _float_or_none(a), _float_or_none(b)
    return fa is not None and fb is not None and abs(fa - fb) <= FLOAT_TOLERANCE


def _select_correct_lenient(answer, label: tuple[str, ...]) -> bool:
    ans, gold = clean_lenient(answer), clean_lenient(list(label))
    if len(ans) == 1 and len(gold) == 1:
        a, g = ans[0], gold[0]
        if _float_or_none(a) is not None and _float_or_none(g) is not None:
            return _close(a, g)
        return a == g
    numeric = all(_float_or_none(x) is not None for x in ans + gold)
    if numeric:
        if len(ans) != len(gold):
            return False
        unmatched = list(gold)
        for a in ans:
            hit = next((i for i, g in enumerate(unmatched) if _close(a, g)), None)
            if hit is None:
                return False
            unmatched.pop(hit)
        return True
    return set(ans) == set(gold)


# ----------------------------------------------------------------------------------------------


def is_correct(task: DBTask, answer: str | None, table_hash: str | None, rule: str = "v0.2") -> bool:
    """Whether an episode with this final answer and final table hash solves the task.

    `answer` is the raw text after `Final Answer:` (None when the agent gave none: scored as the
    empty string, as upstream does). `table_hash` is `EpisodeDB.table_hash()` after the episode
    (only read for INSERT/UPDATE items).
    """
    if rule not in RULES:
        raise ValueError(f"unknown DBBench scoring rule {rule!r}; choose one of {', '.join(RULES)}")
    if is_modification(task):
        return table_hash is not None and table_hash == task.answer_md5
    answer = "" if answer is None else str(answer)
    if rule == "v0.2":
        return _select_correct_v02(answer, task.label)
    return _select_correct_lenient(answer, task.label)


def summarize(records: Iterable[dict]) -> dict:
    """Accuracy per type and per category (SELECT, INSERT, UPDATE) of episode records.

    Each record needs `type` and `success` (bool). Keys: `<type>_accuracy`, `SELECT_accuracy`,
    `INSERT_accuracy`, `UPDATE_accuracy` (for what is present), `overall_cat_accuracy` (mean of the
    categories present), `accuracy` (over all records), `counts` {type or category: n}.
    """
    by_type: dict[str, list[bool]] = {}
    by_cat: dict[str, list[bool]] = {}
    for record in records:
        if "type" not in record or "success" not in record:
            raise ValueError(f"episode record lacks 'type' or 'success': {sorted(record)}")
        ok = bool(record["success"])
        by_type.setdefault(record["type"], []).append(ok)
        by_cat.setdefault(category(record["type"]), []).append(ok)
    out: dict = {}
    ordered_types = [t for t in SELECT_TYPES if t in by_type] + sorted(t for t in by_type if t not in SELECT_TYPES)
    for t in ordered_types:
        out[f"{t}_accuracy"] = sum(by_type[t]) / len(by_type[t])
    cats = [c for c in ("SELECT", "INSERT", "UPDATE") if c in by_cat]
    for c in cats:
        out[f"{c}_accuracy"] = sum(by_cat[c]) / len(by_cat[c])
    all_ok = [ok for oks in by_type.values() for ok in oks]
    out["overall_cat_accuracy"] = sum(out[f"{c}_accuracy"] for c in cats) / len(cats) if cats else 0.0
    out["accuracy"] = sum(all_ok) / len(all_ok) if all_ok else 0.0
    out["counts"] = {**{t: len(v) for t, v in by_type.items()}, **{c: len(by_cat[c]) for c in cats}}
    return out


def table_rows(summaries: dict[str, dict]) -> list[str]:
    """Row keys present in any summary: types, then categories, then overall."""
    keys = set()
    for s in summaries.values():
        keys.update(s)
    rows = [f"{t}_accuracy" for t in SELECT_TYPES if f"{t}_accuracy" in keys]
    rows += [f"{c}_accuracy" for c in CATEGORIES if f"{c}_accuracy" in keys]
    rows += [f"{t}_accuracy" for t in MODIFY_TYPES if f"{t}_accuracy" in keys and t not in CATEGORIES]
    return rows + ["overall_cat_accuracy"]


def format_table(summaries: dict[str, dict]) -> str:
    """Accuracy in % per type, category and overall (rows) for each summary (columns)."""
    keys = table_rows(summaries)
    rules = {"overall_cat_accuracy", f"{CATEGORIES[0]}_accuracy"} - {keys[0]}  # rules between blocks only
    return percent_table(summaries, [(key.removesuffix("_accuracy"), key) for key in keys], rule_before=rules)
