"""Every key of a mode's config is read by the mode, or named by the mode's `unread(config)` (a key
the chosen kind of its block never reads, whose override run.py rejects): configs carry no dead
keys. The mode runs in-process on a smoke config while every ConfigDict read is recorded."""
import contextlib

import pytest
from ml_collections import ConfigDict

from hsjax.infra import distributed, experiments
from hsjax.modes import evaluate, evolve, rank1, train
from studies.testbed import warmstart

_SERIALIZERS = ("to_dict", "to_json", "to_json_best_effort", "__repr__", "__str__", "__eq__")


@contextlib.contextmanager
def recorded_reads():
    """{(id of a ConfigDict, key)} read while the context is open; serializing a whole config
    (config.json, logs) is not a read."""
    reads, quiet = set(), [0]
    originals = {name: getattr(ConfigDict, name) for name in ("__getitem__", *_SERIALIZERS)}

    def getitem(self, key):
        value = originals["__getitem__"](self, key)
        if not quiet[0]:
            reads.add((id(self), key))
        return value

    def silenced(name):
        def method(self, *args, **kwargs):
            quiet[0] += 1
            try:
                return originals[name](self, *args, **kwargs)
            finally:
                quiet[0] -= 1
        return method

    ConfigDict.__getitem__ = getitem
    for name in _SERIALIZERS:
        setattr(ConfigDict, name, silenced(name))
    try:
        yield reads
    finally:
        for name, method in originals.items():
            setattr(ConfigDict, name, method)


def leaves(config, path=""):
    for key in config.keys():
        value = config._fields[key]
        if isinstance(value, ConfigDict):
            yield from leaves(value, f"{path}{key}.")
        else:
            yield id(config), key, f"{path}{key}"


def never_read(config, run) -> set[str]:
    """The keys `run()` never read; `mode` is read by run.py, which picks the mode with it. The
    `distributed` block is read as run.py reads it, before the mode starts (a mode never reads it)."""
    with recorded_reads() as reads:
        if "distributed" in config:
            distributed.initialize(config.distributed)
        run()
    return {dotted for parent, key, dotted in leaves(config) if (parent, key) not in reads} - {"mode"}


def covered(unread: set[str], allowed) -> set[str]:
    """The unread keys that `allowed` (a mode's unread dict) does not explain."""
    return {k for k in unread if not any(k == a or k.startswith(a + ".") for a in allowed)}


def test_the_unread_check_sees_a_dead_key(tmp_path):
    config = experiments.get_config("dbbench", "demo")
    config.runner.dead_key = 3
    unread = never_read(config, lambda: evaluate.main(config, str(tmp_path)))
    assert covered(unread, evaluate.unread(config)) == {"runner.dead_key"}


@pytest.mark.parametrize("variant", ["demo", "eval"])
def test_eval_reads_its_config(tmp_path, variant):
    config = experiments.get_config("dbbench", variant)
    config.limit = 3
    unread = never_read(config, lambda: evaluate.main(config, str(tmp_path)))
    assert covered(unread, evaluate.unread(config)) == set()


def test_evolve_and_rank1_read_their_configs(tmp_path):
    config = experiments.get_config("evolve", "dev,smoke")
    unread = never_read(config, lambda: evolve.main(config, str(tmp_path / "evolve")))
    assert covered(unread, evolve.unread(config)) == set()
    config = experiments.get_config("evolve", "rank1,smoke")
    unread = never_read(config, lambda: rank1.main(config, str(tmp_path / "rank1")))
    assert covered(unread, rank1.unread(config)) == set()


def test_train_reads_its_config(tmp_path):
    config = experiments.get_config("dbbench", "smoke,harness_s")
    config.total_steps = 2
    config.eval.every = 1
    config.eval.limit = 2
    config.data.limit = 4
    config.rollout.max_new_tokens = 8
    config.eval.max_new_tokens = 8
    config.eval.at_start = True
    unread = never_read(config, lambda: train.main(config, str(tmp_path)))
    assert covered(unread, train.unread(config)) == set()


def test_the_sft_warm_start_reads_its_config(tmp_path):
    config = experiments.get_config("testbed", "sft,smoke")
    config.sft.steps = 2
    unread = never_read(config, lambda: warmstart.main(config, str(tmp_path)))
    assert unread == {"sft.copy_warmup_lr", "sft.copy_far_tokens", "sft.copy_style", "sft.copy_base_from",
                      "sft.copy_table_rows"}
    assert covered(unread, warmstart.unread(config)) == set()
