"""AppWorld experiments: the offline world shipped with the project by default, real AppWorld by config.

`get_config(arg)`: `arg` is a comma-separated list of variants. Eval variants (`eval`, `demo`) build
the eval mode's blocks; training arms (`policy_only`, `dapo`, `hint`, `harness_s`, `smoke`,
`smoke_harness_s`) build the train mode's (experiments/common.py). docs/appworld.md describes the
two backends, the protocol, the harnesses and the taxonomy.

Eval (writes W/eval/<name>.json; prints TGC per task type, TGC and SGC per harness):

    # the oracle on the offline dev split (100% TGC and SGC under every harness of the pool)
    python run.py --config experiments/appworld.py:eval --config.policy.kind=oracle --workdir /tmp/aw/eval
    # an OpenAI-compatible server on the offline test split (held-out scenarios and app)
    python run.py --config experiments/appworld.py:eval --config.policy.kind=http \
        --config.policy.base_url=http://localhost:8000/v1 --config.policy.model=qwen2.5-7b-instruct \
        --config.split=test --workdir /tmp/aw/eval_http
    # real AppWorld (scripts/setup_appworld.sh, then data under ROOT/data) with a served model
    python run.py --config experiments/appworld.py:eval --config.benchmark.backend.kind=appworld \
        --config.benchmark.backend.root=/path/to/ROOT --config.split=test_normal --config.policy.kind=http \
        --config.policy.base_url=http://localhost:8000/v1 --config.policy.model=M --config.runner.batch_size=8 \
        --workdir /tmp/aw/real

Demo: a scripted agent that slips in seven ways, on the offline dev split, under the base harness
and the seven siblings that repair them (dev, 288 episodes, about 10 s: base TGC 44.4 / SGC 0.0,
siblings TGC 44.4-55.6; the oracle scores 100; docs/appworld.md has the locality matrix):

    python run.py --config experiments/appworld.py:demo --workdir /tmp/aw/demo

Evolution and Rank-1 (hsjax/modes/evolve.py, rank1.py; the same code as DBBench's, through the
benchmark interface): a slipping agent's base failures on dev repaired along the directions, the
pool's three properties, then Rank-1 with profiles fitted on train (dev: base 13/36, 5 siblings kept,
diagonal-dominant, union coverage 0.522 vs best single 0.174, about 26 s; Rank-1 TGC 36.1 -> 44.4,
about 23 s):

    python run.py --config experiments/appworld.py:evolve --workdir /tmp/aw/evolve
    python run.py --config experiments/appworld.py:rank1 --config.rank1.pool=/tmp/aw/evolve/pool.json \
        --workdir /tmp/aw/rank1

Training (hsjax/modes/train.py, docs/training.md). Arms: `policy_only`, `dapo`, `hint`,
`harness_s`; `smoke` shrinks any of them to 4 CPU steps of a tiny random policy on the concise base
harness (the published instruction and demonstration, about 2,000 tiny-tokenizer tokens, do not fit
the smoke context of 1,024);
`smoke_harness_s` adds two local voters and re-anchoring every 2 steps:

    # 4 steps in 2 min 23 s on a busy 2-core CPU: every group rescued, router decisions and profiles written
    python run.py --config experiments/appworld.py:smoke_harness_s --workdir /tmp/aw/smoke_hs
    python run.py --config experiments/appworld.py:harness_s --config.model.hf_dir=/path/to/hf \
        --config.model.dtype=bfloat16 --workdir /tmp/aw/hs
"""
from __future__ import annotations

import ml_collections

from hsjax.infra import experiments

common = experiments.load("common")
evolution = experiments.load("evolve")

SLIPS = ("code_fence", "wrong_password", "guess_api", "bad_args", "hasty_answer", "scratch_note", "step_waste")
POOL = "harness_envs/pools/appworld_siblings.json"
CONCISE_POOL = "harness_envs/pools/appworld_concise.json"
DEMO_HARNESSES = ("base", "lenient_parse", "credentials_reminder", "api_list", "api_doc", "verify_answer",
                  "review_changes", "more_steps")
EVOLVE_NOISE = {"code_fence": 0.15, "wrong_password": 0.15, "guess_api": 0.15, "bad_args": 0.15, "hasty_answer": 0.2,
                "scratch_note": 0.15, "step_waste": 0.15}
# A second policy for nonstationarity: other slip rates, no credential slips.
COMPARE_NOISE = {"code_fence": 0.3, "wrong_password": 0.0, "guess_api": 0.3, "bad_args": 0.15, "hasty_answer": 0.2,
                 "scratch_note": 0.3, "step_waste": 0.15}
