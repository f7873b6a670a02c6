"""A real training workdir wherever a checkpoint goes (eval, serve, Rank-1, probe), the export mode,
and the exported directory read by plain `transformers` (AutoTokenizer, AutoModelForCausalLM,
apply_chat_template, generate stopping at eos)."""
import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import torch
import transformers

from hsjax import builders
from hsjax.infra import checkpoint as ckpt_lib
from hsjax.infra import experiments
from hsjax.infra.errors import UserError
from hsjax.models import forward, get_preset, init_params, save_pretrained
from hsjax.models.tokenizer import IM_END, build_tiny_tokenizer, tiny_tokenizer
from hsjax.modes import export as export_mode
from hsjax.modes import serve as serve_mode
from hsjax.policies.base import SamplingParams
from hsjax.policies.jax_policy import JaxPolicy
from hsjax.policies.recording import RecordingChatPolicy
from hsjax.policies.tokens import render_prompt
from hsjax.rollout.runner import EpisodeRunner, Job
from tests.modes.test_train import env, train_command

REPO = pathlib.Path(__file__).resolve().parents[2]
WARM_START = REPO / "assets" / "testbed_warmstart"
UMASK = os.umask(0o022)
os.umask(UMASK)
MESSAGES = [{"role": "system", "content": "You are a SQL agent."},
            {"role": "user", "content": "How many orders did customer 1042 place in 2023?"}]


