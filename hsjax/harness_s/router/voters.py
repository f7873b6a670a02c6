"""LLM voters: OpenAI-compatible chat endpoints that rank sibling harnesses for a failed task.

Each voter gets the failed task, a summary of its failed group and the profile cards, and must
answer `{"ranking": ["sib_a", "sib_b", ...]}` (best first). `vote_all` asks every voter at once
(daemon threads: a voter abandoned at the decision deadline never holds up the process's exit),
each call with its own timeout and retries, and never raises: a voter that is slow, fails or talks
nonsense is dropped from that decision and counted under one reason:

    ok             a ranking with at least one known harness name
    cache_hit      (also counted as ok) the same request was answered before; no HTTP call
    timeout        every attempt timed out (or the decision's deadline passed first)
    http_error     HTTP 429/5xx on every attempt, or any other 4xx (not retried)
    connection_error  the server could not be reached on any attempt
    malformed      no JSON ranking could be read from the reply
    too_large      the reply body passed the client's `max_reply_bytes` (4 MiB; not retried)
    unknown_names  a ranking, but none of its names is a candidate
    missing_api_key   the voter's `api_key_env` variable is unset or empty
    error          anything else (a bug surfaced as a count, not a crash)

Each voter talks through the shared `hsjax.llm.client.ChatClient` (with `retry_malformed` off), whose
`LLMError.reason` is the voter's status: transport failures (timeout, 429/5xx, connection) are
retried with exponential backoff (honouring a server's Retry-After up to `max_backoff_s`);
malformed and unknown-name answers are not, since a deterministic voter would repeat them. API keys
are read from the environment at call time and only ever placed in the `Authorization` header;
they are kept out of reprs, logs and details (the client's redaction; a reply is redacted before
it is parsed, so a parse error quoting it cannot leak the key either) and state.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import logging
import math
import queue
import threading
import time
from typing import Sequence

from hsjax.harness_s.router import letter_vote
from hsjax.llm.client import ChatClient, ClientSettings, LLMError
from hsjax.llm.json_extract import find_json

log = logging.getLogger(__name__)

# "ranking": the reply's text must hold a JSON ranking; "logprob": one token is asked for and the
# ranking read from the log-probabilities of the candidates' letters (letter_vote.py).
VOTE_MODES = ("ranking", "logprob")
FAILURE_REASONS = ("timeout", "http_error", "connection_error", "malformed", "too_large", "unknown_names",
                   "missing_api_key", "error")

SYSTEM_PROMPT = (
    "You route failed agent tasks to harness variants. An agent (a language model policy) failed "
    "every attempt at the task below under the base harness. Each candidate harness changes how the "
    "task is presented or how the agent's replies are handled, and its card reports how often it "
    "rescued such failures before. Rank the candidates from most to least likely to let the same "
    "agent succeed. Answer with JSON only, exactly of the form {\"ranking\": [\"name\", ...]}, "
    "using only the candidate names given.")


@dataclasses.dataclass(frozen=True)
class VoterSpec:
    """One voter endpoint (config). `api_key_env` names an environment variable, never the key."""

    name: str
    base_url: str
    model: str
    api_key_env: str | None = None
    weight: float = 1.0
    timeout_s: float = 20.0
    max_retries: int = 2
    backoff_s: float = 0.5
    max_tokens: int = 256
    temperature: float = 0.0
    # Longest wait before a retry, even when the server's Retry-After asks for more: a voter is
    # one opinion among several, not worth holding a decision for.
    max_backoff_s: float = 5.0
    vote_mode: str = "ranking"  # one of VOTE_MODES
    # vote_mode="logprob": ask with the candidates in this many rotations of their order (each a
    # request) and average each candidate's probability over them, so that a model's preference
    # for a letter (small models favour A) does not decide the ranking. 1: the order as given.
    letter_rotations: int = 1

    def __post_init__(self):
        if not self.name:
            raise ValueError("VoterSpec.name must be a non-empty string (it keys stats and caches)")
        if self.vote_mode not in VOTE_MODES:
            raise ValueError(f"VoterSpec {self.name!r}: vote_mode must be one of {VOTE_MODES}, "
                             f"got {self.vote_mode!r}")
        if self.letter_rotations < 1:
            raise ValueError(f"VoterSpec {self.name!r}: letter_rotations must be >= 1, "
                             f"got {self.letter_rotations}")
        if self.timeout_s <= 0 or self.max_retries < 0 or self.weight < 0 or self.max_backoff_s < 0:
            raise ValueError(f"VoterSpec {self.name!r}: timeout_s must be > 0, max_retries >= 0, weight >= 0, "
                             f"max_backoff_s >= 0; got {self.timeout_s}, {self.max_retries}, {self.weight}, "
                             f"{self.max_backoff_s}")

    def client_settings(self) -> ClientSettings:
        return ClientSettings(base_url=self.base_url, model=self.model, api_key_env=self.api_key_env,
                              timeout_s=self.timeout_s, max_retries=self.max_retries, backoff_s=self.backoff_s,
                              max_backoff_s=self.max_backoff_s, retry_malformed=False)


@dataclasses.dataclass(frozen=True)
class VoteRequest:
    """What every voter is asked for one failed group. `task` holds task_id, type and question."""

    task: dict
    group_summary: str
    cards: dict[str, str]
    candidates: tuple[str, ...]

    def messages(self) -> list[dict]:
        cards = "\n\n".join(f"[{name}]\n{self.cards.get(name, '(no profile yet)')}"
                              for name in self.candidates)
        user = (f"Task ({self.task.get('type') or 'unknown type'}, id {self.task.get('task_id')}):\n"
                f"{self.task.get('question') or '(question not available)'}\n\n"
                f"Failed group under the base harness:\n{self.group_summary}\n\n"
                f"Candidate harnesses:\n{cards}\n\n"
                f"Candidates: {json.dumps(list(self.candidates))}\n"
                "Reply with {\"ranking\": [...]} listing candidate names, best first.")
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]

    def content_hash(self) -> str:
        blob = json.dumps({"messages": self.messages(), "candidates": list(self.candidates)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()


@dataclasses.dataclass
class VoteResult:
    voter: str
    status: str  # "ok" or one of FAILURE_REASONS
    ranking: list[str] = dataclasses.field(default_factory=list)
    attempts: int = 0
    latency_s: float = 0.0
    detail: str = ""
    cached: bool = False


@dataclasses.dataclass
class VoteOutcome:
    """The answers to one request: rankings of the voters that answered, reasons of those that did not."""

    rankings: dict[str, list[str]]
    failures: dict[str, str]
    counters: dict[str, int]
    latency_s: float
    results: dict[str, VoteResult]


class VoteError(ValueError):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


# ---------------------------------------------------------------------------------------------
# Parsing


def parse_ranking(text: str, candidates: Sequence[str]) -> list[str]:
    """The known harness names of a voter's reply, best first, without duplicates.

    Accepts `{"ranking": [...]}` anywhere in the text, or a bare list of names as the whole reply
    or a whole code fence. Unknown names are
    dropped; names match exactly, then ignoring case and surrounding space. Raises `VoteError` with
    reason `malformed` (no ranking found) or `unknown_names` (no name is a candidate).
    """
    ranking = find_json(text, _ranking_of)
    if ranking is None:
        raise VoteError("malformed", f"no JSON ranking in the reply: {text[:200]!r}")
    exact = set(candidates)
    folded = {c.strip().lower(): c for c in candidates}
    out = []
    for item in ranking:
        if not isinstance(item, str):
            continue
        name = item if item in exact else folded.get(item.strip().lower())
        if name is not None and name not in out:
            out.append(name)
    if not out:
        raise VoteError("unknown_names", f"no candidate among the ranked names {ranking[:10]!r}")
    return out


def letter_scores_of(response, candidates: Sequence[str]) -> dict[str, float]:
    """candidate -> log-probability of its letter as the reply's first token (letter_vote.py);
    `VoteError` `malformed` when the reply has no logprobs or none of its likeliest first tokens
    is a candidate's letter."""
    alternatives = letter_vote.first_token_alternatives(response)
    if alternatives is None:
        raise VoteError("malformed", "the reply carries no token logprobs (does the server return them?)")
    scores = letter_vote.letter_scores(alternatives, candidates)
    if not scores:
        seen = [token for token, _ in alternatives[:5]]
        raise VoteError("malformed", f"no candidate letter among the first token's alternatives {seen!r}")
    return scores


