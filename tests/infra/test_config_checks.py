"""The config range checks (`hsjax.infra.config_checks`) accept every config the repository ships
and documents, and each row of the table applies to a key some shipped config has."""
import fnmatch
import pathlib
import re

import pytest

from hsjax.infra import config_checks, experiments
from hsjax.infra.errors import UserError

REPO = pathlib.Path(__file__).resolve().parents[2]
# `experiments/<file>.py:<variants>` as the docs and the experiment files write their commands; not
# a path that merely ends in `experiments/` (`tests/experiments/test_dbbench_configs.py`).
COMMAND = re.compile(r"(?<![\w/])experiments/(\w+)\.py(?::([\w,]+))?")


def documented_configs() -> list[tuple[str, str | None]]:
    texts = [p.read_text() for p in [*REPO.glob("experiments/*.py"), *REPO.glob("docs/*.md"), REPO / "README.md"]]
    found = {(m.group(1), m.group(2)) for text in texts for m in COMMAND.finditer(text)}
    return sorted(((f, v) for f, v in found
                   if hasattr(experiments.load(f), "get_config")), key=str)  # common.py & co.: helpers


CONFIGS = documented_configs()


def test_every_documented_config_is_within_range():
    assert len(CONFIGS) > 30
    bad = {f"{f}.py:{v}": config_checks.violations(experiments.get_config(f, v))
           + config_checks.relation_violations(experiments.get_config(f, v)) for f, v in CONFIGS}
    assert {k: v for k, v in bad.items() if v} == {}


def test_every_row_of_the_table_applies_to_a_shipped_key():
    keys = {key for f, v in CONFIGS for key, _ in config_checks.leaves(experiments.get_config(f, v))}
    dead = [pattern for pattern, _, _ in config_checks.CHECKS if not fnmatch.filter(keys, pattern)]
    assert dead == []


@pytest.mark.parametrize("key,value", [("optim.learning_rate", float("nan")), ("optim.learning_rate", 0.0),
                                       ("optim.learning_rate", float("inf")), ("checkpoint.every", 0),
                                       ("rollout.n", 0), ("data.limit", -1), ("rollout.top_p", 0.0),
                                       ("eval.extra_splits", ("ok", "a/b"))])
def test_a_bad_value_is_a_user_error_naming_the_key(key, value):
    config = experiments.get_config("dbbench", "smoke")
    block, leaf = key.rsplit(".", 1)
    config[block][leaf] = value
    with pytest.raises(UserError, match=re.escape(f"--config.{key}={value!r} is out of range")):
        config_checks.check(config)


@pytest.mark.parametrize("name,ok", [("dbbench", True), ("run-3.b_x", True), ("", False), ("a/b", False),
                                     ("..", False), ("a..b", False), ("x\0y", False), ("a\\b", False)])
def test_names_that_are_not_paths(name, ok):
    assert config_checks.file_name_part(name) is ok


@pytest.mark.parametrize("total,warmup,schedule,ok", [(1, 0, 0, True), (1, 1, 0, False), (5, 10, 0, False),
                                                      (5, 10, 20, True), (0, 0, 0, False), (0, 0, 10, True)])
def test_the_warm_up_must_end_inside_the_schedule(total, warmup, schedule, ok):
    """optax's schedule needs warmup_steps < its length: caught before the model loads, one line."""
    config = experiments.get_config("dbbench", "smoke")
    config.total_steps, config.optim.warmup_steps, config.optim.schedule_steps = total, warmup, schedule
    if ok:
        config_checks.check(config)
    else:
        with pytest.raises(UserError, match=re.escape(f"--config.optim.warmup_steps={warmup} must be less than")):
            config_checks.check(config)
