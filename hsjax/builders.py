"""Objects built from a run's config: benchmark, pool, model, policy, sampling, runner, rescuer, voters.

Every mode builds what it runs on here, so evaluation, training, evolution and the studies get the
same objects from the same config blocks (`experiments/common.py` makes those blocks). A block that
switches on a `kind` is read through the typed config of that kind (`hsjax.config_kinds`, and
`hsjax.harness_s.rescue_kinds` for the rescuer); the keys the chosen kind never reads follow from
its type (`*_unread`), and `run.py` rejects a command-line override of one before anything runs.
Which model a path names (HF directory or training workdir) is `hsjax.infra.model_loading`'s.
"""
from __future__ import annotations

import dataclasses
import functools
import os

import jax

from harness_envs.benchmark import Benchmark
from harness_envs.harness import Pool
from harness_envs.registry import make_benchmark as _make_benchmark
from hsjax import config_kinds, models
from hsjax.harness_s import replay, rescue_kinds
from hsjax.harness_s.rescue import Rescuer
from hsjax.harness_s.rescue_kinds import build_harness_s_rescuer  # noqa: F401  (the studies' and tests' name)
from hsjax.infra import config_blocks, paths
from hsjax.infra.errors import UserError, user_input
# Model resolution is hsjax.infra.model_loading's; its names are also reachable from here, where the
# studies and older callers look for them.
from hsjax.infra.model_loading import (HF_DIR_FIX, RUNTIME_FIELDS, check_params_fit,  # noqa: F401
                                       checkpoint_steps, is_hf_dir, load_model, model_of_block, run_config)
from hsjax.models import lora
from hsjax.policies.base import AgentPolicy, sampling_params  # noqa: F401  (modes' name)
from hsjax.policies.http_chat import HttpChatPolicy
from hsjax.policies.http_rollout import HttpRolloutPolicy
from hsjax.policies.http_tokens import HttpTokenPolicy
from hsjax.policies.jax_policy import JaxPolicy
from hsjax.policies.vllm_policy import VllmOptions, VllmPolicy
from hsjax.rollout.runner import ENV_RETRIES, ONE_BATCH, EpisodeRunner, ProcessShardedRunner


# ------------------------------------------------------------------------------------------------
# Benchmark and harnesses


def make_benchmark(config) -> Benchmark:
    """`config.benchmark`: `name` and the benchmark's options (DBBench: `backend`, `rule`)."""
    options = {k: ({kk: v[kk] for kk in v.keys()} if hasattr(v, "keys") else v)
               for k, v in config.benchmark.items() if k != "name"}
    with user_input(f"benchmark.name={config.benchmark.name!r}", "Check the benchmark block of the config."):
        return _make_benchmark(config.benchmark.name, **options)


def benchmark_unread(config) -> dict[str, str]:
    """The keys of `benchmark.backend` its kind (SWE-Gym: its kind and runtime) never reads."""
    backend = config.benchmark.get("backend")
    if backend is None:
        return {}
    if config.benchmark.name == "swegym":
        kinds, every = config_kinds.SWEGYM_BACKEND_KINDS, config_kinds.SwegymEveryBackend
        return config_blocks.unread_of_selectors(backend, "benchmark.backend", kinds, always=every)
    return config_blocks.unread(backend, "benchmark.backend", config_kinds.BACKEND_KINDS)


def harness_names(value) -> list[str]:
    """Harness names from a config value: a list/tuple, or one comma-separated string (what a
    command-line override of a tuple field gives)."""
    items = [value] if isinstance(value, str) else list(value)
    names = [n.strip() for item in items for n in str(item).split(",") if n.strip()]
    if not names:
        raise ValueError("no harness named; name at least one, e.g. ['base']")
    return names


def load_pool(config, bench: Benchmark) -> Pool:
    """`config.pool`: a pool file of the benchmark (relative paths: cwd, then the repository)."""
    with user_input(f"pool={config.pool!r}", "Give a pool file of this benchmark (see harness_envs/pools/)."):
        return bench.load_pool(paths.resolve(config.pool) if config.pool else None)


