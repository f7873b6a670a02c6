"""Typed config blocks: a kind's dataclass reads its fields, converted, and names the block's other
keys as unread with the one-line reason run.py prints."""
import dataclasses

import pytest
from ml_collections import ConfigDict

from hsjax.infra import config_blocks


@dataclasses.dataclass(frozen=True)
class Fast(config_blocks.BlockConfig):
    rate: float
    steps: int
    names: tuple


@dataclasses.dataclass(frozen=True)
class Slow(config_blocks.BlockConfig):
    url: str


KINDS = {"fast": Fast, "slow": Slow}


def block(kind="fast"):
    return ConfigDict({"kind": kind, "rate": 1, "steps": "3", "names": ["a", "b"], "url": ""})


def test_from_block_reads_the_fields_in_their_types():
    assert Fast.from_block(block(), "b") == Fast(rate=1.0, steps=3, names=("a", "b"))
    assert Fast.keys() == ("rate", "steps", "names")
    with pytest.raises(KeyError, match=r"b\.url: Slow reads it"):
        Slow.from_block({"kind": "slow"}, "b")


def test_the_keys_a_kind_never_reads_follow_from_its_type():
    assert config_blocks.unread(block("slow"), "x", KINDS) == {
        f"x.{k}": "x.kind='slow' never reads it" for k in ("rate", "steps", "names")}
    assert set(config_blocks.unread(block("fast"), "x", KINDS)) == {"x.url"}
    assert config_blocks.unread(block("other"), "x", KINDS) == {}  # its builder rejects the kind


def test_a_block_with_two_selectors_reads_what_either_choice_reads():
    b = ConfigDict({"kind": "fast", "runtime": "slow", "rate": 1, "steps": 1, "names": (), "url": "",
                    "spare": 0, "always": 1})

    @dataclasses.dataclass(frozen=True)
    class Always(config_blocks.BlockConfig):
        always: int

    tables = {"kind": KINDS, "runtime": KINDS}
    assert config_blocks.unread_of_selectors(b, "x", tables, always=Always) == {
        "x.spare": "x with kind='fast', runtime='slow' never reads it"}
    b.runtime = "unknown"
    assert config_blocks.unread_of_selectors(b, "x", tables, always=Always) == {}