def _ranking_of(value, whole: bool) -> list | None:
    """The ranking a JSON value holds: `{"ranking": [...]}` anywhere, a non-empty list of strings
    only as the whole reply or a whole fence."""
    if isinstance(value, dict) and isinstance(value.get("ranking"), list):
        return value["ranking"]
    if whole and isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return value
    return None


# ---------------------------------------------------------------------------------------------
# One voter


class LLMVoter:
    """One OpenAI-compatible endpoint. Thread-safe; `vote` never raises."""

    def __init__(self, spec: VoterSpec):
        self.spec = spec
        self.url = spec.base_url.rstrip("/") + "/chat/completions"
        self.client = ChatClient(spec.client_settings(), label=f"voter {spec.name}")

    @property
    def name(self) -> str:
        return self.spec.name

    def __repr__(self):
        return (f"LLMVoter(name={self.spec.name!r}, url={self.url!r}, model={self.spec.model!r}, "
                f"api_key_env={self.spec.api_key_env!r})")

    def close(self):
        self.client.close()

    def vote(self, request: VoteRequest) -> VoteResult:
        start = time.monotonic()
        try:
            result = self._vote(request)
        except Exception as e:  # a voter must never crash training
            result = VoteResult(self.name, "error", detail=self.client.redact(f"{type(e).__name__}: {e}"))
        result.latency_s = time.monotonic() - start
        return result

    def _vote(self, request: VoteRequest) -> VoteResult:
        if self.spec.vote_mode == "logprob":
            return self._vote_by_letters(request)
        try:
            reply = self.client.complete(request.messages(), temperature=self.spec.temperature,
                                         max_tokens=self.spec.max_tokens)
        except LLMError as e:  # its reasons are voter statuses (FAILURE_REASONS)
            return VoteResult(self.name, e.reason, attempts=e.attempts, detail=e.detail)
        try:
            ranking = parse_ranking(self.client.redact(reply.text), request.candidates)
        except VoteError as e:
            return VoteResult(self.name, e.reason, attempts=reply.attempts, detail=str(e))
        return VoteResult(self.name, "ok", ranking, attempts=reply.attempts)

    def _vote_by_letters(self, request: VoteRequest) -> VoteResult:
        """One single-token request per rotation of the candidates' order; each candidate's
        probability averaged over the rotations (0 where its letter was not among the top tokens)."""
        candidates, attempts = list(request.candidates), 0
        probabilities = dict.fromkeys(candidates, 0.0)
        asked = {"logprobs": True, "top_logprobs": letter_vote.TOP_LOGPROBS}
        rotations = min(self.spec.letter_rotations, len(candidates))
        for r in range(rotations):
            order = candidates[r:] + candidates[:r]
            messages = letter_vote.letter_messages(request.task, request.group_summary, request.cards, order)
            try:
                reply = self.client.complete(messages, temperature=self.spec.temperature, max_tokens=1,
                                             extra_body=asked)
            except LLMError as e:
                return VoteResult(self.name, e.reason, attempts=attempts + e.attempts, detail=e.detail)
            attempts += reply.attempts
            try:
                scores = letter_scores_of(reply.response, order)
            except VoteError as e:
                return VoteResult(self.name, e.reason, attempts=attempts, detail=self.client.redact(str(e)))
            for name, logprob in scores.items():
                probabilities[name] += math.exp(logprob) / rotations
        seen = {name: math.log(p) for name, p in probabilities.items() if p > 0}
        ranking = letter_vote.ranking_from_scores(seen, candidates)
        return VoteResult(self.name, "ok", ranking, attempts=attempts)


