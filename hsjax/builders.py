"""Objects built from a run's config: benchmark, pool, model, policy, sampling, rescuer, voters.

Every mode builds what it runs on here, so evaluation, training, evolution and the studies get the
same objects from the same config blocks (`experiments/common.py` makes those blocks). Builders
that switch on a `kind` also say which keys each kind reads (`unread_keys`): `run.py` rejects a
command-line override of a key the chosen kind never reads, before anything runs.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Mapping

import jax

from harness_envs.benchmark import Benchmark
from harness_envs.harness import Pool
from harness_envs.registry import make_benchmark as _make_benchmark
from hsjax import models
from hsjax.harness_s import rescue as rescue_lib
from hsjax.harness_s.router import HarnessSRescuer, Profiles, Router, VoterSpec
from hsjax.infra import checkpoint as ckpt_lib
from hsjax.infra import paths
from hsjax.infra.errors import UserError, user_input
from hsjax.models import presets
from hsjax.models.hf import load_tokenizer_file
from hsjax.models.tokenizer import tiny_tokenizer
from hsjax.policies.base import AgentPolicy, SamplingParams
from hsjax.policies.http_chat import HttpChatPolicy
from hsjax.policies.http_tokens import HttpTokenPolicy
from hsjax.policies.jax_policy import JaxPolicy
from hsjax.policies.vllm_policy import VllmOptions, VllmPolicy

# Keys of a block that only some kinds read: {kind: keys read besides `kind`}.
_HTTP_KEYS = ("base_url", "model", "api_key_env", "timeout", "max_retries", "backoff", "max_backoff",
              "max_reply_bytes", "max_consecutive_failures")
POLICY_READS = {"http": (*_HTTP_KEYS, "max_reply_chars"), "http_tokens": (*_HTTP_KEYS, "hf_dir"),
                "jax": ("checkpoint", "hf_dir"), "scripted": ("noise",), "oracle": ()}
_SANDBOX_KEYS = ("isolation", "wall_s", "cpu_s", "memory_mb")
BACKEND_READS = {"sqlite": ("time_budget_s", "max_db_mb"), "mariadb": ("url", "time_budget_s", "max_db_mb"),
                 "offline": _SANDBOX_KEYS, "appworld": (*_SANDBOX_KEYS, "python", "root")}
# SWE-Gym's backend block has two selectors: `kind` (where the instances come from) and `runtime` (where
# they run); a key is read if either's choice reads it.
SWEGYM_BACKEND_READS = {"kind": {"offline": ("instances", "cache_dir"),
                                 "swegym": ("instances", "cache_dir", "split_file")},
                        "runtime": {"local": ("repos_dir", "venvs_dir", "isolation", "cpu_s", "memory_mb"),
                                    "container": ("container_cli",)}}
SWEGYM_ALWAYS_READS = ("test_timeout_s",)
RESCUE_READS = {"none": (), "random": ("k", "m"), "fixed": ("siblings", "m"), "hint": ("hint", "m"),
                "harness_s": ("k", "m")}


def unread_keys(block, path: str, reads: Mapping[str, tuple], selector: str = "kind") -> dict[str, str]:
    """{dotted key: why} for the keys of `block` (at `path`) that its chosen `selector` never reads."""
    chosen = block[selector]
    if chosen not in reads:
        return {}
    return {f"{path}.{k}": f"{path}.{selector}={chosen!r} never reads it" for k in block
            if k != selector and k not in reads[chosen]}


# ------------------------------------------------------------------------------------------------
# Benchmark and harnesses


def make_benchmark(config) -> Benchmark:
    """`config.benchmark`: `name` and the benchmark's options (DBBench: `backend`, `rule`)."""
    options = {k: ({kk: v[kk] for kk in v.keys()} if hasattr(v, "keys") else v)
               for k, v in config.benchmark.items() if k != "name"}
    with user_input(f"benchmark.name={config.benchmark.name!r}", "Check the benchmark block of the config."):
        return _make_benchmark(config.benchmark.name, **options)


