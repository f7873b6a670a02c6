"""Config blocks shared by the experiment files (as big_vision's `configs/common.py`).

Each experiment's variant builds only the blocks its mode reads, from these helpers, so a
command-line override of a key the mode never reads is an error (the config is locked), and
`run.py` also rejects overriding a key that the chosen `kind` of a block never reads (what a kind
reads is its typed config: `hsjax.config_kinds`, `hsjax.harness_s.rescue_kinds`). Load this file
with `hsjax.infra.experiments.load("common")`.
"""
from __future__ import annotations

from typing import Callable, Mapping

from ml_collections import ConfigDict

from hsjax.rollout.runner import ENV_RETRIES

DBBENCH_SLIPS = ("format_slip", "skip_schema", "premature_answer", "long_output", "answer_format", "turn_waste")
DEFAULT_POOL = "harness_envs/pools/dbbench_siblings.json"
# Eval's `max_policy_error_share`: an eval in which a larger share of episodes ended in policy_error
# (the policy gave no reply: its endpoint is down, refuses or times out) writes its results and then
# exits non-zero, since its score measures the endpoint rather than the model. 1.0: never.
MAX_POLICY_ERROR_SHARE = 0.5


def variants(arg: str | None) -> list[str]:
    """The comma-separated variant names of `--config file.py:a,b`."""
    return [a.strip() for a in (arg or "").split(",") if a.strip()]


def benchmark(name: str = "dbbench", backend: str = "sqlite", rule: str = "v0.2") -> ConfigDict:
    """`config.benchmark`: the benchmark's name and options (DBBench and synth: backend, rule)."""
    return ConfigDict({
        "name": name,
        # sqlite | mariadb; url: connect there (mariadb), empty = start a local socket-only server;
        # max_db_mb: an episode whose database grows past it ends (failure mode db_size_limit)
        "backend": {"kind": backend, "url": "", "time_budget_s": 2.0, "max_db_mb": 64.0},
        "rule": rule,  # v0.2 (published) | lenient
    })


def sampling(*, greedy: bool = True, temperature: float = 1.0, max_new_tokens: int = 512) -> ConfigDict:
    """How replies are sampled (`hsjax.builders.sampling_params`)."""
    return ConfigDict({"greedy": greedy, "temperature": temperature, "top_p": 1.0, "top_k": 0,
                       "max_new_tokens": max_new_tokens})


def add_sampling(block: ConfigDict, *, greedy: bool, temperature: float = 1.0, max_new_tokens: int) -> None:
    """The sampling fields, inside a block that holds more (train's `rollout` and `eval`)."""
    for key, value in sampling(greedy=greedy, temperature=temperature, max_new_tokens=max_new_tokens).items():
        block[key] = value


def add_rollout_backend(block: ConfigDict, backend: str = "jax") -> None:
    """Train's `rollout.backend` (jax | vllm | http_tokens), the JAX sampler's KV reuse, the vLLM engine's
    options and the rollout servers' (http_tokens), read by
    `hsjax.builders.make_rollout_policy` (docs/rollout.md, "vLLM rollout backend"): weight sync
    (memory | disk) and `vllm.LLM` arguments, where 0 / False leave vLLM's default."""
    block.backend = backend
    # jax: each turn of an episode prefills only its new tokens on the caches of the last one
    # (hsjax.policies.kv_reuse); False prefills the whole conversation every turn.
    block.kv_reuse = True
    # jax: the sampler's KV cache dtype; '' = the compute dtype, 'bfloat16' halves what a decode step
    # reads (logprobs within 0.15 nats of float32 on the warm start; the gap is logged).
    block.kv_dtype = ""
    block.vllm = ConfigDict({"weight_sync": "memory", "max_model_len": 0, "gpu_memory_utilization": 0.0,
                             "tensor_parallel_size": 0, "enforce_eager": False})
    # http_tokens: rollouts from vLLM-compatible /v1/completions servers (hsjax serve with serve.weights_root,
    # SGLang), the run's weights pushed to them as HF directories under weights_dir ('' = <workdir>/rollout_weights,
    # a path the servers must see) after each update (hsjax/policies/http_rollout.py, docs/training.md).
    block.http = ConfigDict({"base_urls": ("",), "model": "", "api_key_env": "", "timeout": 120.0,
                             "max_retries": 3, "backoff": 1.0, "max_backoff": 30.0, "max_concurrency": 16,
                             "max_consecutive_failures": 16, "weights_dir": "", "push_timeout_s": 600.0})


