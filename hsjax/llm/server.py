"""An OpenAI-compatible chat-completions server of a policy (mode `serve`).

    python run.py --config experiments/serve.py --config.serve.hf_dir=/ckpt/Qwen2.5-0.5B-Instruct \
        --workdir /tmp/hsjax/serve

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
import pathlib
import queue
import socket
import threading
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from hsjax.rollout.policy import SamplingParams, is_token_policy, render_prompt

log = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant")


class APIError(Exception):
    """An error answered in OpenAI's error shape with an HTTP status."""

    def __init__(self, status: int, message: str, *, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def _bad(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


# ---------------------------------------------------------------------------------------------
# Request parsing (pure)


@dataclasses.dataclass(frozen=True)
class ChatRequest:
    messages: list[dict]
    sampling: SamplingParams


def _number(body: dict, name: str, default: float, lo: float, hi: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise _bad(f"'{name}' must be a number in [{lo}, {hi}], got {value!r}", name)
    return float(value)


def _int(body: dict, name: str, default: int, lo: int, hi: int) -> int:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise _bad(f"'{name}' must be an integer in [{lo}, {hi}], got {value!r}", name)
    return value


def _content(message: dict, i: int) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    # OpenAI's list of content parts; only text parts can be rendered by a chat template.
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise _bad(f"messages[{i}].content must be a string or a list of text parts, got "
               f"{type(content).__name__}", f"messages[{i}].content")


def parse_messages(messages) -> list[dict]:
    if messages is None:
        raise _bad("'messages' is required: a non-empty list of {role, content}", "messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("'messages' must be a non-empty list of {role, content}", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise _bad(f"messages[{i}] must be an object with role and content", f"messages[{i}]")
        role = m.get("role")
        if role not in ROLES:
            raise _bad(f"messages[{i}].role={role!r} is not one of {list(ROLES)}",
                       f"messages[{i}].role")
        out.append({"role": role, "content": _content(m, i)})
    return out


def parse_chat_request(body, *, model_name: str, default_max_tokens: int,
                       max_tokens_limit: int) -> ChatRequest:
    """Validates a chat-completions body; raises `APIError` naming the offending field.

    Temperature 0 means greedy decoding. `max_tokens` (or `max_completion_tokens`) defaults to
    `default_max_tokens`. Fields this server does not act on (penalties, logprobs, user, ...) are
    ignored, as OpenAI-compatible servers commonly do.
    """
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != model_name:
        raise APIError(404, f"model {model!r} is not served here; this server serves {model_name!r}",
                       param="model", code="model_not_found")
    messages = parse_messages(body.get("messages"))
    if body.get("stream"):
        raise _bad("stream=true is not supported; send stream=false or omit it", "stream")
    n = _int(body, "n", 1, 1, 1 << 30)
    if n != 1:
        raise _bad(f"n={n} is not supported: this server returns one choice per request; send n=1 "
                   "or repeat the request", "n")
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0.0:
        raise _bad("top_p must be > 0; use temperature=0 for greedy decoding", "top_p")
    top_k = _int(body, "top_k", 0, 0, 1 << 30)
    max_key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _int(body, max_key, default_max_tokens, 1, max_tokens_limit)
    seed = _int(body, "seed", 0, -(1 << 63), (1 << 63) - 1)
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise _bad(f"'stop' must be a non-empty string or a list of them, got {stop!r}", "stop")
    greedy = temperature == 0.0
    if greedy:  # settings that do not change a greedy reply, normalized so greedy requests batch
        temperature, top_p, top_k, seed = 1.0, 1.0, 0, 0
    sampling = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, greedy=greedy,
                              max_new_tokens=max_tokens, stop_strings=tuple(stop),
                              seed=seed % (1 << 32))
    return ChatRequest(messages, sampling)


def cut_at_stop(text: str, stop_strings) -> str:
    """The text before the first stop string (OpenAI leaves the stop string out of the reply)."""
    cuts = [i for i in (text.find(s) for s in stop_strings) if i >= 0]
    return text[:min(cuts)] if cuts else text


# ---------------------------------------------------------------------------------------------
# The batching scheduler


@dataclasses.dataclass
class Reply:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str


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
                    raise _bad(f"the chat template could not render these messages: "
                               f"{type(e).__name__}: {e}", "messages") from None
            if self.max_context is not None and job.prompt_ids is not None:
                total = len(job.prompt_ids) + req.sampling.max_new_tokens
                if total > self.max_context:
                    raise _bad(f"the prompt has {len(job.prompt_ids)} tokens and max_tokens is "
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
        return _error_response(_bad(f"invalid request: {exc.errors()}"))

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
            raise _bad(f"the request body is not valid JSON: {e}") from None
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


def completion_body(reply: Reply, model_name: str) -> dict:
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model_name,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": reply.text},
                     "logprobs": None, "finish_reason": reply.finish_reason}],
        "usage": {"prompt_tokens": reply.prompt_tokens,
                  "completion_tokens": reply.completion_tokens,
                  "total_tokens": reply.prompt_tokens + reply.completion_tokens},
    }


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


def write_tiny_model(out_dir, seed: int = 0) -> pathlib.Path:
    """A random `tiny` preset model with the tiny tokenizer, saved as an HF directory."""
    import jax

    from hsjax.models import get_preset, init_params, save_pretrained
    from hsjax.models.tokenizer import build_tiny_tokenizer

    cfg = get_preset("tiny")
    params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.PRNGKey(seed))
    save_pretrained(params, cfg, build_tiny_tokenizer(), out_dir)
    return pathlib.Path(out_dir)


