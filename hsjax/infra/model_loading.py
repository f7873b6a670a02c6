"""Which model a path or a `model` block names: model config, tokenizer and (optionally) weights.

A path is a Hugging Face model directory (config.json and safetensors weights) or a training
workdir (or its `checkpoints/` directory), whose params belong to the model its own run config
names. That run's `model` block may name another workdir in turn (a run warm-started from a run),
so resolving one is a walk down a chain of run configs to an HF directory or a preset: the chain
is walked in one loop (`model_of_block`), and `load_model` reads the weights at its top.

Checkpoints sit here, beside `hsjax.infra.checkpoint`, rather than in `hsjax.models`: the layers
below infra hold the decoder family alone and read no orbax checkpoint.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib

import jax

from hsjax import models
from hsjax.infra import checkpoint as ckpt_lib
from hsjax.infra import paths
from hsjax.infra.errors import UserError, user_input
from hsjax.models import lora, presets
from hsjax.models.hf import load_tokenizer_file
from hsjax.models.tokenizer import tiny_tokenizer

# The fields of a `model` block applied on top of the model config it names (how it runs, not
# what it is).
RUNTIME_FIELDS = ("dtype", "param_dtype", "remat", "attention_impl", "memory_budget")

HF_DIR_FIX = ("Point it at a Hugging Face model directory (config.json, model.safetensors and the tokenizer "
              "files), e.g. one written by the sft or export mode or by `models.save_pretrained`, or at a "
              "training workdir (its latest checkpoint).")
RUN_BLOCK_FIX = ("Check that the run's model.hf_dir still exists, or give the base model's HF directory "
                 "as hf_dir.")


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


def checkpoint_dir(path: str) -> tuple[pathlib.Path, pathlib.Path]:
    """(checkpoints directory, workdir) of a training workdir or its `checkpoints/` directory;
    a `UserError` when `path` is neither that nor an HF directory."""
    root = paths.resolve(path)
    ckpt_dir = ckpt_lib.resolve_ckpt_dir(root)
    if not ckpt_dir.is_dir():
        raise UserError(f"{path} is neither an HF model directory (config.json and model.safetensors) nor a "
                        f"training workdir (no {ckpt_dir}). {HF_DIR_FIX}")
    return ckpt_dir, (ckpt_dir.parent if ckpt_dir.name == "checkpoints" else root)


def run_model_block(workdir: pathlib.Path) -> dict:
    """The `model` block of the run config in `workdir`: which model its checkpoints belong to."""
    run = run_config(workdir)
    if run is None or not isinstance(run.get("model"), dict):
        raise UserError(f"{workdir} has checkpoints but no run config.json with a model block to tell which "
                        "model and tokenizer they belong to; also give the HF directory of its base model "
                        "(e.g. --config.policy.hf_dir / --config.serve.hf_dir)")
    return run["model"]


def model_of_block(block) -> tuple:
    """(model config, tokenizer, HF directory or None) of a `model` block, without weights: a
    checkpoint path in `hf_dir` (an HF directory, or a training workdir: the model its run's own
    `model` block names, and so on down the chain), else `preset` (with the block's `overrides`,
    as the SFT warm start has them) and the tiny tokenizer `tokenizer` names. The runtime fields of
    the blocks passed on the way apply on top, the outermost block's winning. Takes a ConfigDict or
    the dict a run's config.json holds (a key a run predates takes its default)."""
    runtime: dict = {}
    seen: set[pathlib.Path] = set()
    errors = contextlib.nullcontext()  # a failure inside a run's model block names that run
    while True:
        with errors:
            get = block.get
            for k in RUNTIME_FIELDS:
                if get(k) is not None:
                    runtime.setdefault(k, get(k))
            if not get("hf_dir"):
                tokenizer = tiny_tokenizer(get("tokenizer") or "tiny")
                overrides = {k: int(v) for k, v in dict(get("overrides") or {}).items() if v}
                cfg = presets.get_preset(get("preset") or "tiny", vocab_size=len(tokenizer), **overrides)
                return dataclasses.replace(cfg, **runtime), tokenizer, None
            path = str(get("hf_dir"))
            root = paths.resolve(path)
            if is_hf_dir(root):
                cfg = models.load_config(root)
                return dataclasses.replace(cfg, **runtime), load_tokenizer_file(root), str(root)
            _, workdir = checkpoint_dir(path)
            if workdir.resolve() in seen:
                raise UserError(f"{workdir} is its own base model: its run's model.hf_dir leads back to it; "
                                "give the base model's HF directory as hf_dir")
            seen.add(workdir.resolve())
            block = run_model_block(workdir)
        errors = user_input(f"the model block of {workdir / 'config.json'}", RUN_BLOCK_FIX)


