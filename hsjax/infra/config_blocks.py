"""Typed config blocks: one frozen dataclass per `kind` a config block can take.

A block such as `policy`, `rescue` or `benchmark.backend` holds the keys of every kind it can
take (the config is locked, so each must be there). The dataclass of the chosen kind is what that
kind reads: `from_block` builds it from the ConfigDict at the mode boundary, reading its fields
and nothing else, and `unread` names the block's other keys, which `run.py` refuses to see
overridden before anything runs. What a kind reads follows from its type, not from a table kept
beside the code.
"""
from __future__ import annotations

import dataclasses
import typing
from typing import Mapping, TypeVar

T = TypeVar("T", bound="BlockConfig")

# A field's declared type (the annotation's name, before any `[...]`) -> how a config value becomes it.
_CONVERT = {"int": int, "float": float, "str": str, "bool": bool, "tuple": tuple, "dict": dict}


@dataclasses.dataclass(frozen=True)
class BlockConfig:
    """The keys one kind of a block reads, as typed fields. Subclasses declare the fields."""

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_block(cls: type[T], block, path: str) -> T:
        """The fields of `cls` read from `block` (a ConfigDict or a dict at dotted `path`), each
        converted to its declared type."""
        values = {}
        for f in dataclasses.fields(cls):
            if f.name not in block:
                raise KeyError(f"{path}.{f.name}: {cls.__name__} reads it, and the block has no such key")
            convert = _converter(f.type)
            value = block[f.name]
            values[f.name] = convert(value) if convert and value is not None else value
        return cls(**values)


def _converter(annotation):
    """How a value becomes a field of this annotation (a type, or its name as a string); None: as it is."""
    if not isinstance(annotation, str):
        annotation = getattr(typing.get_origin(annotation) or annotation, "__name__", "")
    return _CONVERT.get(annotation.split("[")[0].strip())


def unread(block, path: str, kinds: Mapping[str, type[BlockConfig]],
           selector: str = "kind") -> dict[str, str]:
    """{dotted key: why} for the keys of `block` (at `path`) that the kind its `selector` chose
    never reads. A kind `kinds` does not know leaves the block unchecked (its builder rejects it)."""
    chosen = block[selector]
    if chosen not in kinds:
        return {}
    read = set(kinds[chosen].keys())
    return {f"{path}.{k}": f"{path}.{selector}={chosen!r} never reads it" for k in block
            if k != selector and k not in read}


def unread_of_selectors(block, path: str, tables: Mapping[str, Mapping[str, type[BlockConfig]]],
                        always: type[BlockConfig] | None = None) -> dict[str, str]:
    """`unread` for a block with several selectors: a key is unread if no selector's choice (nor
    `always`, the keys read whatever the choices) reads it. A choice a table does not know leaves
    the block unchecked."""
    read = set(always.keys() if always else ()) | set(tables)
    for selector, kinds in tables.items():
        if block[selector] not in kinds:
            return {}
        read |= set(kinds[block[selector]].keys())
    why = ", ".join(f"{s}={block[s]!r}" for s in tables)
    return {f"{path}.{k}": f"{path} with {why} never reads it" for k in block if k not in read}