def policy(kind: str = "oracle", noise: dict | None = None) -> ConfigDict:
    """The policy that plays (`hsjax.builders.make_policy`): a scripted agent of the benchmark
    (oracle, scripted), an OpenAI-compatible server (http: chat text; http_tokens: token ids and
    logprobs from a vLLM-compatible /v1/completions, prompts rendered with hf_dir's tokenizer;
    the http keys apply to both) or a JAX checkpoint (jax)."""
    return ConfigDict({
        "kind": kind,
        "base_url": "", "model": "",  # http
        "api_key_env": "",  # http: name of the environment variable holding the key
        "timeout": 60.0,  # http: seconds per attempt, wall clock
        # http: retries of a 429/5xx/timeout/connection error, waiting backoff * 2**(n-1) s or the server's
        # Retry-After, never more than max_backoff. Worst case of one request:
        # (max_retries + 1) * timeout + max_retries * max_backoff = 330 s with these defaults.
        "max_retries": 3, "backoff": 1.0, "max_backoff": 30.0,
        # http: a reply body past max_reply_bytes fails as too_large; a reply text is cut to max_reply_chars
        # (0: 16 characters per token of sampling.max_new_tokens, for servers that ignore max_tokens)
        "max_reply_bytes": 4 << 20, "max_reply_chars": 0,
        # http: this many failed requests in a row, none succeeding, and the run stops (EndpointDown); 0: never
        "max_consecutive_failures": 16,
        "checkpoint": "",  # jax: an HF directory, or a training workdir (its latest checkpoint)
        # jax with a workdir checkpoint: HF directory of its model config and tokenizer; empty = the ones
        # the run's own config.json names. http_tokens: the served model's HF directory (or training
        # workdir), whose tokenizer renders the prompts
        "hf_dir": "",
        "noise": {n: float((noise or {}).get(n, 0.0)) for n in DBBENCH_SLIPS},  # scripted: slip probabilities
    })


def runner(batch_size: int = 64, env_workers: int = 4, max_context_tokens: int = 0,
           max_context_chars: int = 200_000, max_record_chars: int = 20_000,
           env_retries: int = ENV_RETRIES) -> ConfigDict:
    """The episode runner: episodes per collect call, environment threads, token budget (0: none) and,
    for chat policies (http, scripted), a budget in characters of context per episode (0: none; an
    episode past it ends as context_overflow). 200k characters is ~50k tokens: 64 episodes hold a few
    hundred MB at most. Episode records (eval JSON) cut every string past `max_record_chars` to its
    head and a `…[truncated N chars]` marker (0: keep everything). An episode whose environment
    failed is run again up to `env_retries` times with its own seed (hsjax/rollout/runner.py)."""
    return ConfigDict({"batch_size": batch_size, "env_workers": env_workers, "max_context_tokens": max_context_tokens,
                       "max_context_chars": max_context_chars, "max_record_chars": max_record_chars,
                       "env_retries": env_retries})


def model(preset: str = "tiny", hf_dir: str = "") -> ConfigDict:
    """The trained model: an HF directory or a training workdir (its latest checkpoint), or (hf_dir
    empty) a preset with random weights and a tiny tokenizer."""
    return ConfigDict({"preset": preset, "hf_dir": hf_dir,
                       # hf_dir empty: tiny (the shipped warm starts' ids) | tiny_qwen2 (AutoTokenizer gives
                       # the same ids; for new runs; hsjax/models/tokenizer.py)
                       "tokenizer": "tiny",
                       "dtype": "float32",  # compute dtype: float32 | bfloat16
                       "param_dtype": "float32",  # master weights
                       "remat": False,
                       "attention_impl": "xla",  # xla | cudnn (GPU)
                       # GiB of device memory the update's blocks are planned for; 0: what the device
                       # reports (the host's memory on CPU). hsjax/models/memory_plan.py.
                       "memory_budget": 0.0})


def router() -> ConfigDict:
    """The Harness-S router (`rescue.kind = harness_s`)."""
    return ConfigDict({
        "aggregation": "borda",  # borda | majority | weighted
        "profile_weight": 0.5,
        # ucb: posterior mean + `explore` * an evidence-shrinking bonus; thompson: one Beta draw per
        # sibling (explore unread). Ties (a cold start) break by a seeded shuffle, not by name.
        "selection": "ucb",  # ucb | thompson
        "explore": 0.2,
        "tie_break": "shuffle",  # shuffle | name
        # replay: each successful rescue is replayed under the base harness (hsjax/harness_s/replay.py)
        # and a sibling's score is multiplied by (its share of valid rescues) ** validity_weight.
        "validity": "off",  # off | replay
        "validity_weight": 1.0,
        # replay: a sibling whose share of valid rescues is below this is not chosen (0: off; <= 0.5).
        "validity_floor": 0.0,
        "decay": 0.9,
        "reanchor_every": 10,
        "voters": (),  # dicts of hsjax.harness_s.router.voters.VoterSpec fields
        # Voter servers the run starts itself on 127.0.0.1: "rule" (reads the profile cards), "tiny"
        # (a served tiny random checkpoint), "policy" (serves model.hf_dir as it is on disk).
        "local_voters": (),
        "local_timeout_s": 30.0,
    })


