"""Experiment files load by name, afresh each time, and an unknown name says which exist."""
import pytest

from hsjax.infra import experiments


def test_get_config_matches_the_files_get_config():
    assert experiments.get_config("testbed", "harness_s_k3").rescue.k == 3
    assert experiments.get_config("testbed", "harness_s").rescue.k == 2


def test_each_load_is_a_fresh_module():
    first = experiments.load("testbed")
    first.TRAIN_ARMS = {}
    assert experiments.load("testbed").TRAIN_ARMS


def test_unknown_experiment_names_the_known_ones():
    with pytest.raises(FileNotFoundError, match="known: .*'testbed'"):
        experiments.load("testbd")
