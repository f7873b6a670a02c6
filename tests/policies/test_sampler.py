"""The jit KV-cache sampler: parity with transformers, logprob convention, stops, buckets."""
import dataclasses

import jax
import numpy as np
import pytest

from hsjax.models import forward, get_preset, init_params, load_pretrained
from hsjax.models.tokenizer import build_tiny_tokenizer
from hsjax.policies import sampler as sampler_lib
from hsjax.policies.base import SamplingParams
from hsjax.policies.jax_policy import JaxPolicy
from hsjax.policies.sampler import Sampler


# ---------------------------------------------------------------------------------- fixtures


# Most tests use batches of 4 and at most 16 new tokens: one compiled program serves them all.
TINY_CFG = get_preset("tiny")


@pytest.fixture(scope="module")
def tiny():
    tokenizer = build_tiny_tokenizer()
    assert len(tokenizer) <= TINY_CFG.vocab_size
    params = jax.jit(init_params, static_argnums=0)(TINY_CFG, jax.random.PRNGKey(0))
    return TINY_CFG, params, tokenizer


@pytest.fixture(scope="module")
def tiny_sampler(tiny):
    cfg, _, _ = tiny
    return Sampler(cfg, eos_ids=())


def _prompts(vocab, lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab, size=n).tolist() for n in lengths]


@jax.jit
def _logp_table(params, tokens_1xT, positions_1xT, temperature):
    logits, _ = forward(TINY_CFG, params, tokens_1xT, positions_1xT)
    return jax.nn.log_softmax(logits[0] / temperature, axis=-1)


def _recomputed_logprobs(params, prompt, ids, temperature, length=64):
    """Trainer-side logprobs of `ids` after `prompt` (one padded shape, so one compilation)."""
    seq = list(prompt) + list(ids)
    tokens = np.zeros((1, length), np.int32)
    positions = np.full((1, length), -1, np.int32)
    tokens[0, :len(seq)], positions[0, :len(seq)] = seq, np.arange(len(seq))
    logp = np.asarray(_logp_table(params, tokens, positions, np.float32(temperature)))
    start = len(prompt) - 1
    return logp[start:start + len(ids)][np.arange(len(ids)), np.asarray(ids)]


# ------------------------------------------------------------------------ transformers parity


def _hf_checkpoint(family, tmp_path):
    torch = pytest.importorskip("torch")
    import transformers

    config_cls = {"qwen2": transformers.Qwen2Config, "llama": transformers.LlamaConfig,
                  "qwen3": transformers.Qwen3Config}[family]
    extra = {"head_dim": 24, "tie_word_embeddings": True} if family == "qwen3" else {}
    config = config_cls(**{"vocab_size": 211, "hidden_size": 64, "intermediate_size": 128,
                           "num_hidden_layers": 2, "num_attention_heads": 4,
                           "num_key_value_heads": 2, "max_position_embeddings": 512,
                           "tie_word_embeddings": False, "bos_token_id": None,
                           "eos_token_id": None, "pad_token_id": 0, **extra})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # weights large enough that greedy choices are far from ties
        for name, p in model.named_parameters():
            scale = 0.2 if name.endswith("norm.weight") else 0.1
            base = 1.0 if name.endswith("norm.weight") else 0.0
            p.copy_(base + scale * torch.randn(p.shape, generator=gen))
    model.save_pretrained(tmp_path)
    return model


@pytest.mark.parametrize("family", ["qwen2", "llama", "qwen3"])
def test_greedy_matches_transformers_generate_on_uneven_batch(family, tmp_path):
    import torch

    hf_model = _hf_checkpoint(family, tmp_path)
    cfg, params, _ = load_pretrained(tmp_path, tokenizer=False)
    prompts = _prompts(cfg.vocab_size, [5, 17, 1, 9], seed=3)
    new = 12
    outs = Sampler(cfg).generate(params, prompts, SamplingParams(greedy=True, max_new_tokens=new),
                                 jax.random.PRNGKey(0))
    for prompt, out in zip(prompts, outs):
        with torch.no_grad():
            ref = hf_model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt),
                                    dtype=torch.long), max_new_tokens=new, min_new_tokens=new,
                                    do_sample=False, pad_token_id=0)
        assert out.ids.tolist() == ref[0, len(prompt):].tolist()
        assert out.finish_reason == "length"


# --------------------------------------------------------------------- sampling and logprobs


