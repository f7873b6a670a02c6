"""`HttpTokenPolicy`: a TokenPolicy (token ids in, token ids and logprobs out) backed by a
vLLM-compatible server's `/v1/completions`; retries, timeouts, the circuit breaker and `on_error`
are `hsjax.policies.http_chat.HttpChatPolicy`'s.

`HttpTokenPolicy` sends each prompt as token ids (`prompt: [ids]`) and asks for `return_token_ids`,
`return_tokens_as_token_ids` and `logprobs` (vLLM >= 0.10.2's fields, which `hsjax serve` speaks
too): its `Generation`s carry the ids the server sampled and the logprob of each, so the rollout
engine records token-exact segments, as with the in-process JAX policy. The prompt is rendered
with the client's `tokenizer` (the engine does it), so the server's own tokenizer never touches
it; the reply text is decoded from the ids with the same tokenizer. The logprobs are whatever the
server computes: `hsjax serve` gives the sampler's (at the request's temperature, before top-k/top-p);
vLLM gives the raw model's by default (`--logprobs-mode`), see docs/rollout.md.
"""
from __future__ import annotations

import concurrent.futures
import logging

from hsjax.llm.client import LLMError
from hsjax.policies.base import EndpointDown, FailedReply, Generation, PolicyError, SamplingParams, TokenPolicy
from hsjax.policies.http_chat import HttpChatPolicy, request_params

log = logging.getLogger(__name__)


class HttpTokenPolicy(HttpChatPolicy, TokenPolicy):
    """A token policy (`generate(prompts, sampling)`: ids in, ids and logprobs out) backed by a
    vLLM-compatible server's `POST {base_url}/completions` (module docstring). `tokenizer` must be
    the served model's (the engine renders prompts with it and decodes the replies). Retries,
    timeouts, the breaker and `on_error` are `HttpChatPolicy`'s; it still answers `chat` too."""

    def __init__(self, base_url: str, model: str, tokenizer, api_key_env: str | None = None, **kwargs):
        super().__init__(base_url, model, api_key_env, **kwargs)
        self.tokenizer = tokenizer
        self.url = base_url.rstrip("/") + "/completions"

    def __repr__(self):
        return f"HttpTokenPolicy(url={self.url!r}, model={self.model!r})"

    def complete_ids(self, prompt: list[int], sampling: SamplingParams) -> Generation:
        """One completion of `prompt` with retries: a `Generation` with the server's ids and
        logprobs (text None: the engine decodes the ids), or `PolicyError`."""
        if self._down is not None:
            raise EndpointDown(self._down)
        params = request_params(sampling, self.extra_body)
        try:
            result = self.client.complete_tokens(prompt, top_logprobs=sampling.top_logprobs, **params)
        except LLMError as e:
            self._failed(e.detail)
            raise PolicyError(f"HttpTokenPolicy {self.url}: {e.detail}") from None
        with self._lock:
            self.consecutive_failures = 0
        ids, logprobs, top, reason = result.ids, result.logprobs, result.top_logprobs, result.finish_reason
        if len(ids) > sampling.max_new_tokens:  # a server that ignores max_tokens
            with self._lock:
                self.truncated_replies += 1
            log.warning("HttpTokenPolicy %s: %d ids for max_tokens=%d; cut (the server may ignore max_tokens)",
                        self.url, len(ids), sampling.max_new_tokens)
            cut = sampling.max_new_tokens
            ids, logprobs, top, reason = ids[:cut], logprobs[:cut], top[:cut] if top else top, "length"
        return Generation(ids=ids, logprobs=logprobs, text=None, finish_reason=reason, top_logprobs=top)

    def _generation(self, prompt: list[int], sampling: SamplingParams) -> Generation | FailedReply:
        try:
            return self.complete_ids(prompt, sampling)
        except EndpointDown:
            raise
        except PolicyError as e:
            if self.on_error == "raise":
                raise
            return FailedReply(str(e))

    def generate(self, prompts: list[list[int]], sampling: SamplingParams,
                 turn_seeds=None) -> list[Generation | FailedReply]:
        """The server's replies to `prompts`; turn seeds are ignored (the server draws its own)."""
        if len(prompts) <= 1 or self.max_concurrency <= 1:
            return [self._generation(p, sampling) for p in prompts]
        workers = min(self.max_concurrency, len(prompts))
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            return list(pool.map(lambda p: self._generation(p, sampling), prompts))
