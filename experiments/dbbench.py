"""DBBench (AgentBench's database task) experiments.

`get_config(arg)`: `arg` is a comma-separated list of variants (e.g. `eval`); each variant is a
function in `VARIANTS` applied to `base_config()` in order. Add new variants there.

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
        --config.split=standard_heldout --config.backend.kind=mariadb --workdir /tmp/hsjax/eval_http
    # a JAX checkpoint (HF directory)
    python run.py --config experiments/dbbench.py:eval --config.policy.kind=jax \
        --config.policy.checkpoint=/path/to/hf_dir --workdir /tmp/hsjax/eval_jax

Demo (README's main job): a scripted agent that slips, on dev, under the base harness and each of
the six starter siblings (overall_cat 40.0 under base, 41.7-53.3 under the siblings; < 2 s):

    python run.py --config experiments/dbbench.py:demo --workdir /tmp/hsjax/demo

Training (`hsjax/modes/train.py`, docs/training.md). Arms: `policy_only`, `dapo`, `hint`, `harness_s`;
`smoke` shrinks any of them to 4 CPU steps of a tiny random policy; `smoke_harness_s` adds two
local voters and re-anchoring every 2 steps:

    python run.py --config experiments/dbbench.py:smoke --workdir /tmp/hsjax/smoke
    python run.py --config experiments/dbbench.py:smoke_harness_s --workdir /tmp/hsjax/smoke_hs
    python run.py --config experiments/dbbench.py:harness_s --config.model.hf_dir=/path/to/hf \
        --config.model.dtype=bfloat16 --config.total_steps=200 --workdir /tmp/hsjax/hs
    # rerunning a command in the same workdir resumes from its latest checkpoint

Results seen (oracle, base harness, 2-core CPU): SQLite, dev 60/60 (0.2 s of episodes, 0.5 s for the
whole command); `standard` SELECT 100/100, INSERT 100/100, UPDATE 99/100 (0.4 s). MariaDB, `standard`:
the same figures. The miss is standard-0225, whose stored hash matches no replay.
"""
from __future__ import annotations

import ml_collections

SLIP_NAMES = ("format_slip", "skip_schema", "premature_answer", "long_output", "answer_format", "turn_waste")


def base_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.mode = "eval"
    c.name = "dbbench"
    c.seed = 0
    c.split = "dev"  # dev | standard | standard_train | standard_heldout
    c.limit = 0  # 0 = all tasks of the split
    c.harnesses = ("base",)  # names from config.pool ("base" is always there)
    c.pool = "harness_envs/pools/dbbench_siblings.json"

    c.backend = ml_collections.ConfigDict()
    c.backend.kind = "sqlite"  # sqlite | mariadb
    c.backend.url = ""  # mariadb: connect here; empty = start a local socket-only server
    c.backend.time_budget_s = 2.0  # per statement

    c.policy = ml_collections.ConfigDict()
    c.policy.kind = "oracle"  # oracle | scripted | http | jax
    c.policy.base_url = ""  # http
    c.policy.model = ""  # http
    c.policy.api_key_env = ""  # http: name of the env var holding the key
    c.policy.timeout = 60.0  # http, seconds per request
    c.policy.checkpoint = ""  # jax: an HF directory, or a workdir / checkpoint directory
    c.policy.hf_dir = ""  # jax with a workdir checkpoint: HF directory of the base model and tokenizer
    c.policy.noise = ml_collections.ConfigDict({name: 0.0 for name in SLIP_NAMES})  # scripted

    c.sampling = ml_collections.ConfigDict()
    c.sampling.greedy = True
    c.sampling.temperature = 1.0
    c.sampling.top_p = 1.0
    c.sampling.top_k = 0
    c.sampling.max_new_tokens = 512

    c.eval = ml_collections.ConfigDict()
    c.eval.rule = "v0.2"  # v0.2 | lenient
    c.eval.batch_size = 64  # episodes per collect() call
    c.eval.env_workers = 4
    c.eval.max_context_tokens = 0  # 0 = no budget; else abort episodes past it (context_overflow)
    return c


