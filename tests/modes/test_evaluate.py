"""Eval mode: `hsjax.modes.evaluate.main` writes eval/<name>.json with the documented keys and prints the table."""
import json
import os
import pathlib
import subprocess
import sys

import jax
import pytest

from harness_envs.dbbench.benchmark import DBBench
from harness_envs.dbbench.evaluator import format_table
from hsjax import builders
from hsjax.infra import experiments
from hsjax.models.hf import save_pretrained
from hsjax.models.model import init_params
from hsjax.models.presets import get_preset
from hsjax.models.tokenizer import build_tiny_tokenizer
from hsjax.modes import evaluate
from hsjax.policies.http_chat import HttpChatPolicy

REPO = pathlib.Path(__file__).resolve().parents[2]
dbbench_exp = experiments.load("dbbench")

EPISODE_KEYS = {"task_id", "type", "harness", "success", "reward", "failure_mode", "answer", "num_turns", "actions"}


def test_oracle_on_dev_writes_the_documented_json(tmp_path, capsys):
    config = dbbench_exp.get_config("eval")
    config.lock()
    out = evaluate.main(config, str(tmp_path))
    path = tmp_path / "eval" / "dbbench.json"
    assert out["path"] == str(path)
    data = json.loads(path.read_text())
    assert {"config", "summary", "episodes"} <= set(data)
    assert data["config"]["policy"]["kind"] == "oracle" and data["config"]["split"] == "dev"
    assert len(data["episodes"]) == 60
    for e in data["episodes"]:
        assert EPISODE_KEYS <= set(e)
        assert e["success"] is True and e["reward"] == 1.0 and e["failure_mode"] == "success" and e["harness"] == "base"
    s = data["summary"]["base"]
    assert s["overall_cat_accuracy"] == 1.0 and s["counts"]["SELECT"] == 20
    printed = capsys.readouterr().out
    assert "overall_cat" in printed and "100.0" in printed and "aggregation-SUM" in printed


def test_run_py_eval_command(tmp_path):
    # The documented command, from another working directory.
    cmd = [sys.executable, str(REPO / "run.py"), "--config", f"{REPO}/experiments/dbbench.py:eval",
           "--config.policy.kind=oracle", "--config.limit=5", f"--workdir={tmp_path}"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads((tmp_path / "eval" / "dbbench.json").read_text())
    assert [e["success"] for e in data["episodes"]] == [True] * 5
    assert "overall_cat" in proc.stdout


def test_scripted_agent_under_several_harnesses(tmp_path, capsys):
    config = dbbench_exp.get_config("eval")
    config.policy.kind = "scripted"
    config.policy.noise.format_slip = 1.0
    config.harnesses = ("base,lenient_parse",)  # as the command line delivers "--config.harnesses=a,b"
    config.limit = 10
    config.name = "noisy"
    config.runner.batch_size = 4
    config.lock()
    out = evaluate.main(config, str(tmp_path))
    data = json.loads((tmp_path / "eval" / "noisy.json").read_text())
    by_h = {}
    for e in data["episodes"]:
        by_h.setdefault(e["harness"], []).append(e["failure_mode"])
    assert by_h == {"base": ["malformed_action"] * 10, "lenient_parse": ["success"] * 10}
    assert out["summary"]["base"]["accuracy"] == 0.0 and out["summary"]["lenient_parse"]["accuracy"] == 1.0
    header = capsys.readouterr().out.splitlines()[1]
    assert header.split() == ["base", "lenient_parse"]


def test_config_errors_name_the_fix():
    assert builders.harness_names(("base", "a, b")) == ["base", "a", "b"]
    cfg = dbbench_exp.get_config("eval")
    bench = DBBench()
    with pytest.raises(ValueError, match="not in the pool"):
        builders.load_pool(cfg, bench).select(["base", "nope"])
    cfg.policy.kind = "http"
    with pytest.raises(ValueError, match="base_url"):
        builders.make_policy(cfg.policy, bench, 0)
    cfg.policy.kind = "jax"
    with pytest.raises(ValueError, match="checkpoint"):
        builders.make_policy(cfg.policy, bench, 0)
    cfg.policy.kind = "gpt"
    with pytest.raises(ValueError, match="not one of"):
        builders.make_policy(cfg.policy, bench, 0)
    with pytest.raises(ValueError, match="unknown experiments/dbbench.py variant"):
        dbbench_exp.get_config("evl")
    with pytest.raises(ValueError, match="mix eval and training"):
        dbbench_exp.get_config("eval,dapo")


def test_an_override_the_chosen_kind_never_reads_is_an_error(tmp_path):
    cmd = [sys.executable, str(REPO / "run.py"), "--config", f"{REPO}/experiments/dbbench.py:eval",
           "--config.policy.noise.format_slip=0.5", f"--workdir={tmp_path / 'w'}"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "--config.policy.noise.format_slip is set, but policy.kind='oracle' never reads it" in proc.stderr
    assert not (tmp_path / "w").exists()  # rejected before anything was written
    # A training arm has no eval sampling block at all: the locked config rejects the key.
    cmd = [sys.executable, str(REPO / "run.py"), "--config", f"{REPO}/experiments/dbbench.py:harness_s",
           "--config.sampling.temperature=0.7", f"--workdir={tmp_path / 'w'}"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "sampling" in proc.stderr and not (tmp_path / "w").exists()


def test_http_policy_is_wired():
    cfg = dbbench_exp.get_config("eval")
    cfg.policy.kind = "http"
    cfg.policy.base_url = "http://127.0.0.1:9/v1"
    cfg.policy.model = "m"
    p = builders.make_policy(cfg.policy, DBBench(), 0)
    assert isinstance(p, HttpChatPolicy) and p.model == "m"


def test_table_layout():
    summary = {"base": {"other_accuracy": 0.5, "INSERT_accuracy": 1.0, "SELECT_accuracy": 0.5,
                        "overall_cat_accuracy": 0.75}, "x": {"overall_cat_accuracy": 0.25}}
    lines = format_table(summary).splitlines()
    labels = [line.split()[0] for line in lines[1:] if not line.startswith("-")]
    assert labels == ["other", "SELECT", "INSERT", "overall_cat"]
    assert lines[-1].split() == ["overall_cat", "75.0", "25.0"]
    assert lines[1].split() == ["other", "50.0", "-"]


def test_jax_policy_from_an_hf_dir(tmp_path):
    # A tiny random model: its replies are noise, so episodes end malformed on the first reply, but the
    # token path (chat template, generation, stepping DBBench episodes) runs end to end.
    tok = build_tiny_tokenizer()
    cfg = get_preset("tiny", vocab_size=len(tok))
    save_pretrained(init_params(cfg, jax.random.PRNGKey(0)), cfg, tok, tmp_path / "hf")
    config = dbbench_exp.get_config("eval")
    config.policy.kind = "jax"
    config.policy.checkpoint = str(tmp_path / "hf")
    config.limit = 2
    config.sampling.max_new_tokens = 8
    config.lock()
    out = evaluate.main(config, str(tmp_path / "w"))
    data = json.loads((tmp_path / "w" / "eval" / "dbbench.json").read_text())
    assert len(data["episodes"]) == 2 and out["summary"]["base"]["accuracy"] == 0.0
    for e in data["episodes"]:
        assert e["num_turns"] >= 1 and 0 < e["num_generated_tokens"] <= 8 * e["num_turns"]
        assert e["failure_mode"] in ("malformed_action", "answered_without_querying", "wrong_answer")
