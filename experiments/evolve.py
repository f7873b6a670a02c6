"""Directional harness evolution, the three pool properties, and Rank-1 inference on DBBench.

`get_config(arg)`: `arg` is a comma-separated list of variants. With `rank1` among them the config
is Rank-1's (`RANK1_VARIANTS`), else evolution's (`EVOLVE_VARIANTS`; no variant is `dev`).

Evolution (writes W/pool.json, W/analysis/*.json, W/plots/*.png; prints the direction table):

    # a scripted agent with six kinds of slips on dev; the pool's properties, and their change
    # against a second agent with another slip mix (nonstationarity)
    python run.py --config experiments/evolve.py:dev --workdir /tmp/hsjax/evolve_dev
    # the same on the 300 `standard` tasks
    python run.py --config experiments/evolve.py:standard --workdir /tmp/hsjax/evolve_std
    # with candidates proposed by an LLM over an OpenAI-compatible API (validated, counted)
    python run.py --config experiments/evolve.py:dev,llm --config.evolve.llm.base_url=http://127.0.0.1:8000/v1 \
        --config.evolve.llm.model=qwen2.5-7b-instruct --workdir /tmp/hsjax/evolve_llm
    # the policy itself over HTTP (any OpenAI-compatible server, e.g. hsjax/llm/server.py)
    python run.py --config experiments/evolve.py:standard,http --config.policy.base_url=http://127.0.0.1:8000/v1 \
        --config.policy.model=qwen2.5-7b-instruct --workdir /tmp/hsjax/evolve_http

Rank-1 (mode `rank1`, hsjax/modes/rank1.py, writes W/eval/rank1.json):

    # profiles from standard_train, then dev: base vs the router's single harness, 1 rollout each
    python run.py --config experiments/evolve.py:rank1 --config.rank1.pool=/tmp/hsjax/evolve_dev/pool.json \
        --workdir /tmp/hsjax/rank1

Results seen (2-core CPU, SQLite, seed 0, scripted agent with `DEV_NOISE`, second agent `COMPARE_NOISE`):
`dev`: base 24/60; 6 siblings kept (answer_normalization, answer_verification, parse_leniency,
schema_grounding, observation_paging, turn_budget), locality diagonal-dominant, union coverage 0.611
(22/36 base failures) vs best single 0.222 (answer_verification); 888 rollouts, about 6 s.
`standard`: base 133/300; the same 6 siblings, diagonal-dominant, union 0.760 (127/167) vs best single
0.198 (turn_budget); 2456 rollouts, about 15 s.
`rank1` (dev-evolved pool, profiles from 240 standard_train tasks, 60 dev tasks): probe=none, 1 rollout
each: base 0.400, rank1 0.433; probe=base, 2 rollouts each: 0.783 both (this agent's slips are drawn
afresh per rollout, so the probe's failure mode says nothing about the next rollout).
"""
from __future__ import annotations

import ml_collections

from hsjax.infra import experiments

common = experiments.load("common")

DEV_NOISE = {"format_slip": 0.15, "skip_schema": 0.15, "premature_answer": 0.15, "long_output": 0.2,
             "answer_format": 0.15, "turn_waste": 0.15}
# A second policy for nonstationarity: format slips mostly come with schema slips, so repairing the
# format alone rescues less; no premature answers, more wasted turns.
COMPARE_NOISE = {"format_slip": 0.3, "skip_schema": 0.6, "premature_answer": 0.0, "long_output": 0.2,
                 "answer_format": 0.15, "turn_waste": 0.3}


def _shared(mode: str) -> ml_collections.ConfigDict:
    """What evolve and rank1 both read: benchmark, the policy that plays, sampling and the runner."""
    c = ml_collections.ConfigDict()
    c.mode = mode
    c.seed = 0
    c.benchmark = common.benchmark("dbbench")
    c.policy = common.policy("scripted", DEV_NOISE)
    c.sampling = common.sampling(greedy=True, max_new_tokens=512)
    c.runner = common.runner(batch_size=256)
    return c


def evolve_config() -> ml_collections.ConfigDict:
    c = _shared("evolve")
    c.pool = common.DEFAULT_POOL  # its base harness is the one evolved from
    c.split = "dev"  # tasks whose base failures are repaired: dev | standard | standard_train | standard_heldout
    c.limit = 0  # 0 = all tasks of the split

    c.evolve = ml_collections.ConfigDict()
    c.evolve.seed = 0
    c.evolve.base_samples = 1  # base rollouts per task whose failures are repaired
    c.evolve.tries = 1  # re-runs of each failure per candidate
    c.evolve.max_failures = 0  # failures used per direction (0 = all)
    c.evolve.min_failures = 1
    c.evolve.max_candidates = 12  # enumerated candidates per direction
    c.evolve.max_knobs = 2
    c.evolve.regression_sample = 20  # base successes re-run under each candidate that rescues
    c.evolve.regression_tolerance = 0.05
    c.evolve.directions = ()  # direction names to evolve; empty = every mode with failures
    c.evolve.llm = ml_collections.ConfigDict()
    c.evolve.llm.enabled = False
    c.evolve.llm.base_url = ""
    c.evolve.llm.model = ""
    c.evolve.llm.api_key_env = ""
    c.evolve.llm.n_proposals = 4
    c.evolve.llm.timeout = 60.0
    c.evolve.llm.max_retries = 2

    c.analysis = ml_collections.ConfigDict()
    c.analysis.enabled = True
    c.analysis.tries = 1
    c.analysis.compare = common.policy("scripted", COMPARE_NOISE)  # kind="" to skip nonstationarity
    return c


def rank1_config() -> ml_collections.ConfigDict:
    c = _shared("rank1")
    c.name = "rank1"  # the output: W/eval/<name>.json
    c.rank1 = ml_collections.ConfigDict()
    c.rank1.pool = common.DEFAULT_POOL  # e.g. W/pool.json from evolve
    c.rank1.profiles = ""  # a profiles.json of success rates to use instead of profiling
    c.rank1.profile_split = "standard_train"
    c.rank1.profile_limit = 0
    c.rank1.split = "dev"  # test tasks
    c.rank1.limit = 0
    c.rank1.rollouts = 1  # executor rollouts per task, for both base and rank1
    c.rank1.probe = "none"  # none: task type only; base: the first rollout is a base probe whose
    #                         failure mode is a feature for the remaining rollouts (rollouts >= 2)
    return c


def _standard(c):
    c.split = "standard"


def _llm(c):
    c.evolve.llm.enabled = True


def _http(c):
    c.policy.kind = "http"
    c.analysis.compare.kind = ""


def _smoke(c):
    if c.mode == "evolve":
        c.limit = 30
        c.evolve.max_candidates = 6
        c.evolve.regression_sample = 10
    else:
        c.rank1.profile_limit = 60
        c.rank1.limit = 30


EVOLVE_VARIANTS = {"dev": lambda c: None, "standard": _standard, "llm": _llm, "http": _http, "smoke": _smoke}
RANK1_VARIANTS = {"rank1": lambda c: None, "http": lambda c: setattr(c.policy, "kind", "http"), "smoke": _smoke}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    names = common.variants(arg)
    rank1 = "rank1" in names
    c, table = (rank1_config(), RANK1_VARIANTS) if rank1 else (evolve_config(), EVOLVE_VARIANTS)
    for name in names:
        if name not in table:
            raise ValueError(f"unknown experiments/evolve.py variant {name!r} for mode {c.mode}; "
                             f"known: {sorted(table)}")
        table[name](c)
    return c
