"""Sampled evaluation (`num_samples` of eval mode, `eval.num_samples` of training): k drawn episodes
of every task beside the block's own one, pass@k and mean@k from them, draws that do not depend on
batching, a resumed evaluation that draws what an uninterrupted one did, and the configs that
cannot mean anything refused before a run starts."""
import json

import jax
import pytest

from hsjax.infra import config_checks, experiments
from hsjax.infra.episode_log import EpisodeLog, fingerprint
from hsjax.infra.errors import UserError
from hsjax.infra.pass_at_k import sampled_summary
from hsjax.models.hf import save_pretrained
from hsjax.models.model import init_params
from hsjax.models.presets import get_preset
from hsjax.models.tokenizer import build_tiny_tokenizer
from hsjax.modes import evaluate, train

dbbench_exp = experiments.load("dbbench")


def demo_config(num_samples):
    config = dbbench_exp.get_config("demo")  # a scripted agent whose slips are keyed on sample_index
    config.limit = 6
    config.harnesses = ("base", "lenient_parse")
    config.sampling.greedy = False
    config.num_samples = num_samples
    return config


def test_scripted_samples_give_pass_at_k_beside_the_unchanged_figure(tmp_path, capsys):
    plain = evaluate.main(demo_config(0), str(tmp_path / "plain"))
    out = evaluate.main(demo_config(4), str(tmp_path / "sampled"))
    printed = capsys.readouterr().out
    data = json.loads((tmp_path / "sampled" / "eval" / "demo.json").read_text())
    assert out["summary"] == plain["summary"] and plain["sampled"] == {}  # the block's own figure is kept
    own = [e for e in data["episodes"] if not e["sampled"]]
    drawn = [e for e in data["episodes"] if e["sampled"]]
    assert len(own) == 2 * 6 and len(drawn) == 2 * 6 * 4 and data["rollouts"] == 60
    assert {e["sample_index"] for e in own} == {0} and {e["sample_index"] for e in drawn} == {1, 2, 3, 4}
    for harness in ("base", "lenient_parse"):
        mine = sampled_summary([e for e in drawn if e["harness"] == harness], 4)
        assert data["sampled"][harness] == mine == out["sampled"][harness]
        assert mine["pass@1"] <= mine["pass@2"] <= mine["pass@4"] and mine["pass@1"] == mine["mean@4"]
    # the slips make some draws of a task succeed and others fail: pass@4 is above pass@1 here
    assert data["sampled"]["base"]["pass@4"] > data["sampled"]["base"]["pass@1"] > 0
    assert "4 samples of every task at temperature 1" in printed
    assert printed.split("in %:\n")[-1].splitlines()[0].split() == ["harness", "tasks", "pass@1", "pass@2", "pass@4",
                                                                     "mean@4"]


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    # A tiny random model: its replies are noise, which is what makes draws of one task tell apart.
    path = tmp_path_factory.mktemp("tiny") / "hf"
    tok = build_tiny_tokenizer()
    cfg = get_preset("tiny", vocab_size=len(tok))
    save_pretrained(init_params(cfg, jax.random.PRNGKey(0)), cfg, tok, path)
    return str(path)


def jax_config(hf, batch_size):
    config = dbbench_exp.get_config("eval")
    config.policy.kind = "jax"
    config.policy.checkpoint = hf
    config.limit = 2
    config.sampling.greedy = False
    config.sampling.max_new_tokens = 8
    config.num_samples = 3
    config.runner.batch_size = batch_size
    return config


def drawn_text(path):
    episodes = json.loads(path.read_text())["episodes"]
    return [(e["task_id"], e["sample_index"], e["sampled"], e["replies"]) for e in episodes]


def test_draws_depend_on_the_job_not_the_batch_and_a_resume_draws_the_same(tiny_hf, tmp_path):
    evaluate.main(jax_config(tiny_hf, 8), str(tmp_path / "a"))
    evaluate.main(jax_config(tiny_hf, 3), str(tmp_path / "b"))
    a = drawn_text(tmp_path / "a" / "eval" / "dbbench.json")
    assert a == drawn_text(tmp_path / "b" / "eval" / "dbbench.json")
    assert len(a) == 2 + 6
    for task in ("dev-0000", "dev-0001"):  # three draws of one task are not three copies
        replies = [str(r) for t, i, s, r in a if t == task and s]
        assert len(replies) == 3 and len(set(replies)) > 1

    # A run stopped after four episodes (the two of the block's own sampling and two draws) resumes.
    config = jax_config(tiny_hf, 3)
    finished = json.loads((tmp_path / "a" / "eval" / "dbbench.json").read_text())["episodes"][:4]
    log = EpisodeLog(tmp_path / "c" / "eval" / "dbbench.episodes.jsonl",
                     fingerprint(config.to_dict(), evaluate.RESUMABLE_CHANGES))
    log.start({})
    log.append(dict(enumerate(finished)))
    evaluate.main(config, str(tmp_path / "c"))
    assert drawn_text(tmp_path / "c" / "eval" / "dbbench.json") == a


def test_stretches_keep_one_sampling_and_consecutive_seeds_per_call():
    assert evaluate.stretches([0, 1, 2, 3, 4], 3) == [[0, 1, 2], [3, 4]]
    assert evaluate.stretches([1, 2, 5, 6, 7], 6) == [[1, 2], [5], [6, 7]]
    assert evaluate.stretches([], 2) == []


@pytest.mark.parametrize("mode,key,value,match", [
    ("eval", "num_samples", -1, r"--config.num_samples=-1 is out of range: allowed an integer >= 0"),
    ("train", "eval.num_samples", True, r"--config.eval.num_samples=True is out of range"),
])
def test_a_sample_count_that_is_not_a_count_is_refused(mode, key, value, match):
    config = dbbench_exp.get_config("eval" if mode == "eval" else "smoke")
    head, _, leaf = key.rpartition(".")
    (config[head] if head else config)[leaf] = value
    with pytest.raises(UserError, match=match):
        config_checks.check(config)


def test_samples_at_temperature_zero_are_refused():
    config = dbbench_exp.get_config("eval")
    config.num_samples, config.sampling.temperature = 4, 0.0
    with pytest.raises(UserError, match=r"--config.num_samples=4 draws 4 samples a task at sampling.temperature=0.0"):
        config_checks.check(config)
    config = dbbench_exp.get_config("smoke")
    config.eval.num_samples, config.eval.temperature = 2, 0.0
    with pytest.raises(UserError, match=r"--config.eval.num_samples=2 .* set eval.temperature > 0"):
        config_checks.check(config)
    config.eval.temperature = 0.7
    config_checks.check(config)


def test_training_reports_pass_at_k_of_its_evaluations(tmp_path):
    config = dbbench_exp.get_config("smoke")
    config.total_steps = 2
    config.eval.num_samples = 2
    train.main(config, str(tmp_path))
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    prefix = f"eval/{config.eval.split}/base"
    evaluated = [r for r in rows if f"{prefix}/success" in r]
    assert [r["step"] for r in evaluated] == [2]
    assert {f"{prefix}/pass@1", f"{prefix}/pass@2", f"{prefix}/mean@2"} <= set(evaluated[0])
    data = json.loads((tmp_path / "eval" / f"{config.eval.split}_step000002.json").read_text())
    drawn = [e for e in data["episodes"] if e.get("sampled")]
    assert len(drawn) == 2 * config.eval.limit and len(data["episodes"]) == 3 * config.eval.limit
    assert data["sampled"] == sampled_summary(drawn, 2)
    assert evaluated[0][f"{prefix}/pass@2"] == pytest.approx(data["sampled"]["pass@2"])
