"""The serve worker: one thread owns the policy and its tokenizer, and batches queued requests.

The HTTP handlers (hsjax/llm/server.py) only validate and `submit`. The worker takes the first
waiting request, collects more for up to `batch_window_s` or until `max_batch` sequences are in hand
(a request asks for its prompts times `n` of them; one that would pass the bound waits for the next
call), groups them by identical `SamplingParams` and makes one `policy.generate` call per group,
the `n` choices of a prompt as `n` rows. Grouping, rather than per-row settings, keeps each
request's draw under the policy's own key schedule; the clients that matter here (voters, the HTTP
policies in rollouts) send identical settings, so they batch fully. See docs/harness_s.md.

Bounds: with `max_queue` requests waiting, `submit` answers 429 with `Retry-After` (estimated from
the recent generate calls). A request whose client has left (`abandon`) is dropped before its
generation starts; a generation already running finishes.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import queue
import threading
import time

from hsjax.llm.openai_api import APIError, GenerateRequest, bad_request, cut_at_stop
from hsjax.llm.openai_replies import Choice, Reply
from hsjax.policies.base import SamplingParams, TokenPolicy, as_policy
from hsjax.policies.tokens import render_prompt

log = logging.getLogger(__name__)

MAX_QUEUE = 64  # requests waiting for the worker; more are a 429


@dataclasses.dataclass(eq=False)
class QueuedRequest:
    """A submitted request: its handler awaits `future`; `abandoned` once its client has left."""

    request: GenerateRequest
    future: concurrent.futures.Future
    prompt_ids: list[list[int]] | None = None  # one per prompt, once rendered (token policies)
    abandoned: bool = False
    waiting: bool = True  # counted among the requests waiting for the worker


class BatchScheduler:
    """Owns the policy: a worker thread batches queued requests into `generate` (or `chat`) calls.

    `policy` is a `TokenPolicy` (with a tokenizer with a chat template) or a `ChatPolicy` (chat
    requests without token ids or logprobs only); a benchmark's scripted agent is taken as a chat
    policy (`as_policy`). `max_context` bounds prompt +
    max_tokens (None: no bound); with `max_queue` requests waiting, `submit` answers 429. Counters:
    `requests`, `generate_calls`, `largest_batch` (sequences in one call), `dropped` (requests
    abandoned by their clients before generation).
    """

    def __init__(self, policy, *, tokenizer=None, max_batch: int = 8, batch_window_s: float = 0.01,
                 max_context: int | None = None, max_queue: int = MAX_QUEUE):
        if max_batch < 1 or batch_window_s < 0 or max_queue < 1:
            raise ValueError(f"max_batch={max_batch} and max_queue={max_queue} must be >= 1 and "
                             f"batch_window_s={batch_window_s} >= 0")
        self.policy = policy = as_policy(policy)
        self.tokenizer = tokenizer if tokenizer is not None else policy.tokenizer
        self.token_policy = isinstance(policy, TokenPolicy)
        if self.token_policy and self.tokenizer is None:
            raise ValueError(f"{type(policy).__name__} generates token ids but has no tokenizer to "
                             "render chat messages; pass tokenizer=... or give the policy one")
        self.max_batch, self.batch_window_s, self.max_context = max_batch, batch_window_s, max_context
        self.max_queue = max_queue
        self.requests = self.generate_calls = self.largest_batch = self.dropped = 0
        self._waiting, self._call_s = 0, 1.0  # requests in the queue; seconds per generate call (EMA)
        self._lock = threading.Lock()
        self._params_lock = threading.Lock()  # held through each generate call; `update_params` waits for it
        self.weight_version: str | None = None  # the last `update_params`'s version; None: the weights it started with
        self._queue: queue.Queue[QueuedRequest | None] = queue.Queue()
        self._held: QueuedRequest | None = None  # taken from the queue, waits for the next call
        self._thread: threading.Thread | None = None
        self._closed = False

    def update_params(self, params, version: str | None) -> None:
        """The policy samples from `params` from the next generate call on; a call running finishes
        with the old ones, so no reply mixes two versions."""
        with self._params_lock:
            self.policy.update_params(params)
            self.weight_version = version

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
        left, self._held = [self._held], None
        while True:  # whatever is left never gets an answer
            try:
                left.append(self._queue.get_nowait())
            except queue.Empty:
                break
        for job in left:
            if job is not None and job.future.set_running_or_notify_cancel():
                job.future.set_exception(APIError(503, "the server is shutting down",
                                                  type_="server_error"))

    def submit(self, request: GenerateRequest) -> QueuedRequest:
        if self._closed or not self.alive:
            raise APIError(503, "the generation worker is not running", type_="server_error")
        if request.needs_ids and not self.token_policy:
            raise bad_request(f"this server's policy ({type(self.policy).__name__}) answers chat messages with text "
                              "only: it has no token ids or logprobs and no /v1/completions; send a chat request "
                              "without logprobs and return_token_ids")
        with self._lock:
            if self._waiting >= self.max_queue:
                retry_s = min(60, max(1, round(self._call_s * (self._waiting / self.max_batch + 1))))
                raise APIError(429, f"{self._waiting} requests are waiting, the most this server queues "
                               f"(serve.max_queue); retry in {retry_s} s", type_="rate_limit_error",
                               code="queue_full", headers={"Retry-After": str(retry_s)})
            self._waiting += 1
        job = QueuedRequest(request, concurrent.futures.Future())
        self._queue.put(job)
        return job

    @property
    def waiting(self) -> int:
        """Requests in the queue that the worker has not taken yet (abandoned ones not counted)."""
        return self._waiting

    def abandon(self, job: QueuedRequest) -> None:
        """The client has left: the job is dropped unless its generation has started."""
        job.abandoned = True
        job.future.cancel()  # succeeds while it waits in the queue
        self._taken(job)

    def _taken(self, job: QueuedRequest) -> None:
        with self._lock:
            if job.waiting:
                job.waiting, self._waiting = False, self._waiting - 1

    def _collect(self, first: QueuedRequest) -> list[QueuedRequest]:
        """`first` and the requests that arrive within the batch window, up to `max_batch` rows; a
        request that would pass the bound is held for the next call."""
        jobs, rows, deadline = [first], first.request.rows, time.monotonic() + self.batch_window_s
        while rows < self.max_batch:
            try:
                job = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if job is None:
                self._queue.put(None)
                break
            if rows + job.request.rows > self.max_batch:
                self._held = job
                break
            jobs.append(job)
            rows += job.request.rows
        for job in jobs:
            self._taken(job)
        return jobs

    def _live(self, group: list[QueuedRequest]) -> list[QueuedRequest]:
        """The running jobs whose clients are still there; the others are ended and counted as dropped."""
        live = [j for j in group if not j.abandoned]
        for job in group:
            if job.abandoned:
                job.future.set_exception(APIError(499, "the client closed the connection"))
        self.dropped += len(group) - len(live)
        return live

    def _run(self) -> None:
        while True:
            first, self._held = (self._held, None) if self._held is not None else (self._queue.get(), None)
            if first is None:
                return
            taken = self._collect(first)
            jobs = [j for j in taken if j.future.set_running_or_notify_cancel()]  # abandoned ones are cancelled
            self.dropped += len(taken) - len(jobs)
            groups: dict[SamplingParams, list[QueuedRequest]] = {}
            for job in jobs:
                if self._prepare(job):
                    groups.setdefault(job.request.sampling, []).append(job)
            for sampling, group in groups.items():
                group = self._live(group)  # a client may have left while the groups before it ran
                if not group:
                    continue
                try:
                    with self._params_lock:
                        replies = self._generate(group, sampling)
                except Exception as e:  # answered as a 500; the worker keeps serving
                    log.exception("serve: generation failed for a batch of %d", len(group))
                    for job in group:
                        job.future.set_exception(e)
                    continue
                for job, reply in zip(group, replies):
                    job.future.set_result(reply)

    def _prepare(self, job: QueuedRequest) -> bool:
        """Renders or tokenizes the prompts and checks their ids and length; on failure answers the
        job and says False."""
        req = job.request
        try:
            if self.token_policy:
                job.prompt_ids = self._prompt_ids(req)
            elif req.messages is not None and self.tokenizer is not None:
                job.prompt_ids = [self._render(req.messages)]
            for ids in job.prompt_ids or ():
                total = len(ids) + req.sampling.max_new_tokens
                if self.max_context is not None and total > self.max_context:
                    raise bad_request(f"the prompt has {len(ids)} tokens and max_tokens is "
                                      f"{req.sampling.max_new_tokens}: {total} > the context limit "
                                      f"{self.max_context}; shorten the prompt or lower max_tokens",
                                      "messages" if req.kind == "chat" else "prompt", "context_length_exceeded")
        except APIError as e:
            job.future.set_exception(e)
            return False
        except Exception as e:  # a bug: this request's 500, never the worker's end (every later request's 503)
            log.exception("serve: preparing a request failed")
            job.future.set_exception(e)
            return False
        return True

    def _render(self, messages: list[dict]) -> list[int]:
        try:
            return render_prompt(self.tokenizer, messages)
        except Exception as e:
            raise bad_request(f"the chat template could not render these messages: {type(e).__name__}: {e}",
                              "messages") from None

    def _prompt_ids(self, req: GenerateRequest) -> list[list[int]]:
        if req.kind == "chat":
            return [self._render(req.messages)]
        vocab = len(self.tokenizer)
        out = []
        for i, prompt in enumerate(req.prompts):
            # A text prompt is tokenized as vLLM does by default (special tokens such as BOS added).
            ids = self._encode(prompt, i) if isinstance(prompt, str) else list(prompt)
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise bad_request(f"prompt {i} holds token id {bad[0]}, outside the vocabulary [0, {vocab})", "prompt")
            if not ids:
                raise bad_request(f"prompt {i} tokenizes to nothing", "prompt")
            out.append(ids)
        return out

    def _encode(self, prompt: str, i: int) -> list[int]:
        try:
            return self.tokenizer.encode(prompt)
        except Exception as e:  # e.g. a lone surrogate ("\ud800" is valid JSON), which no tokenizer encodes
            raise bad_request(f"prompt {i} could not be tokenized: {type(e).__name__}: {str(e)[:200]}",
                              "prompt") from None

    def _generate(self, group: list[QueuedRequest], sampling: SamplingParams) -> list[Reply]:
        self.requests += len(group)
        self.generate_calls += 1
        self.largest_batch = max(self.largest_batch, sum(j.request.rows for j in group))
        start = time.monotonic()
        try:
            return self._replies(group, sampling)
        finally:
            self._call_s = 0.8 * self._call_s + 0.2 * (time.monotonic() - start)

    def _replies(self, group: list[QueuedRequest], sampling: SamplingParams) -> list[Reply]:
        """One generate (or chat) call for the group: each job's prompts, each `n` times, as rows."""
        if self.token_policy:
            rows = [ids for j in group for ids in j.prompt_ids for _ in range(j.request.n)]
            gens = iter(self.policy.generate(rows, sampling))
            replies = []
            for job in group:
                choices = [self._choice(next(gens), sampling) for _ in range(job.request.rows)]
                replies.append(Reply(job.prompt_ids, choices, sum(len(c.ids) for c in choices)))
            return replies
        contexts = [j.request.messages for j in group for _ in range(j.request.n)]
        texts = iter(self.policy.chat(contexts, sampling))
        replies = []
        for job in group:
            choices = [Choice(*self._cut(next(texts), "stop", sampling)) for _ in range(job.request.n)]
            replies.append(Reply([(job.prompt_ids or [None])[0]], choices, sum(self._count(c.text) for c in choices)))
        return replies

    def _choice(self, g, sampling: SamplingParams) -> Choice:
        if sampling.top_logprobs and g.top_logprobs is None:
            raise APIError(400, f"this server's policy ({type(self.policy).__name__}) reports no top_logprobs; "
                                "send top_logprobs=0 (logprobs=0 on /v1/completions)", param="top_logprobs")
        text = g.text if g.text is not None else self.tokenizer.decode(g.ids, skip_special_tokens=True)
        text, reason = self._cut(text, g.finish_reason, sampling)
        return Choice(text, reason, [int(i) for i in g.ids], [float(x) for x in g.logprobs], g.top_logprobs)

    @staticmethod
    def _cut(text: str, reason: str, sampling: SamplingParams) -> tuple[str, str]:
        if sampling.stop_strings:
            cut = cut_at_stop(text, sampling.stop_strings)
            if cut != text:
                return cut, "stop"
        return text, reason

    def _count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False)) if self.tokenizer else 0