def benchmark_unread(config) -> dict[str, str]:
    backend = config.benchmark.get("backend")
    if backend is None:
        return {}
    if config.benchmark.name == "swegym":
        return selectors_unread(backend, "benchmark.backend", SWEGYM_BACKEND_READS, SWEGYM_ALWAYS_READS)
    return unread_keys(backend, "benchmark.backend", BACKEND_READS)


def selectors_unread(block, path: str, tables: Mapping[str, Mapping[str, tuple]], always=()) -> dict[str, str]:
    """`unread_keys` for a block with several selectors: a key is unread if no selector's choice (nor
    `always`) reads it. A choice a table does not know leaves the block unchecked (the builder rejects it)."""
    read = set(always) | set(tables)
    for selector, reads in tables.items():
        if block[selector] not in reads:
            return {}
        read |= set(reads[block[selector]])
    why = ", ".join(f"{s}={block[s]!r}" for s in tables)
    return {f"{path}.{k}": f"{path} with {why} never reads it" for k in block if k not in read}


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
    with user_input(f"split {split!r} of {bench.name}", "Name a split the benchmark has, and check its task files."):
        return bench.load_split(split, **options)


def sampling_params(block, seed: int) -> SamplingParams:
    """A block with `temperature`, `top_p`, `top_k`, `greedy`, `max_new_tokens` as SamplingParams."""
    return SamplingParams(temperature=float(block.temperature), top_p=float(block.top_p), top_k=int(block.top_k),
                          greedy=bool(block.greedy), max_new_tokens=int(block.max_new_tokens), seed=int(seed))


# ------------------------------------------------------------------------------------------------
# Model and policies


RUNTIME_FIELDS = ("dtype", "param_dtype", "remat", "attention_impl", "memory_budget")


def model_of_block(block) -> tuple:
    """(model config, tokenizer, HF directory or None) of a `model` block, without weights: a
    checkpoint path in `hf_dir` (`load_model`'s config and tokenizer), else `preset` (with the
    block's `overrides`, as the SFT warm start has them) and the tiny tokenizer `tokenizer` names;
    the runtime fields of the block applied on top. Takes a ConfigDict or the dict a run's
    config.json holds (a key a run predates takes its default)."""
    get = block.get
    runtime = {k: get(k) for k in RUNTIME_FIELDS if get(k) is not None}
    if get("hf_dir"):
        cfg, _, tokenizer, source = load_model(str(get("hf_dir")), weights=False)
        return dataclasses.replace(cfg, **runtime), tokenizer, source
    tokenizer = tiny_tokenizer(get("tokenizer") or "tiny")
    overrides = {k: int(v) for k, v in dict(get("overrides") or {}).items() if v}
    cfg = presets.get_preset(get("preset") or "tiny", vocab_size=len(tokenizer), **overrides)
    return dataclasses.replace(cfg, **runtime), tokenizer, None


def make_model(config):
    """(model config, params, tokenizer) from `config.model.hf_dir` (an HF directory, or a training
    workdir: `load_model`), or a preset with random weights and a tiny tokenizer."""
    if config.model.hf_dir:
        with user_input(f"model.hf_dir={config.model.hf_dir!r}", HF_DIR_FIX):
            cfg, params, tokenizer, _ = load_model(config.model.hf_dir)
        runtime = {k: config.model[k] for k in RUNTIME_FIELDS if k in config.model}
        return dataclasses.replace(cfg, **runtime), params, tokenizer
    with user_input(f"model.tokenizer={config.model.get('tokenizer')!r}", "Use 'tiny', 'tiny_qwen2' or 'tiny_words'."):
        cfg, tokenizer, _ = model_of_block(config.model)
    params = models.init_params(cfg, jax.random.PRNGKey(config.seed))
    return cfg, params, tokenizer