def run_py(*args, timeout=600):
    proc = subprocess.run([sys.executable, str(REPO / "run.py"), *map(str, args)], cwd=REPO, env=env(),
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A real 1-step training run of the tiny preset (its final checkpoint is step 1), with the
    opt-in AutoTokenizer-exact tokenizer (so a resolver that assumed the default tokenizer would
    give other ids)."""
    w = tmp_path_factory.mktemp("train") / "run"
    command = train_command(w, 1, "--config.model.tokenizer=tiny_qwen2", "--config.optim.warmup_steps=0")
    proc = subprocess.run(command, env=env(), cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads((w / "config.json").read_text())["mode"] == "train"
    return w


def assert_trees_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


# ------------------------------------------------------------------------ a workdir as a checkpoint


def test_a_workdir_loads_as_the_model_its_run_trained(workdir, tmp_path):
    saved = ckpt_lib.load_params(workdir / "checkpoints")
    cfg, params, tokenizer, source = builders.load_model(str(workdir))
    assert source is None and cfg.family == "qwen2" and cfg.vocab_size == len(tokenizer)
    assert_trees_equal(params, saved)
    assert tokenizer.get_vocab() == tiny_tokenizer("tiny_qwen2").get_vocab() != build_tiny_tokenizer().get_vocab()
    _, by_dir, _, _ = builders.load_model(str(workdir / "checkpoints"), step=1)
    assert_trees_equal(by_dir, saved)
    # The run's experiment config.json is not an HF config.
    assert not builders.is_hf_dir(workdir) and builders.run_config(workdir)["mode"] == "train"

    # A base model that does not fit the params is named, with the fix.
    other = tmp_path / "other"
    small = get_preset("tiny", hidden_size=64)
    save_pretrained(init_params(small, jax.random.PRNGKey(0)), small, build_tiny_tokenizer(), other)
    with pytest.raises(UserError, match="has shape .* implies"):
        builders.load_model(str(workdir), base_hf_dir=str(other))
    # Checkpoints without a run config need the base model.
    bare = tmp_path / "bare"
    with ckpt_lib.Checkpointer(bare) as ckpt:
        ckpt.save(1, {"params": saved})
    with pytest.raises(UserError, match="no run config.json"):
        builders.load_model(str(bare))


def test_eval_of_a_training_workdir_as_documented(workdir, tmp_path):
    """experiments/dbbench.py's eval command with policy.checkpoint=<workdir> (it failed with
    "config.json model_type=None": the run's config.json was read as an HF config)."""
    run_py("--config", REPO / "experiments/dbbench.py:eval", "--config.policy.kind=jax",
           f"--config.policy.checkpoint={workdir}", "--config.limit=1", "--config.sampling.max_new_tokens=8",
           f"--workdir={tmp_path / 'eval'}")
    (path,) = (tmp_path / "eval" / "eval").glob("*.json")
    result = json.loads(path.read_text())
    assert result["config"]["policy"]["checkpoint"] == str(workdir) and len(result["episodes"]) == 1


def test_serve_rank1_and_probe_take_a_workdir(workdir):
    saved = ckpt_lib.load_params(workdir / "checkpoints")
    # serve: serve.checkpoint=<workdir> alone (the docs' command)
    policy, name = serve_mode.load_policy(ml_collections.ConfigDict({"hf_dir": "", "checkpoint": str(workdir)}))
    assert name == workdir.name
    assert_trees_equal(policy.params, saved)
    assert policy.tokenizer.get_vocab() == tiny_tokenizer("tiny_qwen2").get_vocab()
    # eval and Rank-1: policy.kind=jax through make_policy
    block = experiments.load("common").policy("jax")
    block.checkpoint = str(workdir)
    jax_policy = builders.make_policy(block, bench=None, seed=0)
    assert_trees_equal(jax_policy.params, saved)
    # probe (and a training run's warm start): model.hf_dir=<workdir>
    config = ml_collections.ConfigDict({"seed": 0, "model": {"hf_dir": str(workdir)}})
    cfg, params, tokenizer = builders.make_model(config)
    assert_trees_equal(params, saved)
    greedy = SamplingParams(greedy=True, max_new_tokens=6)
    assert (JaxPolicy(cfg, params, tokenizer).chat([MESSAGES], greedy)
            == policy.chat([MESSAGES], greedy) == jax_policy.chat([MESSAGES], greedy))


# ------------------------------------------------------------------------------------ export


def test_export_round_trip_with_plain_transformers(workdir, tmp_path):
    out_workdir = tmp_path / "export"
    run_py("--config", REPO / "experiments/export.py", f"--config.export.checkpoint={workdir}",
           f"--workdir={out_workdir}")
    out = out_workdir / "hf"
    report = json.loads((out_workdir / "export.json").read_text())
    assert report["step"] == 1 and report["auto_tokenizer"]["same_ids"], report
    assert report["auto_tokenizer"]["class"] == "Qwen2Tokenizer"

    # Files: readable by others, eos/bos/pad set where HF generate and vLLM read them.
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in out.iterdir()} == {
        p.name: oct(0o666 & ~UMASK) for p in out.iterdir()}
    ours = tiny_tokenizer("tiny_qwen2")
    vocab = ours.get_vocab()
    eos = [vocab["<|endoftext|>"], vocab[IM_END]]
    special = {"bos_token_id": None, "eos_token_id": eos, "pad_token_id": vocab["<|endoftext|>"]}
    hf_config = json.loads((out / "config.json").read_text())
    assert json.loads((out / "generation_config.json").read_text()) == special
    assert {k: hf_config[k] for k in special} == special

    # Plain transformers: AutoTokenizer gives the project's ids, the logits match, and greedy
    # generate gives the JAX sampler's ids.
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    assert model.generation_config.eos_token_id == eos
    inputs = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    prompt = inputs["input_ids"][0].tolist()
    assert prompt == render_prompt(ours, MESSAGES)
    cfg, params, _, _ = builders.load_model(str(workdir))
    with torch.no_grad():
        ref = model(**inputs).logits[0].numpy()
    got, _ = forward(cfg, params, jnp.asarray([prompt]), jnp.arange(len(prompt))[None])
    assert np.abs(np.asarray(got[0]) - ref).max() < 1e-4
    generated = model.generate(**inputs, max_new_tokens=12, do_sample=False)[0, len(prompt):].tolist()
    sampled = JaxPolicy(cfg, params, ours).generate([prompt], SamplingParams(greedy=True, max_new_tokens=12))[0]
    assert generated == [int(i) for i in sampled.ids]


