"""experiments/testbed.py: every key of the SFT warm start's config is read by it, or named by its
`unread(config)`."""
from hsjax.infra import experiments
from studies.testbed import warmstart
from tests.experiments.config_reads import covered, never_read


def test_the_sft_warm_start_reads_its_config(tmp_path):
    config = experiments.get_config("testbed", "sft,smoke")
    config.sft.steps = 2
    unread = never_read(config, lambda: warmstart.main(config, str(tmp_path)))
    assert unread == {"sft.copy_warmup_lr", "sft.copy_far_tokens", "sft.copy_style", "sft.copy_base_from",
                      "sft.copy_table_rows"}
    assert covered(unread, warmstart.unread(config)) == set()