HF_DIR_FIX = ("Point it at a Hugging Face model directory (config.json, model.safetensors and the tokenizer "
              "files), e.g. one written by the sft or export mode or by `models.save_pretrained`, or at a "
              "training workdir (its latest checkpoint).")


def is_hf_dir(path) -> bool:
    """A Hugging Face model directory: a config and weights. A training workdir also holds a
    config.json (the run's experiment config), so the config alone does not tell them apart."""
    return (path / "config.json").is_file() and any(
        (path / name).is_file() for name in ("model.safetensors", "model.safetensors.index.json"))


def run_config(workdir) -> dict | None:
    """The experiment config a run wrote to `<workdir>/config.json` (None when there is none, or
    when that file is a Hugging Face config)."""
    path = pathlib.Path(workdir) / "config.json"
    if not path.is_file():
        return None
    config = json.loads(path.read_text(encoding="utf-8"))
    return config if isinstance(config, dict) and "mode" in config and "model_type" not in config else None


def load_model(path: str, base_hf_dir: str = "", step: int | None = None, *, weights: bool = True):
    """(model config, params, tokenizer, source) of a checkpoint path; `source` is the HF directory
    the config and tokenizer came from (None for a preset's).

    * An HF directory (config.json and safetensors weights): loaded as it is (`step` must be None).
    * A training workdir, or its `checkpoints/` directory: the params of its latest checkpoint (or
      of `step`), in the model config and tokenizer the run used, read from the `model` block of
      the run's own `<workdir>/config.json` (an HF `model.hf_dir`, recursively, or a preset and
      tiny tokenizer). `base_hf_dir` names them instead (needed when the workdir has no run
      config); the params must fit that model, leaf for leaf.

    With `weights=False` no params are read (None in their place). Relative paths resolve as
    `hsjax.infra.paths.resolve` does."""
    root = paths.resolve(path)
    if is_hf_dir(root) and not base_hf_dir:
        if step is not None:
            raise UserError(f"{path} is an HF directory, which holds one set of weights; drop the step ({step})")
        cfg, params, tokenizer = models.load_pretrained(root, tokenizer=True) if weights else (
            models.load_config(root), None, load_tokenizer_file(root))
        return cfg, params, tokenizer, str(root)
    ckpt_dir = ckpt_lib.resolve_ckpt_dir(root)
    workdir = ckpt_dir.parent if ckpt_dir.name == "checkpoints" else root
    if not ckpt_dir.is_dir():
        raise UserError(f"{path} is neither an HF model directory (config.json and model.safetensors) nor a "
                        f"training workdir (no {ckpt_dir}). {HF_DIR_FIX}")
    if base_hf_dir:
        with user_input(f"hf_dir={base_hf_dir!r}", HF_DIR_FIX):
            cfg, _, tokenizer, source = load_model(base_hf_dir, weights=False)
    else:
        run = run_config(workdir)
        if run is None or not isinstance(run.get("model"), dict):
            raise UserError(f"{workdir} has checkpoints but no run config.json with a model block to tell which "
                            "model and tokenizer they belong to; also give the HF directory of its base model "
                            "(e.g. --config.policy.hf_dir / --config.serve.hf_dir)")
        with user_input(f"the model block of {workdir / 'config.json'}", "Check that the run's model.hf_dir "
                        "still exists, or give the base model's HF directory as hf_dir."):
            cfg, tokenizer, source = model_of_block(run["model"])
    if not weights:
        return cfg, None, tokenizer, source
    try:
        with user_input(f"checkpoint {path!r}", "Give a training workdir (or its checkpoints/ directory) holding "
                                                "an orbax checkpoint, or an HF directory."):
            params = ckpt_lib.load_params(ckpt_dir, step)
    except ckpt_lib.CheckpointError as e:
        raise UserError(f"checkpoint {path!r}: {e}") from e
    check_params_fit(cfg, params, f"the checkpoint in {ckpt_dir}", source or f"preset {cfg.family}")
    return cfg, params, tokenizer, source


