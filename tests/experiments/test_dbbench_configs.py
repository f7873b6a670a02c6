"""experiments/dbbench.py: every key of its eval and train variants is read by the mode, or named by the
mode's `unread(config)`; and the unread check itself sees a dead key."""
import pytest

from hsjax.infra import experiments
from hsjax.modes import evaluate, train
from tests.experiments.config_reads import covered, never_read


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


@pytest.mark.parametrize("router", [{}, {"selection": "thompson", "validity": "replay"}])
def test_train_reads_its_config(tmp_path, router):
    """Also with the router's Thompson draws and replay validity, whose keys change what is read."""
    config = experiments.get_config("dbbench", "smoke,harness_s")
    config.router.update(router)
    config.total_steps = 2
    config.eval.every = 1
    config.eval.limit = 2
    config.data.limit = 4
    config.rollout.max_new_tokens = 8
    config.eval.max_new_tokens = 8
    config.eval.at_start = True
    unread = never_read(config, lambda: train.main(config, str(tmp_path)))
    assert covered(unread, train.unread(config)) == set()
