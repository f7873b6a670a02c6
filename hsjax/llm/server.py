"""An OpenAI-compatible server of a policy (run by `hsjax/modes/serve.py`, and in-process by the
local voters and the tests through `BackgroundServer`).

Routes: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`, `GET /health`. The
wire format, with vLLM's token-id extensions, per-token logprobs, `n` and streaming, is
`hsjax.llm.openai_api`'s. Errors use OpenAI's shape, `{"error": {"message", "type", "param",
"code"}}`: 400 for a bad request (also a field the server does not implement, more than
`max_stop_strings` stop strings, or one longer than `max_stop_chars`, a prompt of more than
`max_prompt_chars` characters, a body nested deeper than `request_body.MAX_JSON_DEPTH`), 401 for a
missing or wrong key, 404 for an unknown model or route, 413 for a body past `max_body_bytes`
(refused before or while it is read: `hsjax.llm.request_body`), 429 with `Retry-After` when
`max_queue` requests already wait, 500 when generation fails.

A streamed reply (`stream: true`) is sent as server-sent events (`data: {chunk}` lines, then
`data: [DONE]`) once its generation has finished: the sampler runs a whole reply in one compiled
loop, so the chunks carry the same tokens as the non-streamed reply, not earlier ones.

One worker thread owns the policy (`hsjax.llm.scheduler.BatchScheduler`): the handlers only
validate and enqueue, then wait for the reply or for the client to disconnect, whichever comes
first; a request whose client has left is dropped before its generation starts.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import logging
import os
import socket
import threading
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from hsjax.llm.openai_api import (MAX_STOP_CHARS, MAX_STOP_STRINGS, APIError, bad_request, default_prompt_chars,
                                  parse_chat_request, parse_completion_request, short)
from hsjax.llm.openai_replies import Reply, TokenText, response_body, stream_chunks
from hsjax.llm.request_body import MAX_BODY_BYTES, parse_json, read_body
from hsjax.llm.scheduler import MAX_QUEUE, BatchScheduler, QueuedRequest
from hsjax.policies.base import as_policy

log = logging.getLogger(__name__)

# Bounds of a weight push's fields (`POST /update_weights_from_disk`).
MAX_WEIGHTS_PATH_CHARS = 4096  # PATH_MAX on Linux
MAX_WEIGHT_VERSION_CHARS = 64

# ---------------------------------------------------------------------------------------------
# The app


def _error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


async def _client_gone(request: Request) -> None:
    """Returns when the client disconnects: its body is read, so the next ASGI message is that."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _reply_or_none(request: Request, scheduler: BatchScheduler, job: QueuedRequest) -> Reply | None:
    """The job's reply (or its error, raised), or None when the client left first: then the job
    is abandoned, and dropped unless its generation has started."""
    reply = asyncio.wrap_future(job.future)
    gone = asyncio.ensure_future(_client_gone(request))
    try:
        await asyncio.wait({reply, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not reply.done():
            scheduler.abandon(job)
            reply.cancel()
    return None if reply.cancelled() else reply.result()


def build_app(policy, model_name: str, *, tokenizer=None, max_batch: int = 8,
              batch_window_s: float = 0.01, max_context: int | None = None,
              default_max_tokens: int = 256, max_tokens_limit: int = 4096,
              api_key_env: str | None = None, max_queue: int = MAX_QUEUE,
              max_stop_strings: int = MAX_STOP_STRINGS, max_stop_chars: int = MAX_STOP_CHARS,
              max_body_bytes: int = MAX_BODY_BYTES, max_prompt_chars: int | None = None,
              load_weights=None):
    """A FastAPI app serving `policy` under `model_name`.

    `max_context` defaults to the policy's `max_context` (None: no bound). With
    `api_key_env`, `/v1/*` requires `Authorization: Bearer <value of that variable>` (read once,
    here; never logged); `/health` stays open. The scheduler is `app.state.scheduler`; it runs
    while the app's lifespan does. `max_queue` requests may wait (then 429); a request may carry at
    most `max_stop_strings` stop strings of at most `max_stop_chars` characters (else 400). A
    request samples at most `max_batch` sequences (its prompts times `n`). A body past
    `max_body_bytes` is a 413; a prompt past `max_prompt_chars` characters a 400 before it is
    tokenized (None: `openai_api.CHARS_PER_TOKEN_BOUND` times `max_context`).

    `load_weights(model_path) -> params` (None: off, the endpoint answers 404) turns on `POST
    /update_weights_from_disk {"model_path", "weight_version"}`, SGLang's endpoint, which a training
    run's `rollout.backend=http_tokens` calls after each update: the params are loaded off the event
    loop and swapped in between two generate calls (`BatchScheduler.update_params`). It takes the API key
    like `/v1/*`; `load_weights` decides which paths it reads (serve mode: under `serve.weights_root`)
    and raises ValueError for one it refuses (a 400).
    """
    policy = as_policy(policy)
    if max_context is None:
        max_context = policy.max_context
    if max_prompt_chars is None:
        max_prompt_chars = default_prompt_chars(max_context)
    if max_body_bytes < 1 or max_prompt_chars < 1:
        raise ValueError(f"serve: max_body_bytes={max_body_bytes} and max_prompt_chars={max_prompt_chars} "
                         "must be >= 1")
    api_key = None
    if api_key_env:
        api_key = os.environ.get(api_key_env)
        if not api_key:
            raise ValueError(f"serve: environment variable {api_key_env} is unset or empty; export "
                             "the key clients must send there, or leave api_key_env empty")
    scheduler = BatchScheduler(policy, tokenizer=tokenizer, max_batch=max_batch,
                               batch_window_s=batch_window_s, max_context=max_context, max_queue=max_queue)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        scheduler.start()
        try:
            yield
        finally:
            await asyncio.to_thread(scheduler.close)

    app = FastAPI(title="hsjax serve", lifespan=lifespan)
    app.state.scheduler = scheduler
    app.state.model_name = model_name
    started = int(time.time())
    tokens = TokenText(scheduler.tokenizer) if scheduler.tokenizer is not None else None
    limits = dict(model_name=model_name, default_max_tokens=min(default_max_tokens, max_tokens_limit),
                  max_tokens_limit=max_tokens_limit, max_stop_strings=max_stop_strings,
                  max_stop_chars=max_stop_chars, max_rows=max_batch, max_prompt_chars=max_prompt_chars)

    def authorize(request: Request) -> None:
        if api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(),
                                                                 api_key.encode()):
            raise APIError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'",
                           code="invalid_api_key")

    @app.exception_handler(APIError)
    async def api_error(_request, err: APIError):
        return _error_response(err)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request, exc: StarletteHTTPException):
        return _error_response(APIError(exc.status_code, str(exc.detail),
                                        code="not_found" if exc.status_code == 404 else None))

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request, exc: RequestValidationError):
        return _error_response(bad_request(f"invalid request: {exc.errors()}"))

    @app.exception_handler(Exception)
    async def internal_error(_request, exc: Exception):
        log.exception("serve: internal error")
        return _error_response(APIError(500, f"internal error: {type(exc).__name__}: {short(str(exc))}",
                                        type_="server_error"))

    @app.get("/health")
    async def health():
        status = 200 if scheduler.alive else 503
        return JSONResponse({"status": "ok" if status == 200 else "worker_down",
                             "model": model_name, "requests": scheduler.requests,
                             "generate_calls": scheduler.generate_calls,
                             "largest_batch": scheduler.largest_batch, "waiting": scheduler.waiting,
                             "dropped": scheduler.dropped, "weight_version": scheduler.weight_version},
                            status_code=status)

    @app.get("/v1/models")
    async def models(request: Request):
        authorize(request)
        return {"object": "list", "data": [{"id": model_name, "object": "model",
                                            "created": started, "owned_by": "hsjax"}]}

    async def generate(request: Request, parse):
        authorize(request)
        parsed = parse(parse_json(await read_body(request, max_body_bytes)), **limits)
        start = time.monotonic()
        try:
            reply = await _reply_or_none(request, scheduler, scheduler.submit(parsed))
        except APIError:
            raise
        except Exception as e:
            raise APIError(500, f"generation failed: {type(e).__name__}: {short(str(e))}",
                           type_="server_error") from e
        if reply is None:
            log.info("serve: the client left after %.3fs, before its reply; dropped", time.monotonic() - start)
            return Response(status_code=499)  # nobody reads it
        log.info("serve: %s, %d prompt + %d completion tokens in %.3fs (%s)", parsed.kind, reply.prompt_tokens,
                 reply.completion_tokens, time.monotonic() - start, ",".join(c.finish_reason for c in reply.choices))
        if parsed.stream:
            return StreamingResponse(_sse(stream_chunks(parsed, reply, model_name, tokens)),
                                     media_type="text/event-stream")
        return response_body(parsed, reply, model_name, tokens)

    @app.post("/update_weights_from_disk")
    async def update_weights(request: Request):
        authorize(request)
        if load_weights is None:
            raise APIError(404, "this server takes no weight updates; start it with serve.weights_root=<dir>",
                           code="not_found")
        body = parse_json(await read_body(request, max_body_bytes))
        if not isinstance(body, dict):
            raise bad_request("the request body must be a JSON object")
        path, version = body.get("model_path"), body.get("weight_version")
        # /health shows the version to anyone, so it is short; the path is read by the loader only
        if (not isinstance(path, str) or not path or len(path) > MAX_WEIGHTS_PATH_CHARS
                or not isinstance(version, (str, type(None))) or len(version or "") > MAX_WEIGHT_VERSION_CHARS):
            raise bad_request(f"the body is {{\"model_path\": <directory, at most {MAX_WEIGHTS_PATH_CHARS} characters>, "
                              f"\"weight_version\": <string of at most {MAX_WEIGHT_VERSION_CHARS}, optional>}}")
        start = time.monotonic()
        try:
            params = await asyncio.to_thread(load_weights, path)
        except (ValueError, OSError) as e:
            raise bad_request(f"weights not loaded: {str(e)[:500]}", "model_path") from None
        await asyncio.to_thread(scheduler.update_params, params, version)
        log.info("serve: weight version %s from %s in %.2fs", version, path, time.monotonic() - start)
        return {"success": True, "message": f"loaded {path}", "weight_version": version}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(request, parse_chat_request)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(request, functools.partial(parse_completion_request, max_prompt_tokens=max_context))

    return app


def _sse(chunks):
    """Server-sent events: one `data:` line per chunk, then `data: [DONE]`."""
    for chunk in chunks:
        yield f"data: {json.dumps(chunk)}\n\n"
    yield "data: [DONE]\n\n"


# ---------------------------------------------------------------------------------------------
# Running it


class BackgroundServer:
    """Serves `app` with uvicorn in a thread of this process (tests, in-process voters).

    `port=0` takes a free port; `base_url` is `http://host:port/v1`. Use as a context manager or
    call `close()`.
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning",
                 startup_timeout_s: float = 30.0):
        import uvicorn

        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.host, self.port = host, self._sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, lifespan="on"))
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]},
                                        name="serve-uvicorn", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + startup_timeout_s
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"uvicorn did not start on {host}:{self.port} within "
                                   f"{startup_timeout_s}s; see the log above")
            time.sleep(0.01)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def close(self) -> None:
        self.server.should_exit = True
        self._thread.join(30)
        self._sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