def load_split(bench: Benchmark, split: str, **options) -> list:
    """`bench.load_split(split, **options)`, with a missing or bad split or task file as a `UserError`."""
    fix = "Name a split the benchmark has, and check its task files."
    with user_input(f"split {split!r} of {bench.name}", fix):
        return bench.load_split(split, **options)


def make_runner(config, bench: Benchmark, policy, *, runner: str = "runner", sampling: str = "sampling",
                sharded: bool = False, progress=None) -> EpisodeRunner:
    """The episode runner of every mode: `bench`'s episodes played by `policy`, with the runner
    settings of the block `config[runner]` (`batch_size`, where absent: `ONE_BATCH`, each call's
    jobs in one batch; `env_workers`; the context budgets `max_context_tokens` and
    `max_context_chars`, where absent: none; `env_retries`, where absent: `runner.ENV_RETRIES`) and
    the sampling of `config[sampling]` seeded with `config.seed`. `sharded`: each call's jobs split across the processes of a multi-process run
    (`ProcessShardedRunner`); `progress`: a bar updated after each batch."""
    block = config[runner]
    cls = ProcessShardedRunner if sharded else EpisodeRunner
    return cls(bench.make_episode, policy, sampling_params(config[sampling], config.seed),
               batch_size=block["batch_size"] if "batch_size" in block else ONE_BATCH,
               env_workers=block.env_workers, max_context_tokens=block.get("max_context_tokens"),
               max_context_chars=block.get("max_context_chars"), progress=progress,
               env_retries=block.get("env_retries", ENV_RETRIES))


# ------------------------------------------------------------------------------------------------
# Model and policies


def make_model(config):
    """(model config, params, tokenizer) from `config.model.hf_dir` (an HF directory, or a training
    workdir: `load_model`), or a preset with random weights and a tiny tokenizer."""
    if config.model.hf_dir:
        with user_input(f"model.hf_dir={config.model.hf_dir!r}", HF_DIR_FIX):
            cfg, params, tokenizer, _ = load_model(config.model.hf_dir)
        runtime = {k: config.model[k] for k in RUNTIME_FIELDS if k in config.model}
        return dataclasses.replace(cfg, **runtime), params, tokenizer
    fix = "Use 'tiny', 'tiny_qwen2' or 'tiny_words'."
    with user_input(f"model.tokenizer={config.model.get('tokenizer')!r}", fix):
        cfg, tokenizer, _ = model_of_block(config.model)
    params = models.init_params(cfg, jax.random.PRNGKey(config.seed))
    return cfg, params, tokenizer


def _lora_block(config):
    """The `lora` block of a run that trains adapters (`lora.rank > 0`), else None."""
    block = config.get("lora")
    return block if block is not None and block.rank else None


def make_lora(config, params):
    """(adapters, merge) of a LoRA run (hsjax/models/lora.py): fresh adapters on `params`, seeded by
    `config.seed` so a resumed run's template matches the saved ones, and `merge(base, adapters) ->
    params` at alpha / rank. (None, None) when `lora.rank = 0`."""
    block = _lora_block(config)
    if block is None:
        return None, None
    with user_input("lora.targets", f"Name projections of {list(lora.INPUT_AXES)}."):
        adapters = lora.init_adapters(params, int(block.rank), tuple(block.targets),
                                      jax.random.fold_in(jax.random.PRNGKey(config.seed), 1))
    return adapters, functools.partial(lora.merge, scale=lora.scale_of(block.alpha, block.rank))


def lora_unread(config) -> dict[str, str]:
    """{key: why} of the `lora` block's keys a run without adapters never reads."""
    if "lora" not in config or _lora_block(config) is not None:
        return {}
    return {f"lora.{key}": "lora.rank=0" for key in config.lora if key != "rank"}


