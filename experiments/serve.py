"""Serve a policy as an OpenAI-compatible chat-completions endpoint (mode `serve`, hsjax/llm/server.py).

`get_config(arg)`: `arg` is empty or `tiny` (serve a random tiny model written to
`<workdir>/tiny_model`: no checkpoint needed, for smoke tests and local voters).

    # an HF directory (e.g. a downloaded Qwen2.5-0.5B-Instruct)
    python run.py --config experiments/serve.py --config.serve.hf_dir=/ckpt/Qwen2.5-0.5B-Instruct \
        --config.serve.port=8001 --workdir /tmp/hsjax/serve
    # the latest checkpoint of a training workdir, in the model config and tokenizer the run used
    python run.py --config experiments/serve.py --config.serve.checkpoint=/tmp/hsjax/train \
        --config.serve.model_name=policy-step-400 --workdir /tmp/hsjax/serve_ckpt
    # with a key: clients send `Authorization: Bearer $SERVE_KEY`
    SERVE_KEY=... python run.py --config experiments/serve.py:tiny --config.serve.api_key_env=SERVE_KEY \
        --workdir /tmp/hsjax/serve_tiny
    # then
    curl -s http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \
        -d '{"model": "tiny_model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}'

Seen (`:tiny`, a shared 2-core CPU under load): /health answered 13.6 s after the command started;
the first request (17 prompt + 8 new tokens) took 11.0 s, nearly all of it compiling the sampler
program of its batch/prompt/budget bucket; the next ones 0.016 s in the server (10 ms of it the
batching window), 0.1 s at the client. Each new bucket compiles once.
"""
from __future__ import annotations

import ml_collections


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.mode = "serve"
    c.seed = 0

    c.serve = ml_collections.ConfigDict()
    c.serve.checkpoint = ""  # an HF directory, or a training workdir / its checkpoints directory
    # with a workdir checkpoint: the HF directory of its model config and tokenizer (default: the run's own);
    # alone: the HF directory (or workdir) to serve
    c.serve.hf_dir = ""
    c.serve.init_tiny = False  # neither given: serve a random tiny model (written to the workdir)
    c.serve.model_name = ""  # the name clients send; default: the served directory's name
    c.serve.host = "127.0.0.1"  # 0.0.0.0 exposes it beyond this machine: set api_key_env then
    c.serve.port = 8000
    c.serve.api_key_env = ""  # name of an env var holding the bearer key; empty = no auth
    c.serve.max_batch = 8  # requests per generate call
    c.serve.batch_window_ms = 10.0  # how long the first request waits for company
    c.serve.max_context = 0  # prompt + max_tokens bound; 0 = the model's max_position_embeddings
    c.serve.default_max_tokens = 256  # when a request names no max_tokens
    c.serve.max_tokens_limit = 4096  # larger max_tokens are a 400
    c.serve.max_queue = 64  # requests waiting for the worker; one more is a 429 with Retry-After
    # each new set of stop strings may compile a sampler program (seconds, blocking every request)
    c.serve.max_stop_strings = 8  # more stop strings in a request are a 400
    c.serve.max_stop_chars = 64  # a longer stop string is a 400
    # memory: a request holds at most its body, read and parsed within these bounds (docs/harness_s.md)
    c.serve.max_body_bytes = 4 << 20  # a longer body is a 413, refused before or while it is read
    c.serve.max_prompt_chars = 0  # a longer prompt is a 400 before tokenizing; 0 = 8 x the context length
    c.serve.max_connections = 256  # open connections; one more is a 503 (each may hold max_body_bytes)
    c.serve.log_level = "info"
    # a directory: POST /update_weights_from_disk may load HF directories under it (a training run's
    # rollout.backend=http_tokens pushes its weights there, docs/training.md "Async rollouts"); empty = off
    c.serve.weights_root = ""

    for variant in [v for v in (arg or "").split(",") if v]:
        if variant == "tiny":
            c.serve.init_tiny = True
            c.serve.default_max_tokens = 64
        else:
            raise ValueError(f"experiments/serve.py: unknown variant {variant!r}; use '' or 'tiny'")
    return c
