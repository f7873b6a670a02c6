"""DBBench (AgentBench's database task) experiments.

`get_config(arg)`: `arg` is a comma-separated list of variants. Eval variants (`eval`, `demo`) build
the eval mode's blocks; training arms (`policy_only`, `dapo`, `hint`, `harness_s`, `smoke`,
`smoke_harness_s`) build the train mode's (experiments/common.py). Each holds only what its mode
reads: `--config.sampling.temperature=0.7` on a training arm is an error, not a silent no-op.

Eval (writes W/eval/<name>.json and prints accuracy per type, category and overall, per harness):

    # oracle on dev, base harness (checks the environment; 100% on SQLite)
    python run.py --config experiments/dbbench.py:eval --config.policy.kind=oracle --workdir /tmp/hsjax/eval
    # a scripted agent that slips, under the base harness and the starter siblings
    python run.py --config experiments/dbbench.py:eval --config.policy.kind=scripted \
        --config.policy.noise.format_slip=0.5 --config.policy.noise.premature_answer=0.3 \
        --config.harnesses=base,lenient_parse,verify_answer --workdir /tmp/hsjax/eval_noisy
    # an OpenAI-compatible server, on the held-out split, on MariaDB
    python run.py --config experiments/dbbench.py:eval --config.policy.kind=http \
        --config.policy.base_url=http://localhost:8000/v1 --config.policy.model=qwen2.5-7b-instruct \
        --config.split=standard_heldout --config.benchmark.backend.kind=mariadb --workdir /tmp/hsjax/eval_http
    # a JAX checkpoint: an HF directory, or a training workdir (its latest checkpoint)
    python run.py --config experiments/dbbench.py:eval --config.policy.kind=jax \
        --config.policy.checkpoint=/path/to/hf_dir_or_train_workdir --workdir /tmp/hsjax/eval_jax

Demo: a scripted agent that slips, on dev, under the base harness and each of the six starter
siblings (overall_cat 40.0 under base, 41.7-53.3 under the siblings; < 2 s):

    python run.py --config experiments/dbbench.py:demo --workdir /tmp/hsjax/demo

Training (`hsjax/modes/train.py`, docs/training.md). Arms: `policy_only`, `dapo`, `hint`,
`harness_s`; `smoke` shrinks any of them to 4 CPU steps of a tiny random policy; `smoke_harness_s`
adds two local voters and re-anchoring every 2 steps:

    python run.py --config experiments/dbbench.py:smoke --workdir /tmp/hsjax/smoke
    python run.py --config experiments/dbbench.py:smoke_harness_s --workdir /tmp/hsjax/smoke_hs
    python run.py --config experiments/dbbench.py:harness_s --config.model.hf_dir=/path/to/hf \
        --config.model.dtype=bfloat16 --config.total_steps=200 --workdir /tmp/hsjax/hs
    # rerunning a command in the same workdir resumes from its latest checkpoint
    # a real chat model (after scripts/fetch_smollm2.sh): two CPU steps with rescue
    python run.py --config experiments/dbbench.py:real_smoke --workdir /tmp/hsjax/real_smoke
    # the same on a GPU: more steps and groups, bfloat16, cuDNN attention
    python run.py --config experiments/dbbench.py:real_smoke,harness_s --config.total_steps=50 \
        --config.rollout.groups=8 --config.rollout.n=8 --config.model.dtype=bfloat16 \
        --config.model.attention_impl=cudnn --workdir /tmp/hsjax/real_gpu

Results seen (oracle, base harness, 2-core CPU): SQLite, dev 60/60 (0.2 s of episodes, 0.5 s for the
whole command); `standard` SELECT 100/100, INSERT 100/100, UPDATE 99/100 (0.4 s). MariaDB, `standard`:
the same figures. The miss is standard-0225, whose stored hash matches no replay.
"""
from __future__ import annotations

import ml_collections

from hsjax.infra import experiments

common = experiments.load("common")

HINT = ("Hint: look at the table first with a simple SELECT so that you use its exact column names "
        "and spellings, and write the final answer exactly in the required format.")


# ------------------------------------------------------------------------------------------------
# Eval (config.mode = 'eval', hsjax/modes/evaluate.py)


def eval_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.mode = "eval"
    c.name = "dbbench"
    c.seed = 0
    c.benchmark = common.benchmark("dbbench")
    c.split = "dev"  # dev | standard | standard_train | standard_heldout
    c.task_seed = 0  # fixed splits: 0
    c.limit = 0  # 0 = all tasks of the split
    c.pool = common.DEFAULT_POOL
    c.harnesses = ("base",)  # names from the pool
    c.policy = common.policy("oracle")
    c.sampling = common.sampling(greedy=True, max_new_tokens=512)
    c.num_samples = 0  # k > 0: k more episodes a task sampled at sampling.temperature; pass@k, mean@k
    c.runner = common.runner(batch_size=64)
    c.max_policy_error_share = common.MAX_POLICY_ERROR_SHARE  # experiments/common.py
    return c


def _demo(c: ml_collections.ConfigDict) -> None:
    """A scripted agent that slips in six ways, scored under the base harness and each sibling."""
    c.name = "demo"
    c.policy.kind = "scripted"
    for slip in common.DBBENCH_SLIPS:
        c.policy.noise[slip] = 0.15
    c.harnesses = ("base", "lenient_parse", "schema_reminder", "verify_answer", "paged_results",
                   "normalize_answer", "more_rounds")


EVAL_VARIANTS = {"eval": lambda c: None, "demo": _demo}


# ------------------------------------------------------------------------------------------------
# Training (config.mode = 'train', hsjax/modes/train.py)


def train_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    common.train(c, benchmark_name="dbbench", train_split="standard_train", eval_split="standard_heldout")
    return c


def _smoke(c):
    """A few steps of a tiny random policy on a handful of tasks: minutes on a CPU."""
    common.smoke(c, max_context_tokens=2048, T_buckets=(512, 1024, 2048))


# scripts/fetch_smollm2.sh writes it (docs/models.md, "A real model").
REAL_MODEL_DIR = ".cache/models/smollm2-135m-instruct"


def _real_smoke(c):
    """Two CPU steps of a real chat model (SmolLM2-135M-Instruct) with rescue: one group of two
    base rollouts and one random sibling's rollout when the group fails, rows of at most 768 tokens
    (the opening prompt is under 512 of SmolLM2's tokens), a checkpoint each step
    (tests/modes/test_real_model_train.py, docs/real_model.md)."""
    common.smoke(c, max_context_tokens=768, T_buckets=(768,))
    c.model.hf_dir = REAL_MODEL_DIR
    c.model.remat = True  # the update's activations of 30 layers x 768 positions, recomputed
    c.total_steps = 2
    c.data.limit = 2
    c.rollout.groups = 1
    c.rollout.n = 2
    c.rollout.max_new_tokens = 32
    c.rescue.k = 1
    c.eval.every = 0
    c.checkpoint.every = 1
    c.log.episodes_every = 0


TRAIN_VARIANTS = {**common.train_arms(HINT, _smoke), "real_smoke": _real_smoke}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return common.select("experiments/dbbench.py", arg, eval_variants=EVAL_VARIANTS, eval_config=eval_config,
                         train_variants=TRAIN_VARIANTS, train_config=train_config)
