"""Rank-1 on the names regime (experiments/testbed.py:names_rank1) with the shipped v3 warm start.
In a file of its own so that xdist (--dist loadfile) can run it beside tests/experiments/test_testbed_configs.py."""
import json

from hsjax.infra import experiments
from hsjax.modes import rank1
from studies.testbed import names_report
from tests.experiments.config_reads import covered, never_read


def test_names_rank1_reads_its_config_and_plays_the_warm_start(tmp_path):
    """The names regime's Rank-1 (experiments/testbed.py:names_rank1) with the shipped v3 warm start:
    every key read, and the policy really plays (it solves visible-name tasks, 98% at T = 1)."""
    config = experiments.get_config("testbed", "names_rank1,smoke")
    unread = never_read(config, lambda: rank1.main(config, str(tmp_path / "rank1")))
    assert covered(unread, rank1.unread(config)) == set()
    slices = names_report.rank1_slices(json.loads((tmp_path / "rank1" / "eval" / "names_rank1.json").read_text()))
    assert (slices["hidden"]["tasks"], slices["visible"]["tasks"]) == (2, 6)
    assert slices["visible"]["base"]["solved"] > 0
