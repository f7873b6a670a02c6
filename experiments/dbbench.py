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


VARIANTS = {
    "eval": _eval,
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = base_config()
    for variant in [a.strip() for a in (arg or "").split(",") if a.strip()]:
        if variant not in VARIANTS:
            raise ValueError(f"unknown experiments/dbbench.py variant {variant!r}; known: {sorted(VARIANTS)}")
        VARIANTS[variant](c)
    return c
