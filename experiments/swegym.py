"""SWE-Gym experiments: the offline instances (scripts/setup_swegym.sh) by default, a real SWE-Gym JSONL by config.

`get_config(arg)`: `arg` is a comma-separated list of variants. Eval variants (`eval`, `demo`) build
the eval mode's blocks; training arms (`policy_only`, `dapo`, `hint`, `harness_s`, `smoke`,
`smoke_harness_s`) build the train mode's (experiments/common.py); `evolve` and `rank1` stand alone.
docs/swegym.md describes the backends, the protocol (OpenHands CodeAct as SWE-Gym ran it), the
harnesses and the taxonomy.

Eval (writes W/eval/<name>.json; prints the resolved rate per repository and overall, per harness):

    # the oracle on the offline test split (100% under every harness of the pool)
    python run.py --config experiments/swegym.py:eval --config.policy.kind=oracle --workdir /tmp/swg/eval
    # an OpenAI-compatible server on the offline test split (held-out repositories)
    python run.py --config experiments/swegym.py:eval --config.policy.kind=http \
        --config.policy.base_url=http://localhost:8000/v1 --config.policy.model=qwen2.5-7b-instruct \
        --workdir /tmp/swg/eval_http
    # real SWE-Gym: the published JSONL, the per-instance images through docker (or podman), a served model
    python run.py --config experiments/swegym.py:eval --config.benchmark.backend.kind=swegym \
        --config.benchmark.backend.instances=/data/swe-gym.jsonl --config.benchmark.backend.runtime=container \
        --config.benchmark.backend.container_cli=docker --config.split=train --config.policy.kind=http \
        --config.policy.base_url=http://localhost:8000/v1 --config.policy.model=M --config.runner.batch_size=8 \
        --workdir /tmp/swg/real

Demo: a scripted agent that slips in eight ways (12% each), on 8 instances of the offline test split,
under the base harness and the eight siblings that repair them (72 episodes, 1 min 28 s on a busy
2-core CPU: base resolved 25.0%, siblings 25.0-37.5%). perf/swegym_bench.py prints the locality
matrix, each slip at probability 1 (test split, 24 instances, 1,944 episodes, 27 min: each slip 0%
under the base harness and every other sibling, 100% under its own; the oracle 100% everywhere):

    python run.py --config experiments/swegym.py:demo --workdir /tmp/swg/demo

Evolution and Rank-1 (hsjax/modes/evolve.py, rank1.py, through the benchmark interface):

    python run.py --config experiments/swegym.py:evolve --workdir /tmp/swg/evolve
    python run.py --config experiments/swegym.py:rank1 --config.rank1.pool=/tmp/swg/evolve/pool.json \
        --workdir /tmp/swg/rank1

Training (hsjax/modes/train.py, docs/training.md). Arms: `policy_only`, `dapo`, `hint`, `harness_s`;
`smoke` shrinks any of them to 4 CPU steps of a tiny random policy on the concise base harness (the
CodeAct instruction is about 2,400 tiny-tokenizer tokens, the concise one about 400 plus the issue);
`smoke_harness_s` adds two local voters and re-anchoring every 2 steps:

    # 4 steps in 9 min 40 s on a busy 2-core CPU (load 6-7; appworld's smoke_harness_s took 2 min 59 s beside
    # it): every group rescued, router decisions and profiles written. The prompts are about twice
    # AppWorld's (the issue text), hence the 2048-token bucket and the slower update.
    python run.py --config experiments/swegym.py:smoke_harness_s --workdir /tmp/swg/smoke_hs
    python run.py --config experiments/swegym.py:harness_s --config.model.hf_dir=/path/to/hf \
        --config.model.dtype=bfloat16 --workdir /tmp/swg/hs
"""
from __future__ import annotations

import ml_collections

from hsjax.infra import experiments

common = experiments.load("common")
evolution = experiments.load("evolve")

SLIPS = ("call_format", "indentation", "syntax", "narrow_view", "blind_fix", "unchecked_fix", "long_explore",
         "context_hog")
POOL = "harness_envs/pools/swegym_siblings.json"
CONCISE_POOL = "harness_envs/pools/swegym_concise.json"
DEMO_HARNESSES = ("base", "lenient_parse", "str_replace_hint", "lint_on_edit", "wide_view", "reproduce_first",
                  "test_after_edit", "more_iterations", "compress_context")
# SWE-Gym's policies had 32k tokens of context; at about 3 characters a token of code and logs.
CONTEXT_CHARS = 100_000
EVOLVE_NOISE = {slip: 0.12 for slip in SLIPS}
# A second policy for nonstationarity: other slip rates, no format slips.
COMPARE_NOISE = {"call_format": 0.0, "indentation": 0.25, "syntax": 0.1, "narrow_view": 0.25, "blind_fix": 0.1,
                 "unchecked_fix": 0.25, "long_explore": 0.1, "context_hog": 0.1}
HINT = ("Hint: reproduce the issue with a script before editing, copy old_str from a view of the file "
        "(indentation included), and rerun your script after each edit.")