# ---------------------------------------------------------------------------------------------
# Cache and the panel call


class VoteCache:
    """Successful rankings by (voter, request hash); least recently used entries go first.
    Failures are not cached, so a voter that failed is asked again next time."""

    def __init__(self, max_entries: int = 4096):
        self.max_entries = max_entries
        self._data: collections.OrderedDict[tuple[str, str], list[str]] = collections.OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(voter: LLMVoter, request_hash: str) -> tuple[str, str]:
        spec = voter.spec
        return (f"{spec.name}|{spec.base_url}|{spec.model}", request_hash)

    def get(self, key):
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                return list(self._data[key])
        return None

    def put(self, key, ranking: list[str]) -> None:
        with self._lock:
            self._data[key] = list(ranking)
            self._data.move_to_end(key)
            while len(self._data) > self.max_entries:
                self._data.popitem(last=False)

    def __len__(self):
        return len(self._data)


def default_deadline_s(specs) -> float:
    """The default decision deadline for these voters: one second more than the slowest one's
    `ClientSettings.worst_case_s`."""
    return 1.0 + max(spec.client_settings().worst_case_s for spec in specs)


def vote_all(voters: Sequence[LLMVoter], request: VoteRequest, *, cache: VoteCache | None = None,
             deadline_s: float | None = None) -> VoteOutcome:
    """Asks every voter concurrently; returns rankings and failure reasons, never raises.

    `deadline_s` bounds the whole decision: voters still running then count as `timeout` (their
    daemon threads run out their own bound in the background, are ignored, and never delay the
    process's exit). By default the deadline is one second more than the slowest voter's worst
    case, `ClientSettings.worst_case_s` (every attempt times out, every wait is the capped
    Retry-After), so a voter that answers at all answers in time.
    """
    start = time.monotonic()
    names = [v.name for v in voters]
    if len(set(names)) != len(names):
        raise ValueError(f"voter names must be unique, got {names}")
    results: dict[str, VoteResult] = {}
    todo = []
    request_hash = request.content_hash() if cache is not None else ""
    for v in voters:
        hit = cache.get(VoteCache.key(v, request_hash)) if cache is not None else None
        if hit is not None:
            results[v.name] = VoteResult(v.name, "ok", hit, cached=True)
        else:
            todo.append(v)
    if todo:
        if deadline_s is None:
            deadline_s = default_deadline_s(v.spec for v in todo)
        answers: queue.Queue = queue.Queue()
        for v in todo:  # daemon threads: ThreadPoolExecutor's workers are joined at interpreter exit
            threading.Thread(target=lambda v=v: answers.put((v, v.vote(request))), name=f"voter-{v.name}",
                             daemon=True).start()
        end = start + deadline_s
        for _ in todo:
            try:
                v, result = answers.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                break
            results[v.name] = result
            if result.status == "ok" and cache is not None:
                cache.put(VoteCache.key(v, request_hash), result.ranking)
        for v in todo:
            if v.name not in results:
                results[v.name] = VoteResult(v.name, "timeout", detail=f"decision deadline {deadline_s:.2f}s passed")
    counters: dict[str, int] = collections.Counter()
    rankings, failures = {}, {}
    for name in names:  # voter order, so outcomes do not depend on thread timing
        r = results[name]
        counters[r.status] += 1
        if r.cached:
            counters["cache_hit"] += 1
        if r.status == "ok":
            rankings[name] = r.ranking
        else:
            failures[name] = r.status
            log.info("voter %s dropped from this decision: %s (%s)", name, r.status, r.detail)
    return VoteOutcome(rankings, failures, dict(counters), time.monotonic() - start, results)