def test_logprobs_are_log_softmax_at_temperature_before_truncation(tiny, tiny_sampler):
    cfg, params, _ = tiny
    prompts = _prompts(cfg.vocab_size, [4, 11, 7, 1])
    for sp in [SamplingParams(temperature=0.7, max_new_tokens=10),
               SamplingParams(temperature=1.3, top_p=0.8, top_k=20, max_new_tokens=10),
               SamplingParams(greedy=True, temperature=0.3, max_new_tokens=10)]:
        outs = tiny_sampler.generate(params, prompts, sp, jax.random.PRNGKey(5))
        for prompt, out in zip(prompts, outs):
            assert len(out.ids) == 10 and out.logprobs.dtype == np.float32
            ref = _recomputed_logprobs(params, prompt, out.ids, sp.logprob_temperature)
            np.testing.assert_allclose(out.logprobs, ref, atol=1e-4)


def test_top_k_1_and_tiny_top_p_reproduce_greedy(tiny, tiny_sampler):
    cfg, params, _ = tiny
    prompts = _prompts(cfg.vocab_size, [6, 3, 20, 9])
    greedy = tiny_sampler.generate(params, prompts, SamplingParams(greedy=True, max_new_tokens=8),
                                   jax.random.PRNGKey(0))
    for sp in [SamplingParams(top_k=1, temperature=2.0, max_new_tokens=8),
               SamplingParams(top_p=1e-4, temperature=2.0, max_new_tokens=8)]:
        outs = tiny_sampler.generate(params, prompts, sp, jax.random.PRNGKey(9))
        assert [o.ids.tolist() for o in outs] == [g.ids.tolist() for g in greedy]


def test_top_k_samples_stay_in_top_k(tiny, tiny_sampler):
    cfg, params, _ = tiny
    prompt = _prompts(cfg.vocab_size, [5])[0]
    tokens = np.zeros((1, 64), np.int32)
    positions = np.full((1, 64), -1, np.int32)
    tokens[0, :5], positions[0, :5] = prompt, np.arange(5)
    next_logp = np.asarray(_logp_table(params, tokens, positions, np.float32(1.0)))[4]
    top3 = set(np.argsort(-next_logp)[:3].tolist())
    sp = SamplingParams(top_k=3, temperature=5.0, max_new_tokens=1)
    firsts = {int(o.ids[0]) for s in range(3)
              for o in tiny_sampler.generate(params, [prompt] * 4, sp, jax.random.PRNGKey(s))}
    assert firsts <= top3 and len(firsts) > 1


def test_deterministic_for_a_key_and_different_across_keys(tiny, tiny_sampler):
    cfg, params, _ = tiny
    prompts = _prompts(cfg.vocab_size, [4, 9, 1, 3])
    sp = SamplingParams(max_new_tokens=16)
    a = tiny_sampler.generate(params, prompts, sp, jax.random.PRNGKey(1))
    b = tiny_sampler.generate(params, prompts, sp, jax.random.PRNGKey(1))
    c = tiny_sampler.generate(params, prompts, sp, jax.random.PRNGKey(2))
    assert [o.ids.tolist() for o in a] == [o.ids.tolist() for o in b]
    assert [o.ids.tolist() for o in a] != [o.ids.tolist() for o in c]


def test_an_episodes_draws_do_not_depend_on_its_batch(tiny, tiny_sampler):
    """Keyed by (episode seed, turn), a row samples the same tokens alone, with other rows, at another
    position, in another batch size: what lets processes split a step's episodes (multi-host)."""
    cfg, params, _ = tiny
    prompts = _prompts(cfg.vocab_size, [4, 9, 2, 12, 7], seed=3)
    sp = SamplingParams(max_new_tokens=16)
    key = jax.random.PRNGKey(11)
    seeds = [(40, 0), (41, 2), (7, 0), (7, 1), (1000, 3)]
    together = tiny_sampler.generate(params, prompts[:4], sp, key, turn_seeds=seeds[:4])
    order = [3, 0, 4, 2, 1]
    shuffled = tiny_sampler.generate(params, [prompts[i] for i in order], sp, key,
                                     turn_seeds=[seeds[i] for i in order])
    by_seed = {seeds[i]: o.ids.tolist() for i, o in zip(order, shuffled)}
    for i, out in enumerate(together):
        assert out.ids.tolist() == by_seed[seeds[i]]
        alone = tiny_sampler.generate(params, [prompts[i]], sp, key, turn_seeds=[seeds[i]])[0]
        assert alone.ids.tolist() == out.ids.tolist()
        np.testing.assert_allclose(alone.logprobs, out.logprobs, atol=1e-5)
    # Another episode or turn, same prompt: other draws.
    other = tiny_sampler.generate(params, [prompts[2]] * 3, sp, key, turn_seeds=[(7, 0), (8, 0), (7, 5)])
    assert other[0].ids.tolist() == together[2].ids.tolist()
    assert other[1].ids.tolist() != other[0].ids.tolist() != other[2].ids.tolist()
    with pytest.raises(ValueError, match="turn seeds"):
        tiny_sampler.generate(params, prompts[:2], sp, key, turn_seeds=[(0, 0)])


