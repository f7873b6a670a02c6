"""The OpenAI wire format as the server speaks it: request validation and errors in OpenAI's shape
(`{"error": {"message", "type", "param", "code"}}`); `hsjax.llm.openai_replies` builds the replies.

Two endpoints: chat completions (`messages`) and completions (`prompt`: a string, a list of token
ids, or a list of either). Besides OpenAI's fields the server takes vLLM's extensions that a
token-exact client needs: `top_k`, `return_token_ids` (the reply carries `prompt_token_ids` and
each choice its `token_ids`, as vLLM >= 0.10.2 names them) and `return_tokens_as_token_ids`
(logprob entries name tokens as "token_id:<id>"). A field the server does not act on is refused
with a 400 naming it (`tools`, `response_format`, penalties, ...), never silently ignored; a few
are accepted at the value that changes nothing (`NEUTRAL`), and `user` and `metadata` are accepted
and ignored (they only label a request).

Token ids and logprobs: a choice's `token_ids` are every generated id, the end-of-turn id and the
ids of a stop string included (what the policy sampled, and what a trainer needs), while its text
leaves both out. Each logprob is the sampler's: `log_softmax(logits / T)` at the request's
temperature (1 when greedy), before top-k/top-p truncation (hsjax/policies/sampler.py).
"""
from __future__ import annotations

import dataclasses
import reprlib

from hsjax.policies.base import SamplingParams

ROLES = ("system", "user", "assistant")
# Each new set of stop strings can compile a new sampler program (its shape is their count and
# length in tokens, in powers of two), which blocks the only worker: both are bounded.
MAX_STOP_STRINGS = 8
MAX_STOP_CHARS = 64
MAX_TOP_LOGPROBS = 20  # as OpenAI (and vLLM's default max_logprobs)
# A prompt's characters are bounded before it is tokenized (tokenizing costs memory and time in
# proportion to its length, and the context bound in tokens is checked only after): at most this
# many characters per token of the context. Tokenizers of the supported families average 3-5
# characters a token on English and code; only text averaging more than 8 (long runs of one
# character) is refused that the token bound would have taken.
CHARS_PER_TOKEN_BOUND = 8
MAX_PROMPT_CHARS = 1 << 20  # the character bound when the context length is unknown (a chat policy)
# A logprob that is not finite is sent as this (JSON has no -inf), as vLLM does.
FLOOR_LOGPROB = -9999.0

SAMPLING_FIELDS = ("model", "temperature", "top_p", "top_k", "max_tokens", "seed", "stop", "n", "stream",
                   "stream_options", "return_token_ids", "return_tokens_as_token_ids")
CHAT_FIELDS = (*SAMPLING_FIELDS, "messages", "max_completion_tokens", "logprobs", "top_logprobs")
COMPLETION_FIELDS = (*SAMPLING_FIELDS, "prompt", "logprobs", "best_of")
IGNORED_FIELDS = ("user", "metadata")
# Fields accepted only at a value that changes nothing (None always passes).
NEUTRAL = {
    "presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0), "repetition_penalty": (1, 1.0),
    "min_p": (0, 0.0), "logit_bias": ({},), "tool_choice": ("none",), "tools": ([],), "functions": ([],),
    "parallel_tool_calls": (True, False), "response_format": ({"type": "text"},), "store": (False,),
    "echo": (False,), "suffix": ("",), "min_tokens": (0,), "ignore_eos": (False,),
    "include_stop_str_in_output": (False,), "skip_special_tokens": (True,), "add_generation_prompt": (True,),
    "continue_final_message": (False,), "modalities": (["text"],),
}


