"""`JaxPolicy`: the trainable policy, a model and its params sampled in-process with
`hsjax.policies.sampler`, with KV reuse across turns (`hsjax.policies.kv_reuse`). A token policy
and a chat policy (it renders the chat template itself for `chat`). See docs/rollout.md for the
logprob convention and stop handling.
"""

from __future__ import annotations

import threading
from typing import Sequence

import jax

from hsjax.models import load_pretrained
from hsjax.policies import sampler as sampler_lib
from hsjax.policies.base import ChatPolicy, Generation, SamplingParams, TokenPolicy
from hsjax.policies.kv_reuse import TurnCache
from hsjax.policies.tokens import first_stop_string_end, render_prompt, tokenizer_eos_ids


class JaxPolicy(TokenPolicy, ChatPolicy):
    """The trainable policy: a model, its params and tokenizer, sampled with `hsjax.policies.sampler`.

    Keys. With `turn_seeds` (what the rollout engine passes: one (episode seed, turn) per prompt),
    row i draws from fold_in(fold_in(fold_in(PRNGKey(seed), sampling.seed), episode seed), turn): an
    episode's tokens depend on (seed, phase, episode, turn) only, not on the batch it shares, so a
    step's episodes can be split across processes (multi-host) or batches and sample the same.
    Without, each call draws a fresh key, fold_in(fold_in(PRNGKey(seed), sampling.seed), call
    index), so a run is reproducible from (seed, sampling.seed, call order) (the server's requests).
    """

    def __init__(self, cfg, params, tokenizer, *, seed: int = 0, eos_ids: Sequence[int] | None = None,
                 kv_reuse: bool = True, **sampler_kwargs):
        self.cfg = cfg
        self.max_context = cfg.max_position_embeddings
        self.params = params
        self.tokenizer = tokenizer
        if eos_ids is None:
            eos_ids = tokenizer_eos_ids(tokenizer)
        self.eos_ids = tuple(int(i) for i in eos_ids)
        pad_id = tokenizer.pad_token_id if tokenizer is not None else None
        self.sampler = sampler_lib.Sampler(cfg, eos_ids=self.eos_ids,
                                           pad_id=pad_id if pad_id is not None else 0,
                                           **sampler_kwargs)
        self._seed = seed
        self._calls = 0
        self._lock = threading.Lock()
        # KV reuse across turns (`hsjax.policies.kv_reuse`): seeded calls (the engine's) only; a call
        # without turn seeds (the server's) has no episode to continue.
        self.turn_cache = TurnCache(self.sampler) if kv_reuse else None

    @classmethod
    def from_pretrained(cls, hf_dir: str, **kwargs) -> "JaxPolicy":
        cfg, params, tokenizer = load_pretrained(hf_dir)
        return cls(cfg, params, tokenizer, **kwargs)

    def update_params(self, params) -> None:
        self.params = params
        if self.turn_cache is not None:
            self.turn_cache.clear()  # kept keys/values belong to the old params

    def end_rollout(self) -> None:
        """Drops the caches kept for the next turn: `engine.collect` calls it when its episodes are
        done, so they are not held through the update that follows."""
        if self.turn_cache is not None:
            self.turn_cache.clear()

    def reseed(self, seed: int) -> None:
        """Restarts the key sequence at (seed, call 0): the training loop reseeds every phase, so a
        resumed run draws the same keys as an uninterrupted one."""
        with self._lock:
            self._seed, self._calls = int(seed), 0
        if self.turn_cache is not None:
            self.turn_cache.clear()

    def _next_key(self, sampling: SamplingParams):
        with self._lock:
            call = self._calls
            self._calls += 1
        key = jax.random.fold_in(jax.random.PRNGKey(self._seed), sampling.seed)
        return jax.random.fold_in(key, call)

    def generate(self, prompts: list[list[int]], sampling: SamplingParams,
                 turn_seeds: Sequence[tuple[int, int]] | None = None) -> list[Generation]:
        if not prompts:
            return []
        if turn_seeds is None:
            key = self._next_key(sampling)
        else:
            key = jax.random.fold_in(jax.random.PRNGKey(self._seed), sampling.seed)
        # The canonical tokenization of each stop string is stopped on inside the decode loop; the
        # host-side check below catches every other tokenization of the string.
        string_seqs = [tuple(self.tokenizer.encode(s, add_special_tokens=False))
                       for s in sampling.stop_strings]
        reuse = turn_seeds is not None and self.turn_cache is not None
        if reuse:
            new_prompts, offsets, prefix = self.turn_cache.plan(prompts, turn_seeds)
            outs, kept = self.sampler.generate(
                self.params, new_prompts, sampling, key, stop_sequences=[string_seqs] * len(prompts),
                num_top_logprobs=sampling.top_logprobs, turn_seeds=turn_seeds, prefix=prefix,
                offsets=offsets, keep_cache=True)
        else:
            outs = self.sampler.generate(self.params, prompts, sampling, key,
                                         stop_sequences=[string_seqs] * len(prompts),
                                         num_top_logprobs=sampling.top_logprobs, turn_seeds=turn_seeds)
        gens = []
        for out in outs:
            ids, logprobs, reason = [int(i) for i in out.ids], [float(x) for x in out.logprobs], out.finish_reason
            top = None if out.top_ids is None else [
                [(int(t), float(x)) for t, x in zip(row_ids, row_lp)]
                for row_ids, row_lp in zip(out.top_ids, out.top_logprobs)]
            if sampling.stop_strings:
                cut = first_stop_string_end(ids, sampling.stop_strings, self._decode_all)
                if cut is not None:
                    ids, logprobs, reason = ids[:cut], logprobs[:cut], "stop"
                    top = top[:cut] if top is not None else None
            gens.append(Generation(ids=ids, logprobs=logprobs, text=self.reply_text(ids),
                                   finish_reason=reason, top_logprobs=top))
        if reuse:
            self.turn_cache.record(prompts, turn_seeds, [g.ids for g in gens], kept)
        return gens

    def _decode_all(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def reply_text(self, ids: list[int]) -> str:
        """The reply's text: generated ids decoded, minus a final end-of-turn id."""
        if ids and ids[-1] in self.eos_ids:
            ids = ids[:-1]
        return self._decode_all(ids)

    def chat(self, contexts: list[list[dict]], sampling: SamplingParams,
             infos: list[dict] | None = None) -> list[str]:
        prompts = [render_prompt(self.tokenizer, msgs) for msgs in contexts]
        return [g.text for g in self.generate(prompts, sampling)]
