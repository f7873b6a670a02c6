"""GRPO with rescue on a real chat model (SmolLM2-135M-Instruct, scripts/fetch_smollm2.sh) through
run.py: `experiments/dbbench.py:real_smoke`, two CPU steps. The run trains (finite loss, rescue
rollouts, the sampler-vs-trainer gap reported), resumes exactly from its step-1 checkpoint, and
its export loads and generates in plain transformers."""
import json
import math
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import torch
import transformers

from hsjax.infra.metrics import read_metrics
from tests.modes.test_train import comparable, final_params
from tests.smollm2 import smollm2_dir

REPO = pathlib.Path(__file__).resolve().parents[2]


def run_py(*args, cwd):
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, str(REPO / "run.py"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def train(workdir, model_dir):
    return run_py("--config", f"{REPO}/experiments/dbbench.py:real_smoke", f"--config.model.hf_dir={model_dir}",
                  f"--workdir={workdir}", cwd=workdir.parent)


def test_a_real_model_trains_with_rescue_resumes_exactly_and_exports(tmp_path):
    model_dir = smollm2_dir()
    straight = tmp_path / "straight"
    train(straight, model_dir)
    rows = read_metrics(straight)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert math.isfinite(r["loss/total"]) and r["train/nonfinite"] == 0
        assert r["rollouts/base"] == 2 and r["batch/T"] == 768 and r["batch/overlong_frac"] == 0
        # float32 sampler and trainer of the same weights: the gap is rounding
        assert 0 <= r["logprob_gap/abs_mean"] < 1e-3 and math.isfinite(r["logprob_gap/abs_max"])
    # A 135M model fails DBBench's tasks: each failed group is re-rolled under a sibling.
    assert rows[-1]["rollouts/rescue_total"] >= 1

    # Resumed from the step-1 checkpoint (step 2's removed): the same step 2, metrics and params.
    resumed = tmp_path / "resumed"
    shutil.copytree(straight, resumed)
    shutil.rmtree(resumed / "checkpoints" / "2")
    train(resumed, model_dir)
    assert comparable(read_metrics(resumed)) == comparable(rows)
    a, b = final_params(straight), final_params(resumed)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)

    # The export is a plain HF checkpoint: transformers loads it and generates, and its weights
    # are the trained ones (the trained step moved them off the starting model's, or not, alike).
    out = tmp_path / "export"
    run_py("--config", f"{REPO}/experiments/export.py", f"--config.export.checkpoint={straight}",
           f"--config.export.out_dir={out}", f"--workdir={tmp_path / 'export_run'}", cwd=tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "List the tables."}],
                                           add_generation_prompt=True, return_tensors="pt", return_dict=True)
    generated = model.generate(**prompt, max_new_tokens=8, do_sample=False)
    assert generated.shape[1] > prompt["input_ids"].shape[1]
    embed = model.get_input_embeddings().weight.detach().numpy()
    trained = [v for k, v in a.items() if "embed" in k]
    assert len(trained) == 1 and np.allclose(embed, trained[0], atol=0)
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 30