def checkpoint_steps(path: str) -> list[int]:
    """The saved steps of a training workdir (or checkpoints directory); [] for an HF directory."""
    root = paths.resolve(path)
    ckpt_dir = ckpt_lib.resolve_ckpt_dir(root)
    if is_hf_dir(root) or not ckpt_dir.is_dir():
        return []
    with ckpt_lib.Checkpointer(ckpt_dir, keep=None, read_only=True) as ckpt:
        return ckpt.all_steps()


def check_params_fit(cfg, params, what: str, model: str) -> None:
    """UserError unless `params` have the tree and shapes `cfg` implies."""
    want = jax.eval_shape(lambda: models.init_params(cfg, jax.random.PRNGKey(0)))
    if jax.tree.structure(want) != jax.tree.structure(params):
        raise UserError(f"{what} holds params of another model than {model} (tree {jax.tree.structure(params)} vs "
                        f"{jax.tree.structure(want)}); give the HF directory of the model the run trained")
    for (key, w), p in zip(jax.tree_util.tree_leaves_with_path(want), jax.tree.leaves(params)):
        if tuple(w.shape) != tuple(p.shape):
            raise UserError(f"{what}: {jax.tree_util.keystr(key)} has shape {tuple(p.shape)}, {model} implies "
                            f"{tuple(w.shape)}; give the HF directory of the model the run trained")


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


def make_policy(block, bench: Benchmark, seed: int):
    """The policy `block.kind` names: a scripted agent of the benchmark, `http` (chat text),
    `http_tokens` (token ids and logprobs from a vLLM-compatible `/v1/completions`, prompts
    rendered with the tokenizer of `hf_dir`: an HF directory or a training workdir) or `jax`."""
    kind = block.kind
    if kind in ("http", "http_tokens"):
        if not block.base_url or not block.model:
            raise UserError(f"policy.kind={kind} needs --config.policy.base_url=... and --config.policy.model=...")
        options = dict(api_key_env=block.api_key_env or None, timeout=float(block.timeout),
                       max_retries=int(block.max_retries), backoff=float(block.backoff),
                       max_backoff=float(block.max_backoff), max_reply_bytes=int(block.max_reply_bytes),
                       max_consecutive_failures=int(block.max_consecutive_failures))
        if kind == "http":
            return HttpChatPolicy(block.base_url, block.model, max_reply_chars=int(block.max_reply_chars) or None,
                                  **options)
        if not block.hf_dir:
            raise UserError("policy.kind=http_tokens needs --config.policy.hf_dir=<HF dir or training workdir of the "
                            "served model>: its tokenizer renders the prompts the server gets as token ids")
        with user_input(f"policy.hf_dir={block.hf_dir!r}", HF_DIR_FIX):
            _, _, tokenizer, _ = load_model(block.hf_dir, weights=False)
        return HttpTokenPolicy(block.base_url, block.model, tokenizer, **options)
    if kind == "jax":
        if not block.checkpoint:
            raise UserError("policy.kind=jax needs --config.policy.checkpoint=<HF dir or training workdir>")
        return load_jax_policy(block.hf_dir, block.checkpoint, seed=seed)
    if kind in bench.agent_kinds:
        options = {"noise": dict(block.noise)} if kind == "scripted" else {}
        return AgentPolicy(bench.make_agent(kind, seed=seed, **options))
    raise UserError(f"policy.kind={kind!r} is not one of {[*bench.agent_kinds, 'http', 'http_tokens', 'jax']}")


def policy_unread(block, path: str = "policy") -> dict[str, str]:
    return unread_keys(block, path, POLICY_READS)