class APIError(Exception):
    """An error answered in OpenAI's error shape with an HTTP status."""

    def __init__(self, status: int, message: str, *, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers  # sent with the error (e.g. Retry-After)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


_SHORT = reprlib.Repr()  # (keyword arguments only from Python 3.12)
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother, _SHORT.maxlong = 2, 60, 60, 40
_SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxdict = _SHORT.maxset = 4


def short(value) -> str:
    """A value as an error message quotes it: at most ~100 characters, never the whole of a large one."""
    return _SHORT.repr(value)


def default_prompt_chars(max_context: int | None) -> int:
    """The prompt's character bound when `serve.max_prompt_chars` is 0 (see CHARS_PER_TOKEN_BOUND)."""
    return CHARS_PER_TOKEN_BOUND * max_context if max_context else MAX_PROMPT_CHARS


def check_prompt_chars(chars: int, max_chars: int | None, param: str, what: str) -> None:
    if max_chars is not None and chars > max_chars:
        raise bad_request(f"{what} has {chars} characters, more than the {max_chars} this server tokenizes "
                          "(serve.max_prompt_chars); shorten the prompt", param, "context_length_exceeded")


# ---------------------------------------------------------------------------------------------
# Request parsing (pure)


@dataclasses.dataclass(frozen=True)
class GenerateRequest:
    """A validated request of either endpoint.

    `messages` (chat) or `prompts` (completions: token-id lists, or strings the worker tokenizes);
    `n` choices per prompt; `logprobs` asks for per-token logprobs and `sampling.top_logprobs` for
    that many alternatives; `return_token_ids` and `tokens_as_ids` are vLLM's extensions."""

    kind: str  # "chat" | "completion"
    sampling: SamplingParams
    messages: list[dict] | None = None
    prompts: tuple[str | tuple[int, ...], ...] | None = None
    n: int = 1
    logprobs: bool = False
    return_token_ids: bool = False
    tokens_as_ids: bool = False
    stream: bool = False
    include_usage: bool = False

    @property
    def rows(self) -> int:
        """Sequences one generate call samples for it: its prompts times n."""
        return (len(self.prompts) if self.prompts is not None else 1) * self.n

    @property
    def needs_ids(self) -> bool:
        """Whether only a token policy (ids in, ids out) can answer it."""
        return self.kind == "completion" or self.logprobs or self.return_token_ids


def _number(body: dict, name: str, default: float, lo: float, hi: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise bad_request(f"'{name}' must be a number in [{lo}, {hi}], got {short(value)}", name)
    return float(value)


def _int(body: dict, name: str, default: int, lo: int, hi: int) -> int:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise bad_request(f"'{name}' must be an integer in [{lo}, {hi}], got {short(value)}", name)
    return value


def _bool(body: dict, name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad_request(f"'{name}' must be true or false, got {short(value)}", name)
    return value


def _content(message: dict, i: int) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    # OpenAI's list of content parts; only text parts can be rendered by a chat template.
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise bad_request(f"messages[{i}].content must be a string or a list of text parts, got "
                      f"{type(content).__name__}", f"messages[{i}].content")


def parse_messages(messages, max_chars: int | None = None) -> list[dict]:
    """The messages as {role, content}; their contents together at most `max_chars` characters."""
    if messages is None:
        raise bad_request("'messages' is required: a non-empty list of {role, content}", "messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list of {role, content}", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise bad_request(f"messages[{i}] must be an object with role and content", f"messages[{i}]")
        role = m.get("role")
        if role not in ROLES:
            raise bad_request(f"messages[{i}].role={short(role)} is not one of {list(ROLES)}",
                              f"messages[{i}].role")
        extra = sorted(set(m) - {"role", "content", "name"})
        if extra:
            raise bad_request(f"messages[{i}] has {short(extra)}: this server renders only role and content (no tool "
                              "calls or tool messages)", f"messages[{i}].{extra[0]}")
        out.append({"role": role, "content": _content(m, i)})
    check_prompt_chars(sum(len(m["content"]) for m in out), max_chars, "messages", "the conversation")
    return out


def check_fields(body: dict, accepted: tuple[str, ...]) -> None:
    """400 for a field this endpoint does not act on (at a value that would change the reply)."""
    for name, value in body.items():
        if name in accepted or name in IGNORED_FIELDS or value is None:
            continue
        if name in NEUTRAL:
            if any(type(value) is type(v) and value == v for v in NEUTRAL[name]):
                continue
            raise bad_request(f"'{name}'={short(value)} is not supported by this server: it would change the "
                              f"reply and the server does not implement it; leave it out (neutral values: "
                              f"{list(NEUTRAL[name])})", name, "unsupported_parameter")
        raise bad_request(f"{short(name)} is not supported by this server; it takes {sorted(accepted)} (and "
                          f"{sorted(IGNORED_FIELDS)}, ignored)", name, "unsupported_parameter")


def _parse_sampling(body: dict, *, model_name: str, default_max_tokens: int, max_tokens_limit: int,
                    max_stop_strings: int, max_stop_chars: int, max_rows: int, prompts: int,
                    top_logprobs: int) -> tuple[SamplingParams, int]:
    model = body.get("model")
    if model is not None and model != model_name:
        raise APIError(404, f"model {short(model)} is not served here; this server serves {model_name!r}",
                       param="model", code="model_not_found")
    n = _int(body, "n", 1, 1, 1 << 30)
    if prompts * n > max_rows:
        raise bad_request(f"{prompts} prompts x n={n} choices is more than the {max_rows} sequences this server "
                          "samples at once (serve.max_batch); send fewer", "n")
    best_of = body.get("best_of")
    if best_of is not None and best_of != n and best_of != 1:
        raise bad_request(f"best_of={short(best_of)} is not supported; leave it out (or equal to n)", "best_of",
                          "unsupported_parameter")
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0.0:
        raise bad_request("top_p must be > 0; use temperature=0 for greedy decoding", "top_p")
    top_k = _int(body, "top_k", 0, -1, 1 << 30)  # -1: off, as vLLM
    max_key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _int(body, max_key, default_max_tokens, 1, max_tokens_limit)
    seed = _int(body, "seed", 0, -(1 << 63), (1 << 63) - 1)
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise bad_request(f"'stop' must be a non-empty string or a list of them, got {short(stop)}", "stop")
    if len(stop) > max_stop_strings:
        raise bad_request(f"'stop' holds {len(stop)} strings; this server takes at most {max_stop_strings}", "stop")
    if max(map(len, stop), default=0) > max_stop_chars:
        raise bad_request(f"a stop string has {max(map(len, stop))} characters; this server takes at most "
                          f"{max_stop_chars} per string", "stop")
    greedy = temperature == 0.0
    if greedy:  # settings that do not change a greedy reply, normalized so greedy requests batch
        temperature, top_p, top_k, seed = 1.0, 1.0, 0, 0
    sampling = SamplingParams(temperature=temperature, top_p=top_p, top_k=max(top_k, 0), greedy=greedy,
                              max_new_tokens=max_tokens, stop_strings=tuple(stop), seed=seed % (1 << 32),
                              top_logprobs=top_logprobs)
    return sampling, n


def _stream_options(body: dict) -> tuple[bool, bool]:
    stream = _bool(body, "stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not stream:
        raise bad_request("'stream_options' is only for stream=true", "stream_options")
    if not isinstance(options, dict) or set(options) - {"include_usage", "continuous_usage_stats"}:
        raise bad_request(f"'stream_options' takes {{include_usage}}, got {short(options)}", "stream_options")
    if options.get("continuous_usage_stats"):
        raise bad_request("stream_options.continuous_usage_stats is not supported", "stream_options")
    return stream, bool(options.get("include_usage"))


def parse_chat_request(body, *, model_name: str, default_max_tokens: int, max_tokens_limit: int,
                       max_stop_strings: int = MAX_STOP_STRINGS, max_stop_chars: int = MAX_STOP_CHARS,
                       max_rows: int = 8, max_prompt_chars: int | None = None) -> GenerateRequest:
    """Validates a chat-completions body; raises `APIError` naming the offending field.

    Temperature 0 means greedy decoding. `max_tokens` (or `max_completion_tokens`) defaults to
    `default_max_tokens`. `stop` holds at most `max_stop_strings` strings of at most `max_stop_chars`
    characters each. `n` choices (at most `max_rows`); `logprobs` true with `top_logprobs` 0-20. The
    messages' contents hold at most `max_prompt_chars` characters together (None: no bound).
    """
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    check_fields(body, CHAT_FIELDS)
    messages = parse_messages(body.get("messages"), max_prompt_chars)
    logprobs = _bool(body, "logprobs")
    top = _int(body, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS)
    if top and not logprobs:
        raise bad_request("top_logprobs needs logprobs=true", "top_logprobs")
    sampling, n = _parse_sampling(body, model_name=model_name, default_max_tokens=default_max_tokens,
                                  max_tokens_limit=max_tokens_limit, max_stop_strings=max_stop_strings,
                                  max_stop_chars=max_stop_chars, max_rows=max_rows, prompts=1, top_logprobs=top)
    stream, usage = _stream_options(body)
    return GenerateRequest("chat", sampling, messages=messages, n=n, logprobs=logprobs,
                           return_token_ids=_bool(body, "return_token_ids"),
                           tokens_as_ids=_bool(body, "return_tokens_as_token_ids"), stream=stream,
                           include_usage=usage)


def _check_prompt_sizes(prompt, max_prompts: int, max_tokens: int | None) -> None:
    """Too many prompts, or a token-id prompt longer than the context, are refused before each prompt
    and id is looked at (and before the request waits in the queue for the worker's context check)."""
    if not isinstance(prompt, list) or not prompt:
        return
    many = isinstance(prompt[0], (list, str))
    if many and len(prompt) > max_prompts:
        raise bad_request(f"'prompt' holds {len(prompt)} prompts, more than the {max_prompts} sequences this server "
                          "samples at once (serve.max_batch); send fewer", "prompt")
    for i, p in enumerate(prompt if many else [prompt]):
        if max_tokens is not None and isinstance(p, list) and len(p) > max_tokens:
            raise bad_request(f"prompt {i} has {len(p)} token ids, more than the context limit {max_tokens}; "
                              "shorten it", "prompt", "context_length_exceeded")


def _parse_prompts(prompt, max_chars: int | None = None) -> tuple[str | tuple[int, ...], ...]:
    """`prompt` as a tuple of prompts: a string (at most `max_chars` characters), a list of token ids,
    or a list of either."""
    def token_list(value) -> bool:
        return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)

    if isinstance(prompt, str) or token_list(prompt):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) or token_list(p) for p in prompt):
        prompts = prompt
    else:
        raise bad_request("'prompt' must be a string, a list of token ids, or a non-empty list of either",
                          "prompt")
    for i, p in enumerate(prompts):
        if not p:
            raise bad_request(f"prompt {i} is empty; every prompt needs at least one token", "prompt")
        if isinstance(p, str):
            check_prompt_chars(len(p), max_chars, "prompt", f"prompt {i}")
    return tuple(p if isinstance(p, str) else tuple(p) for p in prompts)


def parse_completion_request(body, *, model_name: str, default_max_tokens: int, max_tokens_limit: int,
                             max_stop_strings: int = MAX_STOP_STRINGS, max_stop_chars: int = MAX_STOP_CHARS,
                             max_rows: int = 8, max_prompt_chars: int | None = None,
                             max_prompt_tokens: int | None = None) -> GenerateRequest:
    """Validates a completions body (`prompt` and the sampling fields; `logprobs` an integer 0-20,
    the number of alternatives per token, as OpenAI's legacy endpoint; a text prompt at most
    `max_prompt_chars` characters, a token-id prompt at most `max_prompt_tokens` ids)."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    check_fields(body, COMPLETION_FIELDS)
    if body.get("prompt") is None:
        raise bad_request("'prompt' is required: a string or a list of token ids", "prompt")
    _check_prompt_sizes(body["prompt"], max_rows, max_prompt_tokens)
    prompts = _parse_prompts(body["prompt"], max_prompt_chars)
    logprobs = body.get("logprobs")
    if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int)
                                 or not 0 <= logprobs <= MAX_TOP_LOGPROBS):
        raise bad_request(f"'logprobs' must be an integer in [0, {MAX_TOP_LOGPROBS}] (the alternatives per token), "
                          f"got {short(logprobs)}", "logprobs")
    sampling, n = _parse_sampling(body, model_name=model_name, default_max_tokens=default_max_tokens,
                                  max_tokens_limit=max_tokens_limit, max_stop_strings=max_stop_strings,
                                  max_stop_chars=max_stop_chars, max_rows=max_rows, prompts=len(prompts),
                                  top_logprobs=logprobs or 0)
    stream, usage = _stream_options(body)
    return GenerateRequest("completion", sampling, prompts=prompts, n=n, logprobs=logprobs is not None,
                           return_token_ids=_bool(body, "return_token_ids"),
                           tokens_as_ids=_bool(body, "return_tokens_as_token_ids"), stream=stream,
                           include_usage=usage)


def cut_at_stop(text: str, stop_strings) -> str:
    """The text before the first stop string (OpenAI leaves the stop string out of the reply)."""
    cuts = [i for i in (text.find(s) for s in stop_strings) if i >= 0]
    return text[:min(cuts)] if cuts else text