def load_jax_policy(hf_dir: str, checkpoint: str = "", *, seed: int = 0, **sampler_kwargs) -> JaxPolicy:
    """The policy of `checkpoint` (`load_model`: an HF directory or a training workdir), with
    `hf_dir` naming the model config and tokenizer of a workdir's params when given; without
    `checkpoint`, the policy of `hf_dir` itself (which may also be a workdir)."""
    path, base = (checkpoint, hf_dir) if checkpoint else (hf_dir, "")
    if not path:
        raise UserError("no checkpoint given: name an HF directory or a training workdir")
    if base and is_hf_dir(paths.resolve(path)):
        base = ""  # an HF directory carries its own config and tokenizer
    with user_input(f"checkpoint={path!r}", HF_DIR_FIX):
        cfg, params, tokenizer, _ = load_model(path, base)
    return JaxPolicy(cfg, params, tokenizer, seed=seed, **sampler_kwargs)


def make_policy(block, bench: Benchmark, seed: int, path: str = "policy"):
    """The policy `block.kind` names: a scripted agent of the benchmark, `http` (chat text),
    `http_tokens` (token ids and logprobs from a vLLM-compatible `/v1/completions`, prompts
    rendered with the tokenizer of `hf_dir`: an HF directory or a training workdir) or `jax`."""
    kind = block.kind
    kinds = config_kinds.POLICY_KINDS
    cfg = kinds[kind].from_block(block, path) if kind in kinds else None
    if isinstance(cfg, config_kinds.HttpOptions):
        if not cfg.base_url or not cfg.model:
            raise UserError(f"policy.kind={kind} needs --config.policy.base_url=... and "
                            "--config.policy.model=...")
        if isinstance(cfg, config_kinds.HttpPolicyConfig):
            return HttpChatPolicy(cfg.base_url, cfg.model, max_reply_chars=cfg.max_reply_chars or None,
                                  **cfg.client_options())
        if not cfg.hf_dir:
            raise UserError("policy.kind=http_tokens needs --config.policy.hf_dir=<HF dir or training "
                            "workdir of the served model>: its tokenizer renders the prompts the server gets "
                            "as token ids")
        with user_input(f"policy.hf_dir={cfg.hf_dir!r}", HF_DIR_FIX):
            _, _, tokenizer, _ = load_model(cfg.hf_dir, weights=False)
        return HttpTokenPolicy(cfg.base_url, cfg.model, tokenizer, **cfg.client_options())
    if isinstance(cfg, config_kinds.JaxPolicyConfig):
        if not cfg.checkpoint:
            raise UserError("policy.kind=jax needs --config.policy.checkpoint=<HF dir or training workdir>")
        return load_jax_policy(cfg.hf_dir, cfg.checkpoint, seed=seed)
    if kind in bench.agent_kinds:
        options = {"noise": cfg.noise} if isinstance(cfg, config_kinds.ScriptedPolicyConfig) else {}
        return AgentPolicy(bench.make_agent(kind, seed=seed, **options))
    known = [*bench.agent_kinds, 'http', 'http_tokens', 'jax']
    raise UserError(f"policy.kind={kind!r} is not one of {known}")


def policy_unread(block, path: str = "policy") -> dict[str, str]:
    """The keys of a policy block its kind never reads."""
    return config_blocks.unread(block, path, config_kinds.POLICY_KINDS)


ROLLOUT_BACKENDS = ("jax", "vllm", "http_tokens")


def make_rollout_policy(config, model_cfg, params, tokenizer, workdir: str = ""):
    """The training loop's policy: `rollout.backend` 'jax' (`JaxPolicy`, the default), 'vllm'
    (`VllmPolicy`, engine options from `rollout.vllm`; a 0 leaves vLLM's default) or 'http_tokens'
    (`HttpRolloutPolicy`: separate servers, `rollout.http`, weights pushed under `workdir`)."""
    backend = config.rollout["backend"] if "backend" in config.rollout else "jax"
    if backend == "jax":
        options = {k: config.rollout[k] for k in ("kv_reuse", "kv_dtype") if k in config.rollout}
        with user_input(f"rollout.kv_dtype={options.get('kv_dtype')!r}", "Use '', 'float32' or 'bfloat16'."):
            return JaxPolicy(model_cfg, params, tokenizer, seed=config.seed, **options)
    if backend == "http_tokens":
        return make_http_rollout_policy(config.rollout.http, model_cfg, tokenizer, workdir)
    if backend != "vllm":
        raise UserError(f"rollout.backend={backend!r} is not one of {list(ROLLOUT_BACKENDS)}")
    block = dict(config.rollout.vllm)
    options = VllmOptions(weight_sync=block.pop("weight_sync"),
                          engine_kwargs={k: v for k, v in block.items() if v})
    try:
        return VllmPolicy(model_cfg, params, tokenizer, seed=config.seed, options=options)
    except ImportError as e:
        raise UserError(f"rollout.backend='vllm': {e}; or keep --config.rollout.backend=jax") from e