def _eval(c: ml_collections.ConfigDict) -> None:
    c.mode = "eval"


def _demo(c: ml_collections.ConfigDict) -> None:
    """A scripted agent that slips in six ways, scored under the base harness and each sibling."""
    c.mode = "eval"
    c.name = "demo"
    c.policy.kind = "scripted"
    for slip in SLIP_NAMES:
        c.policy.noise[slip] = 0.15
    c.harnesses = ("base", "lenient_parse", "schema_reminder", "verify_answer", "paged_results",
                   "normalize_answer", "more_rounds")


# ------------------------------------------------------------------------------------------------
# Training (config.mode = 'train', hsjax/modes/train.py). `split`, `harnesses`, `policy`, `sampling` above
# belong to eval mode; training reads the blocks below.

HINT = ("Hint: look at the table first with a simple SELECT so that you use its exact column names "
        "and spellings, and write the final answer exactly in the required format.")


def _train(c: ml_collections.ConfigDict) -> None:
    c.mode = "train"
    c.benchmark = "dbbench"
    c.total_steps = 200

    c.model = ml_collections.ConfigDict()
    c.model.preset = "tiny"  # used when hf_dir is empty: random weights + the tiny tokenizer
    c.model.hf_dir = ""  # a local Hugging Face directory (config.json, safetensors, tokenizer)
    c.model.dtype = "float32"  # compute dtype: float32 | bfloat16
    c.model.param_dtype = "float32"  # master weights
    c.model.remat = False
    c.model.attention_impl = "xla"  # xla | cudnn (GPU)

    c.data = ml_collections.ConfigDict()
    c.data.train_split = "standard_train"
    c.data.limit = 0  # 0 = every task of the split

    c.rollout = ml_collections.ConfigDict()
    c.rollout.groups = 8  # G tasks per step
    c.rollout.n = 4  # base rollouts per task
    c.rollout.temperature = 1.0
    c.rollout.top_p = 1.0
    c.rollout.top_k = 0
    c.rollout.greedy = False
    c.rollout.max_new_tokens = 256
    c.rollout.max_context_tokens = 4096
    c.rollout.env_workers = 4

    c.rescue = ml_collections.ConfigDict()
    c.rescue.kind = "none"  # none | random | fixed | hint | harness_s
    c.rescue.k = 2  # siblings per all-fail group
    c.rescue.m = 2  # rollouts per sibling
    c.rescue.siblings = ("lenient_parse",)  # kind=fixed: names from the pool
    c.rescue.hint = HINT  # kind=hint: the hint line of the single hint-augmented base harness

    c.dapo = ml_collections.ConfigDict()
    c.dapo.enabled = False
    c.dapo.max_draws = 4  # at most this many draws of G tasks per step

    c.loss = ml_collections.ConfigDict()
    c.loss.advantage = "grpo"  # grpo | drgrpo | rloo
    c.loss.success_threshold = 1.0
    c.loss.eps_low = 0.2
    c.loss.eps_high = 0.28
    c.loss.aggregation = "token_mean"  # token_mean | sequence_mean
    c.loss.beta = 0.0
    c.loss.is_cap = 2.0
    c.loss.rescue_context = "as_generated"  # as_generated | base
    c.loss.rescue_baseline = "rescue"  # rescue | with_base (see docs/training.md)

    c.optim = ml_collections.ConfigDict()
    c.optim.learning_rate = 1e-6
    c.optim.warmup_steps = 10
    c.optim.weight_decay = 0.01
    c.optim.max_grad_norm = 1.0
    c.optim.schedule_steps = 0  # steps of the warm-up + cosine schedule; 0 = total_steps

    c.batch = ml_collections.ConfigDict()
    c.batch.T_buckets = (512, 1024, 2048, 4096, 8192)
    c.batch.micro_batches = 1
    c.batch.overlong = "drop"  # drop | error

    c.eval.every = 50
    c.eval.split = "standard_heldout"
    c.eval.limit = 0
    c.eval.greedy = True
    c.eval.temperature = 1.0
    c.eval.top_p = 1.0
    c.eval.top_k = 0
    c.eval.max_new_tokens = 256

    c.checkpoint = ml_collections.ConfigDict()
    c.checkpoint.every = 10
    c.checkpoint.keep = 3

    c.log = ml_collections.ConfigDict()
    c.log.tensorboard = True
    c.log.progress = True
    c.log.episodes_every = 10

    c.mesh = (("data", -1), ("fsdp", 1), ("tensor", 1))
    c.sharding_rules = ()  # (logical, mesh axes) pairs; empty = hsjax.infra.sharding.DEFAULT_RULES


