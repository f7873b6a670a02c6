"""experiments/evolve.py: every key of its evolution and Rank-1 variants is read by the mode, or named
by the mode's `unread(config)`."""
from hsjax.infra import experiments
from hsjax.modes import evolve, rank1
from tests.experiments.config_reads import covered, never_read


def test_evolve_and_rank1_read_their_configs(tmp_path):
    config = experiments.get_config("evolve", "dev,smoke")
    unread = never_read(config, lambda: evolve.main(config, str(tmp_path / "evolve")))
    assert covered(unread, evolve.unread(config)) == set()
    config = experiments.get_config("evolve", "rank1,smoke")
    unread = never_read(config, lambda: rank1.main(config, str(tmp_path / "rank1")))
    assert covered(unread, rank1.unread(config)) == set()