def load_model(path: str, base_hf_dir: str = "", step: int | None = None, *, weights: bool = True):
    """(model config, params, tokenizer, source) of a checkpoint path; `source` is the HF directory
    the config and tokenizer came from (None for a preset's).

    * An HF directory (config.json and safetensors weights): loaded as it is (`step` must be None).
    * A training workdir, or its `checkpoints/` directory: the params of its latest checkpoint (or
      of `step`), in the model config and tokenizer the run used, read from the `model` block of
      the run's own `<workdir>/config.json` (`model_of_block`). `base_hf_dir` names them instead
      (needed when the workdir has no run config); the params must fit that model, leaf for leaf.

    With `weights=False` no params are read (None in their place). Relative paths resolve as
    `hsjax.infra.paths.resolve` does."""
    root = paths.resolve(path)
    if is_hf_dir(root) and not base_hf_dir:
        if step is not None:
            raise UserError(f"{path} is an HF directory, which holds one set of weights; "
                            f"drop the step ({step})")
        cfg, params, tokenizer = models.load_pretrained(root, tokenizer=True) if weights else (
            models.load_config(root), None, load_tokenizer_file(root))
        return cfg, params, tokenizer, str(root)
    ckpt_dir, workdir = checkpoint_dir(path)
    if base_hf_dir:
        with user_input(f"hf_dir={base_hf_dir!r}", HF_DIR_FIX):
            cfg, tokenizer, source = model_of_block({"hf_dir": base_hf_dir})
    else:
        block = run_model_block(workdir)
        with user_input(f"the model block of {workdir / 'config.json'}", RUN_BLOCK_FIX):
            cfg, tokenizer, source = model_of_block(block)
    if not weights:
        return cfg, None, tokenizer, source
    try:
        fix = ("Give a training workdir (or its checkpoints/ directory) holding an orbax checkpoint, "
               "or an HF directory.")
        with user_input(f"checkpoint {path!r}", fix):
            params = ckpt_lib.load_params(ckpt_dir, step)
    except ckpt_lib.CheckpointError as e:
        raise UserError(f"checkpoint {path!r}: {e}") from e
    run = run_config(workdir) if not base_hf_dir else None
    if run and (run.get("lora") or {}).get("rank"):
        params = merged_adapters(cfg, params, run, workdir)
    check_params_fit(cfg, params, f"the checkpoint in {ckpt_dir}", source or f"preset {cfg.family}")
    return cfg, params, tokenizer, source


def merged_adapters(cfg, adapters, run: dict, workdir) -> dict:
    """The params a LoRA run's checkpoint stands for: the run's base model (loaded again from its
    `model.hf_dir`, or a preset's weights drawn again from the run's seed, as the run drew them)
    with the saved adapters merged (docs/training.md, "LoRA")."""
    block, model = run["lora"], run["model"]
    with user_input(f"the base model of the LoRA run in {workdir}", RUN_BLOCK_FIX):
        base = (load_model(str(model["hf_dir"]))[1] if model.get("hf_dir")
                else models.init_params(cfg, jax.random.PRNGKey(int(run.get("seed", 0)))))
        lora.check_fits(adapters, base)
    return lora.merge(base, adapters, lora.scale_of(block["alpha"], block["rank"]))


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
        raise UserError(f"{what} holds params of another model than {model} (tree "
                        f"{jax.tree.structure(params)} vs {jax.tree.structure(want)}); give the HF "
                        "directory of the model the run trained")
    for (key, w), p in zip(jax.tree_util.tree_leaves_with_path(want), jax.tree.leaves(params)):
        if tuple(w.shape) != tuple(p.shape):
            raise UserError(f"{what}: {jax.tree_util.keystr(key)} has shape {tuple(p.shape)}, {model} "
                            f"implies {tuple(w.shape)}; give the HF directory of the model the run trained")