def test_per_request_sampling_and_max_new_tokens(tiny, tiny_sampler):
    cfg, params, _ = tiny
    prompts = _prompts(cfg.vocab_size, [4, 9, 2, 30])
    per_row = [SamplingParams(greedy=True, max_new_tokens=3), SamplingParams(max_new_tokens=16),
               SamplingParams(temperature=0.5, max_new_tokens=9),
               SamplingParams(top_k=5, max_new_tokens=1)]
    outs = tiny_sampler.generate(params, prompts, per_row, jax.random.PRNGKey(0))
    assert [len(o.ids) for o in outs] == [3, 16, 9, 1]
    assert all(o.finish_reason == "length" for o in outs)
    shuffled = tiny_sampler.generate(params, prompts[::-1], per_row[::-1], jax.random.PRNGKey(3))
    assert shuffled[-1].ids.tolist() == outs[0].ids.tolist()  # greedy ignores its neighbours


# --------------------------------------------------------------------------------- stopping


def _first_end(ids, seq):
    for end in range(len(seq), len(ids) + 1):
        if tuple(ids[end - len(seq):end]) == tuple(seq):
            return end
    return None


def test_stop_token_sequences_end_at_the_completing_token(tiny, tiny_sampler):
    cfg, params, _ = tiny
    prompts = _prompts(cfg.vocab_size, [5, 8, 2, 2])
    sp = SamplingParams(max_new_tokens=16)
    free = tiny_sampler.generate(params, prompts, sp, jax.random.PRNGKey(4))
    g0, g1 = free[0].ids.tolist(), free[1].ids.tolist()
    two = (g0[6], g0[7])  # a sequence spanning two tokens
    one = g1[10]
    stops = [dict(stop_token_ids=(two,)), dict(stop_token_ids=(one, (99999, 99998))), {}, {}]
    outs = tiny_sampler.generate(params, prompts,
                                 [SamplingParams(max_new_tokens=16, **s) for s in stops],
                                 jax.random.PRNGKey(4))
    end0, end1 = _first_end(g0, two), _first_end(g1, (one,))
    assert outs[0].ids.tolist() == g0[:end0] and outs[0].finish_reason == "stop"
    assert outs[1].ids.tolist() == g1[:end1] and outs[1].finish_reason == "stop"
    np.testing.assert_array_equal(outs[0].logprobs, free[0].logprobs[:end0])


def test_stop_sequence_in_prompt_does_not_stop(tiny, tiny_sampler):
    cfg, params, _ = tiny
    prompt = _prompts(cfg.vocab_size, [6])[0]
    sp = SamplingParams(max_new_tokens=5, stop_token_ids=(tuple(prompt[-2:]),))
    out = tiny_sampler.generate(params, [prompt] * 4, sp, jax.random.PRNGKey(0))[0]
    assert len(out.ids) >= 1
    assert _first_end(out.ids.tolist(), prompt[-2:]) in (None, len(out.ids))


def _spanning_stop_string(tokenizer, ids):
    """A 2-character string made of the last char of token j-1 and the first of token j."""
    for j in range(2, len(ids)):
        left = tokenizer.decode([ids[j - 1]])
        right = tokenizer.decode([ids[j]])
        if left.isascii() and right.isascii() and left.strip() and right.strip():
            stop = left[-1] + right[0]
            n = next(n for n in range(1, len(ids) + 1) if stop in tokenizer.decode(ids[:n]))
            if stop not in tokenizer.decode(ids[n - 1:n]):  # completed across a token boundary
                return stop, n
    return None


def test_stop_strings_end_at_the_token_completing_them_across_tokens(tiny):
    cfg, params, tokenizer = tiny
    prompts = [tokenizer.encode(t) for t in ("SELECT name FROM", "The table has", "a", "b")]
    sp = SamplingParams(max_new_tokens=16)
    free = JaxPolicy(cfg, params, tokenizer, seed=7, eos_ids=()).generate(prompts, sp)
    stops = [_spanning_stop_string(tokenizer, g.ids) for g in free]
    assert all(stops[:2]), "the random model produced no printable token pair"
    for row_index, (stop, n) in enumerate(stops[:2]):
        g = free[row_index]
        policy = JaxPolicy(cfg, params, tokenizer, seed=7, eos_ids=())
        # same batch shape and key: identical draws up to the stop
        out = policy.generate(prompts, SamplingParams(max_new_tokens=16, stop_strings=(stop,)))
        row = out[row_index]
        assert row.ids == g.ids[:n] and row.finish_reason == "stop"
        assert row.logprobs == g.logprobs[:n]
        assert stop in row.text and stop not in tokenizer.decode(row.ids[:-1])