def _policy_only(c):
    _ensure_train(c)
    c.rescue.kind = "none"


def _dapo(c):
    _ensure_train(c)
    c.rescue.kind = "none"
    c.dapo.enabled = True


def _hint(c):
    _ensure_train(c)
    c.rescue.kind = "hint"
    c.rescue.k = 1


def _harness_s(c):
    _ensure_train(c)
    c.rescue.kind = "harness_s"
    c.router = ml_collections.ConfigDict()
    c.router.aggregation = "borda"  # borda | majority | weighted
    c.router.profile_weight = 0.5
    c.router.explore = 0.2
    c.router.decay = 0.9
    c.router.reanchor_every = 10
    c.router.voters = ()  # dicts of hsjax.harness_s.router.voters.VoterSpec fields
    # Voter servers the run starts itself on 127.0.0.1: "rule" (reads the profile cards), "tiny"
    # (a served tiny random checkpoint), "policy" (serves model.hf_dir as it is on disk).
    c.router.local_voters = ()
    c.router.local_timeout_s = 30.0


def _smoke_harness_s(c):
    """Harness-S end to end on a CPU: rescue, re-anchoring every 2 steps, two local voters."""
    _smoke(c)
    _harness_s(c)
    c.router.reanchor_every = 2
    c.router.local_voters = ("rule", "tiny")


def _smoke(c):
    """A few steps of a tiny random policy on a handful of tasks: minutes on a CPU."""
    _ensure_train(c)
    c.total_steps = 4
    c.optim.warmup_steps = 1
    c.data.limit = 16
    c.rollout.groups = 2
    c.rollout.n = 2
    c.rollout.max_new_tokens = 24
    c.rollout.max_context_tokens = 2048
    c.rescue.kind = "random"  # exercises the rescue path; an arm named with smoke overrides it
    c.rescue.m = 1
    c.batch.T_buckets = (512, 1024, 2048)
    c.eval.every = 2
    c.eval.limit = 4
    c.eval.max_new_tokens = 24
    c.checkpoint.every = 2
    c.log.episodes_every = 2
    c.log.progress = False


def _ensure_train(c):
    if c.mode != "train":
        _train(c)


VARIANTS = {
    "eval": _eval,
    "demo": _demo,
    "train": _ensure_train,
    "policy_only": _policy_only,
    "dapo": _dapo,
    "hint": _hint,
    "harness_s": _harness_s,
    "smoke": _smoke,
    "smoke_harness_s": _smoke_harness_s,
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = base_config()
    variants = [a.strip() for a in (arg or "").split(",") if a.strip()]
    # `smoke` only shrinks sizes: applied first, so `smoke,dapo` and `dapo,smoke` are the same run.
    variants.sort(key=lambda v: v != "smoke")
    for variant in variants:
        if variant not in VARIANTS:
            raise ValueError(f"unknown experiments/dbbench.py variant {variant!r}; known: {sorted(VARIANTS)}")
        VARIANTS[variant](c)
    return c