HINT = ("Hint: look up an API's parameters with apis.api_docs.show_api_doc before calling it, log in to each app "
        "with that app's own password, and read every page of results before answering.")


def benchmark(kind: str = "offline") -> ml_collections.ConfigDict:
    """`config.benchmark`: every key but `name` goes to the AppWorld benchmark's constructor."""
    return ml_collections.ConfigDict({
        "name": "appworld",
        "backend": {
            "kind": kind,  # offline (the shipped world) | appworld (real, through its own venv)
            "isolation": "auto",  # sandbox walls: auto | bwrap | unshare | none (harness_envs/sandbox.py)
            "wall_s": 10.0,  # per code cell
            "cpu_s": 60,  # per episode (the sandbox process's life)
            "memory_mb": 1024,
            "python": "",  # appworld: the AppWorld venv's python; empty = .venv-appworld/bin/python
            "root": "",  # appworld: the directory holding AppWorld's data/; empty = $APPWORLD_ROOT or the repo
        },
    })


def policy(kind: str = "oracle", noise: dict | None = None) -> ml_collections.ConfigDict:
    p = common.policy(kind)
    p.noise = {slip: float((noise or {}).get(slip, 0.0)) for slip in SLIPS}  # scripted: AppWorld slip probabilities
    return p


# ------------------------------------------------------------------------------------------------
# Eval (config.mode = 'eval', hsjax/modes/evaluate.py)


def eval_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.mode = "eval"
    c.name = "appworld"
    c.seed = 0
    c.benchmark = benchmark()
    c.split = "dev"  # offline: train | dev | test; real: train | dev | test_normal | test_challenge
    c.task_seed = 0  # fixed splits: 0
    c.limit = 0  # 0 = all tasks of the split
    c.pool = POOL
    c.harnesses = ("base",)
    c.policy = policy("oracle")
    c.sampling = common.sampling(greedy=True, max_new_tokens=1024)
    c.num_samples = 0  # k > 0: k more episodes a task sampled at sampling.temperature; pass@k, mean@k
    c.runner = common.runner(batch_size=64, env_workers=4)
    c.max_policy_error_share = common.MAX_POLICY_ERROR_SHARE  # experiments/common.py
    return c


def _demo(c: ml_collections.ConfigDict) -> None:
    """A scripted agent that slips in seven ways, under the base harness and the seven siblings."""
    c.name = "demo"
    c.policy.kind = "scripted"
    for slip in SLIPS:
        c.policy.noise[slip] = 0.12
    c.harnesses = DEMO_HARNESSES


EVAL_VARIANTS = {"eval": lambda c: None, "demo": _demo}


# ------------------------------------------------------------------------------------------------
# Evolution and Rank-1 (config.mode = 'evolve' | 'rank1'; experiments/evolve.py's blocks)


def evolve_config() -> ml_collections.ConfigDict:
    c = evolution.evolve_config()
    c.benchmark = benchmark()
    c.pool = POOL
    c.split = "dev"  # train | dev | test
    c.policy = policy("scripted", EVOLVE_NOISE)
    c.analysis.compare = policy("scripted", COMPARE_NOISE)  # kind="" to skip nonstationarity
    return c


def rank1_config() -> ml_collections.ConfigDict:
    c = evolution.rank1_config()
    c.benchmark = benchmark()
    c.policy = policy("scripted", EVOLVE_NOISE)
    c.rank1.pool = POOL  # e.g. W/pool.json from evolve
    c.rank1.profile_split = "train"
    c.rank1.split = "dev"
    return c


# ------------------------------------------------------------------------------------------------
# Training (config.mode = 'train', hsjax/modes/train.py)


def train_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    common.train(c, benchmark_name="appworld", train_split="train", eval_split="dev")
    c.benchmark = benchmark()
    c.pool = POOL
    c.rollout.max_context_tokens = 8192
    c.rollout.max_new_tokens = 512
    c.eval.max_new_tokens = 512
    return c


def _smoke(c):
    """A few steps of a tiny random policy on a handful of tasks: minutes on a CPU."""
    c.pool = CONCISE_POOL
    # the concise opening is about 510 tiny-tokenizer tokens
    common.smoke(c, max_context_tokens=1024, T_buckets=(512, 1024))


TRAIN_VARIANTS = common.train_arms(HINT, _smoke)

OTHER_MODES = {"evolve": evolve_config, "rank1": rank1_config}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return common.select("experiments/appworld.py", arg, eval_variants=EVAL_VARIANTS, eval_config=eval_config,
                         train_variants=TRAIN_VARIANTS, train_config=train_config, other_modes=OTHER_MODES)