def load_policy(serve_cfg, seed: int = 0, workdir: str | None = None):
    """(JaxPolicy, default model name) from `serve.hf_dir` and/or `serve.checkpoint`.

    `checkpoint` alone may be an HF directory; a workdir or checkpoint directory also needs
    `hf_dir` for the model config and tokenizer (params come from its latest step). With neither
    and `init_tiny`, a random tiny model is written to `<workdir>/tiny_model` and served.
    """
    from hsjax.rollout.policy import JaxPolicy

    hf_dir, ckpt = serve_cfg.get("hf_dir") or "", serve_cfg.get("checkpoint") or ""
    if ckpt and (pathlib.Path(ckpt) / "config.json").is_file():
        hf_dir, ckpt = ckpt, ""
    if not hf_dir:
        if ckpt:
            raise ValueError(f"serve.checkpoint={ckpt} is not an HF directory (no config.json); set "
                             "--config.serve.hf_dir to the HF directory of its base model")
        if not serve_cfg.get("init_tiny"):
            raise ValueError("serve needs --config.serve.hf_dir=<HF dir> and/or "
                             "--config.serve.checkpoint=<workdir or HF dir> (or serve.init_tiny)")
        if workdir is None:
            raise ValueError("serve.init_tiny writes the model into the workdir; pass a workdir")
        hf_dir = str(write_tiny_model(pathlib.Path(workdir) / "tiny_model", seed))
    policy = JaxPolicy.from_pretrained(hf_dir, seed=seed)
    if ckpt:
        from hsjax.infra.checkpoint import load_params

        policy.update_params(load_params(ckpt))
    return policy, pathlib.Path(ckpt or hf_dir).resolve().name


def main(config, workdir: str) -> None:
    import uvicorn

    s = config.serve
    policy, default_name = load_policy(s, seed=int(config.get("seed", 0)), workdir=workdir)
    model_name = s.get("model_name") or default_name
    app = build_app(policy, model_name, max_batch=int(s.max_batch),
                    batch_window_s=float(s.batch_window_ms) / 1000.0,
                    max_context=int(s.max_context) or None,
                    default_max_tokens=int(s.default_max_tokens),
                    max_tokens_limit=int(s.max_tokens_limit), api_key_env=s.get("api_key_env") or None)
    with open(pathlib.Path(workdir) / "config.json", "w", encoding="utf-8") as f:
        f.write(config.to_json_best_effort(indent=2))
    log.info("serve: model %r at http://%s:%d/v1 (auth %s)", model_name, s.host, s.port,
             f"via ${s.api_key_env}" if s.get("api_key_env") else "off")
    uvicorn.run(app, host=s.host, port=int(s.port), log_level=s.get("log_level", "info"))