def make_rollout_policy(config, model_cfg, params, tokenizer):
    """The training loop's policy: `rollout.backend` 'jax' (`JaxPolicy`, the default) or 'vllm'
    (`VllmPolicy`, engine options from `rollout.vllm`; a 0 leaves vLLM's default)."""
    backend = config.rollout["backend"] if "backend" in config.rollout else "jax"
    if backend == "jax":
        options = {k: config.rollout[k] for k in ("kv_reuse", "kv_dtype") if k in config.rollout}
        with user_input(f"rollout.kv_dtype={options.get('kv_dtype')!r}", "Use '', 'float32' or 'bfloat16'."):
            return JaxPolicy(model_cfg, params, tokenizer, seed=config.seed, **options)
    if backend != "vllm":
        raise UserError(f"rollout.backend={backend!r} is not one of ['jax', 'vllm']")
    block = dict(config.rollout.vllm)
    options = VllmOptions(weight_sync=block.pop("weight_sync"), engine_kwargs={k: v for k, v in block.items() if v})
    try:
        return VllmPolicy(model_cfg, params, tokenizer, seed=config.seed, options=options)
    except ImportError as e:
        raise UserError(f"rollout.backend='vllm': {e}; or keep --config.rollout.backend=jax") from e


def rollout_unread(config) -> dict[str, str]:
    if "vllm" not in config.rollout:
        return {}
    if config.rollout.backend == "vllm":
        return {k: "rollout.backend='vllm' keeps its own cache" for k in ("rollout.kv_reuse", "rollout.kv_dtype")
                if k.split(".")[1] in config.rollout}
    return {f"rollout.vllm.{k}": "rollout.backend='jax' never reads it" for k in config.rollout.vllm}


# ------------------------------------------------------------------------------------------------
# Rescue


def rescue_harnesses(config, pool: Pool) -> list:
    """The harnesses a run's rescuer chooses from: the pool's siblings, or for `rescue.kind=hint`
    (Guide-GRPO's rescuer) one hint-augmented copy of the base harness."""
    if config.rescue.kind == "hint":
        return [pool.base.with_knobs(name="hint", direction="hint", hint=config.rescue.hint)]
    return list(pool.siblings)


def make_rescuer(config, pool: Pool, extra_voters=()) -> rescue_lib.Rescuer:
    """`config.rescue.kind`: none | random | fixed | hint | harness_s (with `config.router`)."""
    kind, candidates = config.rescue.kind, rescue_harnesses(config, pool)
    if kind == "harness_s":
        if "router" not in config:
            raise ValueError("rescue.kind=harness_s needs the router block: use the :harness_s variant")
        return build_harness_s_rescuer(config.router, candidates, config.rescue.k, extra_voters)
    if kind == "hint":
        return rescue_lib.FixedSiblings(candidates)
    return rescue_lib.make_rescuer(kind, candidates, config.rescue.k, seed=config.seed,
                                   names=list(config.rescue.siblings))


def rescue_unread(config) -> dict[str, str]:
    return unread_keys(config.rescue, "rescue", RESCUE_READS)


def build_harness_s_rescuer(r, pool, k: int, extra_voters=()) -> HarnessSRescuer:
    """The Harness-S rescuer from a `router` block (aggregation, profile_weight, explore, decay,
    reanchor_every, voters: list of VoterSpec field dicts) over the sibling specs `pool`."""
    profiles = Profiles.from_pool(pool)
    voters = []
    fields = [f.name for f in dataclasses.fields(VoterSpec)]
    for i, v in enumerate(r.voters or ()):
        v = dict(v)
        unknown = set(v) - set(fields)
        if unknown:
            raise ValueError(f"config.router.voters[{i}] has unknown keys {sorted(unknown)}; VoterSpec takes {fields}")
        voters.append(VoterSpec(**v))
    # Voters started by the run itself (local servers): their URLs change between runs, so they
    # never enter the config; the router's records of them are keyed by their stable names.
    voters.extend(VoterSpec(**dict(v)) for v in extra_voters)
    router = Router([s.name for s in pool], profiles, voters, k=k, aggregation=r.aggregation,
                    profile_weight=r.profile_weight, explore=r.explore, decay=r.decay,
                    reanchor_every=r.reanchor_every)
    return HarnessSRescuer(pool, router)
