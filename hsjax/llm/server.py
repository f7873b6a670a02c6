"""An OpenAI-compatible chat-completions server of a policy (run by `hsjax/modes/serve.py`, and
in-process by the local voters and the tests through `BackgroundServer`).

Routes: `POST /v1/chat/completions`, `GET /v1/models`, `GET /health`. Errors use OpenAI's shape,
`{"error": {"message", "type", "param", "code"}}`: 400 for a bad request, 401 for a missing or
wrong key, 404 for an unknown model or route, 500 when generation fails.

One worker thread owns the policy and its tokenizer (`BatchScheduler`): the HTTP handlers only
validate and enqueue. The worker takes the first waiting request, collects more for up to
`batch_window_s` or until `max_batch` are in hand, groups them by identical `SamplingParams` and
makes one `policy.generate` call per group. Grouping, rather than per-row settings, keeps each
request's draw under the policy's own key schedule; the clients that matter here (voters, the HTTP
policy in rollouts) send identical settings, so they batch fully. See docs/harness_s.md.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import hmac
import json
import logging
import os
import queue
import socket
import threading
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from hsjax.llm.openai_api import APIError, ChatRequest, Reply, bad_request, completion_body, cut_at_stop, parse_chat_request
from hsjax.rollout.policy import SamplingParams, is_token_policy, render_prompt

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# The batching scheduler



@dataclasses.dataclass
class _Job:
    request: ChatRequest
    future: concurrent.futures.Future
    prompt_ids: list[int] | None = None


class BatchScheduler:
    """Owns the policy: a worker thread batches queued requests into `generate` (or `chat`) calls.

    `policy` is a token policy (`generate` + a tokenizer with a chat template) or a chat policy
    (`chat`). `max_context` bounds prompt + max_tokens (None: no bound). Counters: `requests`,
    `generate_calls`, `largest_batch`.
    """

    def __init__(self, policy, *, tokenizer=None, max_batch: int = 8, batch_window_s: float = 0.01,
                 max_context: int | None = None):
        if max_batch < 1 or batch_window_s < 0:
            raise ValueError(f"max_batch={max_batch} must be >= 1 and batch_window_s="
                             f"{batch_window_s} >= 0")
        self.policy = policy
        self.tokenizer = tokenizer if tokenizer is not None else getattr(policy, "tokenizer", None)
        self.token_policy = is_token_policy(policy)
        if self.token_policy and self.tokenizer is None:
            raise ValueError(f"{type(policy).__name__} generates token ids but has no tokenizer to "
                             "render chat messages; pass tokenizer=... or give the policy one")
        if not self.token_policy and not callable(getattr(policy, "chat", None)):
            raise TypeError(f"{type(policy).__name__} has neither generate(prompts, sampling) nor "
                            "chat(contexts, sampling); it cannot be served")
        self.max_batch, self.batch_window_s, self.max_context = max_batch, batch_window_s, max_context
        self.requests = self.generate_calls = self.largest_batch = 0
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="serve-worker", daemon=True)
            self._thread.start()

    def close(self, timeout: float = 30.0) -> None:
        self._closed = True
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout)
        while True:  # whatever is left never gets an answer
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.future.set_exception(APIError(503, "the server is shutting down",
                                                  type_="server_error"))

    def submit(self, request: ChatRequest) -> concurrent.futures.Future:
        if self._closed or not self.alive:
            raise APIError(503, "the generation worker is not running", type_="server_error")
        job = _Job(request, concurrent.futures.Future())
        self._queue.put(job)
        return job.future

    def _collect(self, first: _Job) -> list[_Job]:
        jobs, deadline = [first], time.monotonic() + self.batch_window_s
        while len(jobs) < self.max_batch:
            try:
                job = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if job is None:
                self._queue.put(None)
                break
            jobs.append(job)
        return jobs

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            jobs = [j for j in self._collect(first) if j.future.set_running_or_notify_cancel()]
            groups: dict[SamplingParams, list[_Job]] = {}
            for job in jobs:
                if self._prepare(job):
                    groups.setdefault(job.request.sampling, []).append(job)
            for sampling, group in groups.items():
                try:
                    replies = self._generate(group, sampling)
                except Exception as e:  # answered as a 500; the worker keeps serving
                    log.exception("serve: generation failed for a batch of %d", len(group))
                    for job in group:
                        job.future.set_exception(e)
                    continue
                for job, reply in zip(group, replies):
                    job.future.set_result(reply)

    def _prepare(self, job: _Job) -> bool:
        """Renders the prompt and checks its length; on failure answers the job and says False."""
        req = job.request
        try:
            if self.tokenizer is not None:
                try:
                    job.prompt_ids = render_prompt(self.tokenizer, req.messages)
                except Exception as e:
                    raise bad_request(f"the chat template could not render these messages: "
                               f"{type(e).__name__}: {e}", "messages") from None
            if self.max_context is not None and job.prompt_ids is not None:
                total = len(job.prompt_ids) + req.sampling.max_new_tokens
                if total > self.max_context:
                    raise bad_request(f"the prompt has {len(job.prompt_ids)} tokens and max_tokens is "
                               f"{req.sampling.max_new_tokens}: {total} > the context limit "
                               f"{self.max_context}; shorten the messages or lower max_tokens",
                               "messages", "context_length_exceeded")
        except APIError as e:
            job.future.set_exception(e)
            return False
        return True

    def _generate(self, group: list[_Job], sampling: SamplingParams) -> list[Reply]:
        self.requests += len(group)
        self.generate_calls += 1
        self.largest_batch = max(self.largest_batch, len(group))
        if self.token_policy:
            gens = self.policy.generate([j.prompt_ids for j in group], sampling)
            replies = []
            for job, g in zip(group, gens):
                text = g.text if g.text is not None else self.tokenizer.decode(
                    g.ids, skip_special_tokens=True)
                replies.append(Reply(text, len(job.prompt_ids), len(g.ids), g.finish_reason))
        else:
            texts = self.policy.chat([j.request.messages for j in group], sampling)
            replies = [Reply(t, len(j.prompt_ids or ()), self._count(t), "stop")
                       for j, t in zip(group, texts)]
        for r in replies:
            if sampling.stop_strings:
                cut = cut_at_stop(r.text, sampling.stop_strings)
                if cut != r.text:
                    r.text, r.finish_reason = cut, "stop"
        return replies

    def _count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False)) if self.tokenizer else 0


# ---------------------------------------------------------------------------------------------
# The app


def _error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status)


def build_app(policy, model_name: str, *, tokenizer=None, max_batch: int = 8,
              batch_window_s: float = 0.01, max_context: int | None = None,
              default_max_tokens: int = 256, max_tokens_limit: int = 4096,
              api_key_env: str | None = None):
    """A FastAPI app serving `policy` under `model_name`.

    `max_context` defaults to the policy's `cfg.max_position_embeddings` when it has one. With
    `api_key_env`, `/v1/*` requires `Authorization: Bearer <value of that variable>` (read once,
    here; never logged); `/health` stays open. The scheduler is `app.state.scheduler`; it runs
    while the app's lifespan does.
    """
    if max_context is None:
        max_context = getattr(getattr(policy, "cfg", None), "max_position_embeddings", None)
    api_key = None
    if api_key_env:
        api_key = os.environ.get(api_key_env)
        if not api_key:
            raise ValueError(f"serve: environment variable {api_key_env} is unset or empty; export "
                             "the key clients must send there, or leave api_key_env empty")
    scheduler = BatchScheduler(policy, tokenizer=tokenizer, max_batch=max_batch,
                               batch_window_s=batch_window_s, max_context=max_context)

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
        return _error_response(APIError(500, f"internal error: {type(exc).__name__}: {exc}",
                                        type_="server_error"))

    @app.get("/health")
    async def health():
        status = 200 if scheduler.alive else 503
        return JSONResponse({"status": "ok" if status == 200 else "worker_down",
                             "model": model_name, "requests": scheduler.requests,
                             "generate_calls": scheduler.generate_calls,
                             "largest_batch": scheduler.largest_batch}, status_code=status)

    @app.get("/v1/models")
    async def models(request: Request):
        authorize(request)
        return {"object": "list", "data": [{"id": model_name, "object": "model",
                                            "created": started, "owned_by": "hsjax"}]}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        authorize(request)
        try:
            body = json.loads(await request.body())
        except (ValueError, UnicodeDecodeError) as e:
            raise bad_request(f"the request body is not valid JSON: {e}") from None
        chat = parse_chat_request(body, model_name=model_name,
                                  default_max_tokens=min(default_max_tokens, max_tokens_limit),
                                  max_tokens_limit=max_tokens_limit)
        start = time.monotonic()
        try:
            reply = await asyncio.wrap_future(scheduler.submit(chat))
        except APIError:
            raise
        except Exception as e:
            raise APIError(500, f"generation failed: {type(e).__name__}: {e}",
                           type_="server_error") from e
        log.info("serve: %d prompt + %d completion tokens in %.3fs (%s)", reply.prompt_tokens,
                 reply.completion_tokens, time.monotonic() - start, reply.finish_reason)
        return completion_body(reply, model_name)

    return app


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