def test_transformers_generate_stops_at_eos_on_the_exported_warm_start(tmp_path):
    """The shipped SFT warm start (`tiny` tokenizer) exported: AutoTokenizer gives the project's ids
    (an auto_map keeps transformers 5 off Qwen2Tokenizer), and HF generate stops at <|im_end|> (with
    eos null in generation_config.json it ran on to max_new_tokens) with the JAX sampler's ids."""
    config = experiments.load("export").get_config()
    config.export.checkpoint = str(WARM_START)
    report = export_mode.main(config, str(tmp_path / "export"))
    out = tmp_path / "export" / "hf"
    assert report["auto_tokenizer"]["same_ids"] and report["auto_tokenizer"]["class"] != "Qwen2Tokenizer"
    assert (out / "tokenization_hsjax.py").exists()

    config = experiments.load("testbed").get_config("sft")
    bench = builders.make_benchmark(config)
    pool = builders.load_pool(config, bench)
    try:
        task = builders.load_split(bench, "synth_train", seed=0, limit=1)[0]
        expert = RecordingChatPolicy(bench.make_agent("expert", default_style="protocol"))
        (traj,) = EpisodeRunner(bench.make_episode, expert, SamplingParams(), env_workers=1).run(
            [Job(pool["base"], task)])
    finally:
        bench.close()
    messages = expert.turns[traj.episode_id][0][0]  # the opening the warm start was trained on

    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    policy = JaxPolicy.from_pretrained(str(WARM_START))
    inputs = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    prompt = inputs["input_ids"][0].tolist()
    assert prompt == render_prompt(policy.tokenizer, messages)
    limit = 96
    generated = model.generate(**inputs, max_new_tokens=limit, do_sample=False)[0, len(prompt):].tolist()
    im_end = policy.tokenizer.convert_tokens_to_ids(IM_END)
    assert len(generated) < limit and generated[-1] == im_end and im_end not in generated[:-1]
    sampled = policy.generate([prompt], SamplingParams(greedy=True, max_new_tokens=limit))[0]
    assert generated == [int(i) for i in sampled.ids] and sampled.finish_reason == "stop"
    assert tok.decode(generated, skip_special_tokens=True) == sampled.text


def test_the_shipped_warm_start_loads_unchanged_in_transformers():
    """assets/testbed_warmstart itself: eos ids where generate reads them, and AutoTokenizer with the
    project's ids on numbers too (where a Qwen2Tokenizer would split digits)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(str(WARM_START), dtype=torch.float32)
    ours = build_tiny_tokenizer()
    vocab = ours.get_vocab()
    assert model.generation_config.eos_token_id == [vocab["<|endoftext|>"], vocab[IM_END]]
    assert model.generation_config.pad_token_id == vocab["<|endoftext|>"]
    for trust in (None, True):
        auto = transformers.AutoTokenizer.from_pretrained(str(WARM_START), trust_remote_code=trust)
        assert type(auto).__name__ != "Qwen2Tokenizer"
        assert (auto.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False)
                == render_prompt(ours, MESSAGES))
    assert json.loads((WARM_START / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"


def test_export_refuses_what_it_cannot_do(workdir, tmp_path):
    config = experiments.load("export").get_config()
    with pytest.raises(UserError, match="export.checkpoint"):
        export_mode.main(config, str(tmp_path / "a"))
    config.export.checkpoint = str(workdir)
    config.export.dtype = "float16"
    with pytest.raises(UserError, match="export.dtype"):
        export_mode.main(config, str(tmp_path / "b"))
    config.export.dtype = "bfloat16"
    config.export.step = 7
    with pytest.raises(UserError, match="step 7|saved steps"):
        export_mode.main(config, str(tmp_path / "c"))
    config.export.step = 0
    (tmp_path / "d" / "hf").mkdir(parents=True)
    (tmp_path / "d" / "hf" / "keep.txt").write_text("x")
    with pytest.raises(UserError, match="not empty"):
        export_mode.main(config, str(tmp_path / "d"))
    # bfloat16: the weights read back are the checkpoint's, rounded to bfloat16
    result = export_mode.main(config, str(tmp_path / "e"))
    assert result["dtype"] == "bfloat16" and json.loads(
        (tmp_path / "e" / "hf" / "config.json").read_text())["torch_dtype"] == "bfloat16"
