"""The copy probe of testbed v2's SFT runs: token classes and the per-class loss table."""
import numpy as np

from harness_envs.synth import names
from hsjax import builders
from hsjax.infra import experiments
from hsjax.models.tokenizer import tiny_tokenizer
from studies.testbed import copy_probe, warmstart
from studies.testbed import sft_data


def test_name_syllables_are_the_tasks_coined_names():
    task = names.make_tasks("distinct_train", 1, seed=0)[0]
    syllables = copy_probe.name_syllables(task)
    assert {task.table.name[:2], task.table.columns[0][:2]} <= syllables
    assert syllables <= set(names.SYLLABLES)
    assert copy_probe.token_class(task.table.name[:2], syllables) == "name"
    assert copy_probe.token_class("SELECT", syllables) == "word"
    assert copy_probe.token_class(" 42", syllables) == "number"
    assert copy_probe.token_class("'", syllables) == "other"


def test_probe_scores_every_policy_token_of_the_expert_streams():
    config = experiments.get_config("testbed", "sft,names")
    with config.unlocked():
        config.data.train_split = "distinct_train"
    tokenizer = tiny_tokenizer(config.model.tokenizer)
    cfg, params = warmstart.random_model(config, tokenizer)  # not the copy base: uniform is the reference
    bench = builders.make_benchmark(config)
    tasks = builders.load_split(bench, "distinct_train", seed=5, limit=6)
    result = copy_probe.probe(config, params, cfg, tokenizer, tasks, length=768)
    # Every policy token is classed once: the counts add up to the streams' loss-mask total.
    pool = builders.load_pool(config, bench)
    segments, _ = sft_data.expert_streams(sft_data.sft_jobs(tasks, config), pool, tokenizer, config, bench)
    assert sum(r["n"] for r in result.values()) == sum(int(np.sum(s.loss_mask)) for s in segments)
    assert result["name"]["n"] > 0 and result["word"]["n"] > 0
    np.testing.assert_allclose(sum(r["share"] for r in result.values()), 1.0, rtol=1e-6)
    # A random policy spreads its mass over the vocabulary: about log(V) nats on every class.
    assert abs(result["name"]["mean_nats"] - np.log(cfg.vocab_size)) < 1.5
    assert "name" in copy_probe.format_table(result, "t")