def make_http_rollout_policy(block, model_cfg, tokenizer, workdir: str) -> HttpRolloutPolicy:
    """`rollout.backend=http_tokens`'s policy from the `rollout.http` block."""
    urls = [u for u in block.base_urls if u]
    if not urls or not block.model:
        raise UserError("rollout.backend=http_tokens needs --config.rollout.http.base_urls=\"('http://host:port/v1',)\" "
                        "and --config.rollout.http.model=<the served model's name>")
    if jax.process_count() > 1:
        raise UserError("rollout.backend=http_tokens runs one training process: its weight push is one writer")
    weights_dir = paths.resolve(block.weights_dir) if block.weights_dir else os.path.join(workdir, "rollout_weights")
    options = {k: block[k] for k in ("timeout", "max_retries", "backoff", "max_backoff", "max_consecutive_failures")}
    with user_input("rollout.http", "See experiments/common.py, add_rollout_backend."):
        return HttpRolloutPolicy(urls, block.model, tokenizer, model_cfg, weights_dir,
                                 max_concurrency=int(block.max_concurrency), push_timeout_s=float(block.push_timeout_s),
                                 api_key_env=block.api_key_env or None, **options)


def rollout_unread(config) -> dict[str, str]:
    if "vllm" not in config.rollout:
        return {}
    backend = config.rollout.backend
    out = {}
    if backend != "jax":
        out.update({k: f"rollout.backend={backend!r} keeps its own cache"
                    for k in ("rollout.kv_reuse", "rollout.kv_dtype") if k.split(".")[1] in config.rollout})
    if backend != "vllm":
        out.update({f"rollout.vllm.{k}": f"rollout.backend={backend!r} never reads it" for k in config.rollout.vllm})
    if backend != "http_tokens" and "http" in config.rollout:
        out.update({f"rollout.http.{k}": f"rollout.backend={backend!r} never reads it" for k in config.rollout.http})
    return out


# ------------------------------------------------------------------------------------------------
# Rescue


def rescue_harnesses(config, pool: Pool) -> list:
    """The harnesses a run's rescuer chooses from: the pool's siblings, or for `rescue.kind=hint`
    (Guide-GRPO's rescuer) one hint-augmented copy of the base harness."""
    return rescue_kinds.rescue_config(config.rescue).harnesses(pool)


def make_rescuer(config, pool: Pool, extra_voters=()) -> Rescuer:
    """`config.rescue.kind`: none | random | fixed | hint | harness_s (with `config.router`); the
    table of kinds is `hsjax.harness_s.rescue_kinds.RESCUE_KINDS`."""
    router = config.router if "router" in config else None
    context = rescue_kinds.BuildContext(seed=config.seed, router=router, extra_voters=extra_voters)
    return rescue_kinds.make_rescuer(config.rescue, pool, context)


def make_validity_check(config, bench, base):
    """`router.validity=replay` under `rescue.kind=harness_s`: the check that replays each successful
    rescue under the base harness (hsjax/harness_s/replay.py); None otherwise."""
    if config.rescue.kind == "harness_s" and config.router.validity == "replay":
        return replay.checker(bench, base, config.loss.success_threshold)
    return None


def rescue_unread(config) -> dict[str, str]:
    """The keys of the rescue block its kind never reads."""
    return rescue_kinds.unread(config.rescue)