def train(c: ConfigDict, *, benchmark_name: str = "dbbench", train_split: str, eval_split: str) -> None:
    """Every block `hsjax.modes.train` reads, with defaults for a long run; arms change a few keys."""
    c.mode = "train"
    c.benchmark = benchmark(benchmark_name)
    c.pool = DEFAULT_POOL
    c.total_steps = 200
    c.model = model()
    c.data = ConfigDict({"train_split": train_split, "limit": 0,  # 0 = every task of the split
                         "task_seed": 0})  # which tasks, where the benchmark generates them (synth)
    c.rollout = ConfigDict({"groups": 8,  # G tasks per step
                            "n": 4,  # base rollouts per task
                            "max_context_tokens": 4096, "env_workers": 4,
                            "env_retries": ENV_RETRIES})  # re-runs of an episode whose environment failed
    add_sampling(c.rollout, greedy=False, max_new_tokens=256)
    add_rollout_backend(c.rollout)
    # 0: each step's rollouts are collected before its update, with its params. 1 (one step off): step
    # t+1's are collected during step t's update, with the params before it; the loss's ratio uses the
    # sampler's logprobs (docs/training.md, "Async rollouts").
    c.rollout.staleness = 0
    c.rescue = ConfigDict({"kind": "none",  # none | random | fixed | hint | harness_s
                           "k": 2,  # siblings per all-fail group
                           "m": 2,  # rollouts per sibling
                           "siblings": ("lenient_parse",),  # kind=fixed: names from the pool
                           "hint": ""})  # kind=hint: the hint line of the single hint-augmented base harness
    c.dapo = ConfigDict({"enabled": False, "max_draws": 4})  # at most this many draws of G tasks per step
    c.loss = ConfigDict({"advantage": "grpo",  # grpo | drgrpo | rloo
                         "success_threshold": 1.0, "eps_low": 0.2, "eps_high": 0.28,
                         "aggregation": "token_mean",  # token_mean | sequence_mean
                         "beta": 0.0,  # > 0: a KL term to the starting policy (docs/training.md, KL)
                         "kl_estimator": "k3",  # k1 | k2 | k3: the per-token KL estimate
                         "is_cap": 2.0,
                         "is_weight": "capped",  # capped | one (w = 1 on re-contextualised rescue rows)
                         "rescue_context": "as_generated",  # as_generated | base
                         "rescue_baseline": "rescue",  # rescue | with_base (see docs/training.md)
                         # estimator | sft: rescue slots trained by the estimator's advantage, or
                         # as SFT on the successful ones (1 / 0; docs/training.md)
                         "rescue_advantage": "estimator",
                         "nonfinite": "stop"})  # a non-finite update: stop | skip (docs/training.md)
    # LoRA (docs/training.md, "LoRA"): rank > 0 trains adapters A, B on the listed projections of the
    # frozen model, W + (alpha / rank) A B; only they are in the optimizer state and the checkpoint.
    c.lora = ConfigDict({"rank": 0, "alpha": 16.0,
                         "targets": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")})
    c.optim = ConfigDict({"learning_rate": 1e-6, "warmup_steps": 10, "weight_decay": 0.01, "max_grad_norm": 1.0,
                          "schedule_steps": 0})  # steps of the warm-up + cosine schedule; 0 = total_steps
    c.batch = ConfigDict({"T_buckets": (512, 1024, 2048, 4096, 8192), "micro_batches": 1,
                          "overlong": "drop",  # drop | error
                          # Rows sorted by length into micro-batches, each cut to its own bucket
                          # and empty ones skipped (hsjax.rl.batch.group_by_length); off: every row
                          # at the longest row's bucket, one compiled update per batch shape.
                          "group_by_length": False})
    c.eval = ConfigDict({"every": 50, "split": eval_split, "extra_splits": (), "limit": 0, "task_seed": 0,
                         "at_start": False,  # also score the starting policy at step 0
                         # k > 0: k more episodes a task sampled at eval.temperature (never greedy) beside
                         # the figure of the block's own sampling: eval/<split>/base/pass@1..k, mean@k
                         "num_samples": 0})
    add_sampling(c.eval, greedy=True, max_new_tokens=256)
    c.checkpoint = ConfigDict({"every": 10, "keep": 3})
    c.log = ConfigDict({"tensorboard": True, "progress": True, "episodes_every": 10,
                        "print_every": 5,  # a console line every this many steps
                        # W&B: off | offline (`wandb sync` later) | online; optional: pip install wandb
                        # (docs/training.md, "Tracking"); an empty run name is the workdir's name
                        "wandb": "off", "wandb_project": "hsjax", "wandb_entity": "", "wandb_run_name": "",
                        # each evaluation's sample table: its first rows, replies cut to this many characters
                        "table_rows": 16, "table_chars": 400})
    c.mesh = (("data", -1), ("fsdp", 1), ("tensor", 1))
    c.sharding_rules = ()  # (logical, mesh axes) pairs; empty = hsjax.infra.sharding.DEFAULT_RULES
    # Multi-host (docs/scaling.md): one process per host. Unset address/count/id are detected by JAX
    # (TPU pods, SLURM, Open MPI, JAX_COORDINATOR_ADDRESS).
    c.distributed = ConfigDict({"enabled": False, "coordinator_address": "", "num_processes": 0,
                                "process_id": -1, "initialization_timeout_s": 300,
                                "num_cpu_devices": 0})  # > 0: split each process's CPU into this many devices


def smoke(c: ConfigDict, *, max_context_tokens: int, T_buckets: tuple[int, ...]) -> None:
    """Shrinks a training config to a few steps of a tiny random policy on a handful of tasks
    (minutes on a CPU), exercising the rescue path; an arm applied after it sets its own rescuer.
    Each benchmark gives the context budget its opening needs and the matching length buckets."""
    c.total_steps = 4
    c.optim.warmup_steps = 1
    c.data.limit = 16
    c.rollout.groups = 2
    c.rollout.n = 2
    c.rollout.max_new_tokens = 24
    c.rollout.max_context_tokens = max_context_tokens
    c.rescue.kind = "random"
    c.rescue.m = 1
    c.batch.T_buckets = T_buckets
    c.eval.every = 2
    c.eval.limit = 4
    c.eval.max_new_tokens = 24
    c.checkpoint.every = 2
    c.log.episodes_every = 2
    c.log.progress = False
    c.log.print_every = 1


def train_arms(hint: str, smoke_fn: Callable[[ConfigDict], None]) -> dict[str, Callable[[ConfigDict], None]]:
    """The training variants of every benchmark's experiment file: the arms `policy_only`, `dapo`,
    `hint` (one copy of the base harness with the benchmark's `hint`, k = 1) and `harness_s`; `smoke`
    (the benchmark's own shrink to a few CPU steps, `smoke_fn`) and `smoke_harness_s` (Harness-S end
    to end on a CPU: rescue, re-anchoring every 2 steps, two local voters)."""
    def policy_only(c):
        c.rescue.kind = "none"

    def dapo(c):
        c.rescue.kind = "none"
        c.dapo.enabled = True

    def hint_arm(c):
        c.rescue.kind = "hint"
        c.rescue.hint = hint

    def harness_s(c):
        c.rescue.kind = "harness_s"
        c.router = router()

    def smoke_harness_s(c):
        smoke_fn(c)
        harness_s(c)
        c.router.reanchor_every = 2
        c.router.local_voters = ("rule", "tiny")

    return {"train": lambda c: None, "policy_only": policy_only, "dapo": dapo, "hint": hint_arm,
            "harness_s": harness_s, "smoke_harness_s": smoke_harness_s, "smoke": smoke_fn}


def select(file: str, arg: str | None, *, eval_variants: Mapping[str, Callable], eval_config: Callable[[], ConfigDict],
           train_variants: Mapping[str, Callable], train_config: Callable[[], ConfigDict],
           other_modes: Mapping[str, Callable[[], ConfigDict]] | None = None) -> ConfigDict:
    """`get_config(arg)` of an experiment file: the comma-separated variants of `arg` (default `eval`)
    applied to the eval or the train config; `other_modes` (evolve, rank1) stand alone. `smoke` is
    applied first, so `smoke,dapo` == `dapo,smoke`."""
    other_modes = other_modes or {}
    names = variants(arg) or ["eval"]
    if any(v in other_modes for v in names):
        if len(names) != 1:
            raise ValueError(f"variant {names} : evolve and rank1 stand alone (override keys with --config.x=...)")
        return other_modes[names[0]]()
    unknown = [v for v in names if v not in eval_variants and v not in train_variants]
    if unknown:
        raise ValueError(f"unknown {file} variant(s) {unknown}; known: "
                         f"{sorted({**eval_variants, **train_variants, **other_modes})}")
    training = [v for v in names if v in train_variants]
    if training and len(training) != len(names):
        raise ValueError(f"variants {names} mix eval and training; an eval variant is one of {sorted(eval_variants)}")
    c = train_config() if training else eval_config()
    table = train_variants if training else eval_variants
    for name in sorted(names, key=lambda v: v != "smoke"):
        table[name](c)
    return c