def benchmark(kind: str = "offline") -> ml_collections.ConfigDict:
    """`config.benchmark`: every key but `name` goes to the SWE-Gym benchmark's constructor (empty = default)."""
    return ml_collections.ConfigDict({
        "name": "swegym",
        "backend": {
            "kind": kind,  # offline (the built cache) | swegym (a SWE-bench/SWE-Gym JSONL)
            "instances": "",  # a JSONL; offline: empty = <cache_dir>/instances/offline.jsonl
            "cache_dir": "",  # empty = .cache/swegym (scripts/setup_swegym.sh)
            "split_file": "",  # swegym: JSON {split: [instance ids]}; empty = every instance is `train`
            "runtime": "local",  # local (sandboxed git work trees) | container (SWE-Gym's images)
            "repos_dir": "",  # local: empty = <cache_dir>/repos
            "venvs_dir": "",  # local: empty = <cache_dir>/venvs
            "isolation": "auto",  # local: auto | bwrap | unshare | none (harness_envs/sandbox.py)
            "cpu_s": 600,  # local: CPU seconds per command
            "memory_mb": 8192,  # local: address space per command
            "container_cli": "docker",  # container: docker | podman
            "test_timeout_s": 1800.0,  # the scorer's test run (SWE-bench: 30 minutes)
        },
    })


def policy(kind: str = "oracle", noise: dict | None = None) -> ml_collections.ConfigDict:
    p = common.policy(kind)
    p.noise = {slip: float((noise or {}).get(slip, 0.0)) for slip in SLIPS}  # scripted: SWE-Gym slip probabilities
    return p


# ------------------------------------------------------------------------------------------------
# Eval (config.mode = 'eval', hsjax/modes/evaluate.py)


def eval_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.mode = "eval"
    c.name = "swegym"
    c.seed = 0
    c.benchmark = benchmark()
    c.split = "test"  # offline: train | test (by repository); swegym: train, or the split file's names
    c.task_seed = 0  # fixed splits: 0
    c.limit = 0  # 0 = all instances of the split
    c.pool = POOL
    c.harnesses = ("base",)
    c.policy = policy("oracle")
    c.sampling = common.sampling(greedy=True, max_new_tokens=2048)
    c.num_samples = 0  # k > 0: k more episodes a task sampled at sampling.temperature; pass@k, mean@k
    c.runner = common.runner(batch_size=32, env_workers=4, max_context_chars=CONTEXT_CHARS)
    c.max_policy_error_share = common.MAX_POLICY_ERROR_SHARE  # experiments/common.py
    return c


def _demo(c: ml_collections.ConfigDict) -> None:
    """A scripted agent that slips in eight ways, under the base harness and the eight siblings."""
    c.name = "demo"
    c.policy.kind = "scripted"
    for slip in SLIPS:
        c.policy.noise[slip] = 0.12
    c.harnesses = DEMO_HARNESSES
    c.limit = 8


EVAL_VARIANTS = {"eval": lambda c: None, "demo": _demo}


# ------------------------------------------------------------------------------------------------
# Evolution and Rank-1 (config.mode = 'evolve' | 'rank1'; experiments/evolve.py's blocks)


def evolve_config() -> ml_collections.ConfigDict:
    c = evolution.evolve_config()
    c.benchmark = benchmark()
    c.pool = POOL
    c.split = "train"
    c.limit = 8
    c.policy = policy("scripted", EVOLVE_NOISE)
    c.runner = common.runner(batch_size=32, env_workers=4, max_context_chars=CONTEXT_CHARS)
    c.analysis.compare = policy("scripted", COMPARE_NOISE)  # kind="" to skip nonstationarity
    return c


def rank1_config() -> ml_collections.ConfigDict:
    c = evolution.rank1_config()
    c.benchmark = benchmark()
    c.policy = policy("scripted", EVOLVE_NOISE)
    c.runner = common.runner(batch_size=32, env_workers=4, max_context_chars=CONTEXT_CHARS)
    c.rank1.pool = POOL  # e.g. W/pool.json from evolve
    c.rank1.profile_split = "train"
    c.rank1.profile_limit = 8
    c.rank1.split = "test"
    c.rank1.limit = 8
    return c


# ------------------------------------------------------------------------------------------------
# Training (config.mode = 'train', hsjax/modes/train.py)


def train_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    common.train(c, benchmark_name="swegym", train_split="train", eval_split="test")
    c.benchmark = benchmark()
    c.pool = POOL
    c.rollout.max_context_tokens = 32768  # SWE-Gym's context
    c.rollout.max_new_tokens = 1024
    c.eval.max_new_tokens = 1024
    c.batch.T_buckets = (4096, 8192, 16384, 32768)
    return c


def _smoke(c):
    """A few steps of a tiny random policy on a handful of instances: minutes on a CPU."""
    c.pool = CONCISE_POOL
    # the concise opening is about 400 tiny-tokenizer tokens plus the issue (200-900 for the offline ones); a
    # format feedback about 200, so an untrained policy's episode ends on the context budget within a few replies
    common.smoke(c, max_context_tokens=2048, T_buckets=(1024, 2048))


TRAIN_VARIANTS = common.train_arms(HINT, _smoke)

OTHER_MODES = {"evolve": evolve_config, "rank1": rank1_config}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return common.select("experiments/swegym.py", arg, eval_variants=EVAL_VARIANTS, eval_config=eval_config,
                         train_variants=TRAIN_VARIANTS, train_config=train_config, other_modes=OTHER_MODES)
