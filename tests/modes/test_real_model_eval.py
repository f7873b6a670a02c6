"""A DBBench eval with a real model as the policy (SmolLM2-135M-Instruct, scripts/fetch_smollm2.sh):
the documented run.py command on three dev tasks runs end to end and writes its results, whatever
the success (a 135M model mostly answers in prose)."""
import json
import os
import pathlib
import subprocess
import sys

from tests.smollm2 import smollm2_dir

REPO = pathlib.Path(__file__).resolve().parents[2]
MAX_NEW_TOKENS = 48


def test_run_py_eval_with_the_real_model(tmp_path):
    model_dir = smollm2_dir()
    cmd = [sys.executable, str(REPO / "run.py"), "--config", f"{REPO}/experiments/dbbench.py:eval",
           "--config.policy.kind=jax", f"--config.policy.checkpoint={model_dir}", "--config.limit=3",
           f"--config.sampling.max_new_tokens={MAX_NEW_TOKENS}", f"--workdir={tmp_path}"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "eval" / "dbbench.json").read_text())
    assert data["config"]["policy"]["kind"] == "jax" and len(data["episodes"]) == 3
    for e in data["episodes"]:
        assert e["harness"] == "base" and e["num_turns"] >= 1
        assert 0 < e["num_generated_tokens"] <= MAX_NEW_TOKENS * e["num_turns"]
        assert e["failure_mode"] and isinstance(e["success"], bool)
    assert "overall_cat" in proc.stdout
