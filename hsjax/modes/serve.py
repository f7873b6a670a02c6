"""Serve mode: a policy as an OpenAI-compatible chat-completions endpoint (`hsjax.llm.server`).

    python run.py --config experiments/serve.py --config.serve.hf_dir=/ckpt/Qwen2.5-0.5B-Instruct \
        --workdir /tmp/hsjax/serve

`serve.checkpoint` (or `serve.hf_dir`) names the policy: an HF directory, or a training workdir (its
latest checkpoint, in the model config and tokenizer the run used; with both set, `hf_dir` names
them instead). With neither and `serve.init_tiny`, a random tiny model is written to
`<workdir>/tiny_model` and served.
"""
from __future__ import annotations

import logging
import pathlib

import uvicorn

from hsjax import builders
from hsjax.infra import paths
from hsjax.infra.errors import UserError
from hsjax.infra.model_loading import check_params_fit, is_hf_dir
from hsjax.llm.server import build_app
from hsjax.models.tiny import write_tiny_model

log = logging.getLogger(__name__)


def load_policy(serve_cfg, seed: int = 0, workdir: str | None = None):
    """(JaxPolicy, default model name) from `serve.checkpoint` / `serve.hf_dir` / `serve.init_tiny`
    (`hsjax.builders.load_jax_policy`: each an HF directory or a training workdir)."""
    hf_dir, ckpt = serve_cfg.hf_dir, serve_cfg.checkpoint
    if not hf_dir and not ckpt:
        if not serve_cfg.get("init_tiny"):
            raise UserError("serve needs --config.serve.checkpoint=<HF dir or training workdir> (or "
                            "--config.serve.hf_dir=..., or serve.init_tiny)")
        hf_dir = str(write_tiny_model(pathlib.Path(workdir) / "tiny_model", seed))
    policy = builders.load_jax_policy(hf_dir, ckpt, seed=seed)
    return policy, paths.resolve(ckpt or hf_dir).resolve().name


def weights_loader(root: str, cfg, model_name: str):
    """`load(model_path) -> params` for `POST /update_weights_from_disk`: an HF directory under `root`
    (symlinks resolved first) whose params fit the served model `cfg`; ValueError for anything else.
    None when `root` is empty (the endpoint is off)."""
    if not root:
        return None
    base = pathlib.Path(paths.resolve(root)).resolve()
    if not base.is_dir():
        raise UserError(f"serve.weights_root={root!r} is not a directory; create it or leave it empty")

    def load(model_path: str):
        path = pathlib.Path(model_path).resolve()
        if path != base and base not in path.parents:
            raise ValueError(f"the path is outside serve.weights_root ({base}): {model_path[:200]!r}")
        if not is_hf_dir(path):
            raise ValueError(f"not an HF model directory (config.json + safetensors): {model_path[:200]!r}")
        _, params, _, _ = builders.load_model(str(path), weights=True)
        try:
            check_params_fit(cfg, params, str(path), model_name)
        except UserError as e:
            raise ValueError(str(e)) from None
        return params
    return load


def check_bounds(s) -> None:
    """A UserError naming the key when a memory bound of `serve` is not a positive number (0 is the
    default only for `max_prompt_chars`)."""
    lows = {"max_body_bytes": 1, "max_connections": 1, "max_prompt_chars": 0}
    for key, low in lows.items():
        if int(s[key]) < low:
            raise UserError(f"serve.{key}={s[key]} must be >= {low}; it bounds the server's memory under "
                            "hostile requests (see experiments/serve.py for the default)")


def main(config, workdir: str) -> None:
    s = config.serve
    check_bounds(s)
    policy, default_name = load_policy(s, seed=int(config.seed), workdir=workdir)
    model_name = s.model_name or default_name
    app = build_app(policy, model_name, max_batch=int(s.max_batch),
                    batch_window_s=float(s.batch_window_ms) / 1000.0,
                    max_context=int(s.max_context) or None,
                    default_max_tokens=int(s.default_max_tokens),
                    max_tokens_limit=int(s.max_tokens_limit), api_key_env=s.api_key_env or None,
                    max_queue=int(s.max_queue), max_stop_strings=int(s.max_stop_strings),
                    max_stop_chars=int(s.max_stop_chars), max_body_bytes=int(s.max_body_bytes),
                    max_prompt_chars=int(s.max_prompt_chars) or None,
                    load_weights=weights_loader(s.weights_root, policy.cfg, model_name))
    with open(pathlib.Path(workdir) / "config.json", "w", encoding="utf-8") as f:
        f.write(config.to_json_best_effort(indent=2))
    print(f"serving {model_name!r} at http://{s.host}:{s.port}/v1 (auth "
          f"{'via $' + s.api_key_env if s.api_key_env else 'off'})", flush=True)
    uvicorn.run(app, host=s.host, port=int(s.port), log_level=s.log_level,
                limit_concurrency=int(s.max_connections))