def test_eos_stops_and_is_excluded_from_text(tiny):
    cfg, params, tokenizer = tiny
    prompts = [tokenizer.encode("hello")] * 4
    free = JaxPolicy(cfg, params, tokenizer, seed=3, eos_ids=()).generate(
        prompts, SamplingParams(max_new_tokens=12))[0]
    eos = free.ids[4]
    out = JaxPolicy(cfg, params, tokenizer, seed=3, eos_ids=(eos,)).generate(
        prompts, SamplingParams(max_new_tokens=12))[0]
    end = free.ids.index(eos) + 1
    assert out.ids == free.ids[:end] and out.finish_reason == "stop"
    assert out.text == tokenizer.decode(free.ids[:end - 1])


# --------------------------------------------------------------------------------- buckets


def test_bucket_functions():
    assert [sampler_lib.bucket_length(n) for n in (1, 32, 33, 300, 512, 513, 1100)] == [
        32, 32, 64, 512, 512, 1024, 1536]
    assert [sampler_lib.bucket_batch(n) for n in (1, 3, 4, 5, 64)] == [1, 4, 4, 8, 64]
    assert sampler_lib.bucket_batch(5, (6, 12)) == 6


def test_bucketed_shapes_compile_once(tiny):
    # A config of its own, so that programs compiled by other tests are not counted.
    cfg = dataclasses.replace(TINY_CFG, rms_norm_eps=1.5e-6)
    params = tiny[1]
    s = Sampler(cfg, eos_ids=(1,))
    sp = SamplingParams(max_new_tokens=4)
    key = jax.random.PRNGKey(0)
    s.generate(params, _prompts(cfg.vocab_size, [3, 20, 7]), sp, key)  # batch bucket 4
    s.generate(params, _prompts(cfg.vocab_size, [12, 31, 1, 5], seed=1), sp, key)
    s.generate(params, _prompts(cfg.vocab_size, [30, 2]), SamplingParams(max_new_tokens=11), key)
    assert s.compiled_shapes == [(2, 0, 32, 16, 4, 4, 0), (4, 0, 32, 16, 4, 4, 0)]  # no prefix, ..., top logprobs
    s.generate(params, _prompts(cfg.vocab_size, [8, 9], seed=2), SamplingParams(top_p=0.5), key)
    assert s.num_compilations == 3  # max_new_tokens 256 is a new bucket; top_p is not
    assert s._program._cache_size() == s.num_compilations


def test_a_bfloat16_kv_cache_moves_logprobs_by_a_bounded_amount():
    """`kv_dtype='bfloat16'` rounds cached keys/values to 8 mantissa bits: on the shipped warm start
    at T = 1 the sampled tokens' logprobs stay within 0.15 nats of the trainer's float32 forward
    (0.062 seen), and they do move (the option is in effect); the float32 cache stays at rounding."""
    from tests.rollout.test_rollout import _trainer_logp

    cfg, params, tok = load_pretrained("assets/testbed_warmstart")
    prompts = [tok.apply_chat_template(
        [{"role": "user", "content": f"What is the price of item {i}? The name of this table is shop, "
                                     "and the headers of this table are item,price,stock."}],
        add_generation_prompt=True, tokenize=True, return_dict=False) for i in range(8)]
    errors = {}
    for kv_dtype in ("", "bfloat16"):
        sampler = Sampler(cfg, eos_ids=(), kv_dtype=kv_dtype)
        outs = sampler.generate(params, prompts, SamplingParams(temperature=1.0, max_new_tokens=48),
                                jax.random.PRNGKey(0))
        worst = 0.0
        for prompt, out in zip(prompts, outs):
            seq = list(prompt) + list(out.ids)
            logp = _trainer_logp(cfg, params, seq, 1.0)
            ref = logp[np.arange(len(prompt) - 1, len(seq) - 1), out.ids]
            worst = max(worst, float(np.abs(ref - out.logprobs).max()))
        errors[kv_dtype or "float32"] = worst
    assert errors["float32"] < 1e-4
    assert 1e-3 < errors["bfloat16"] < 0.15, errors
    with pytest.raises(ValueError, match="kv_dtype"):
        Sampler(cfg, kv_dtype="int8")
