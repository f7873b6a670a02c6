"""KV reuse across turns (`hsjax.policies.kv_reuse`): a policy that prefills only each turn's new
tokens gives the token streams and logprobs of one that prefills everything, including episodes
that rewrite their history (new segments), episodes that end early, and stop strings."""
import numpy as np
import pytest

from hsjax.policies.base import SamplingParams
from hsjax.policies.jax_policy import JaxPolicy
from hsjax.rollout.engine import collect
from tests.rollout.test_rollout import CountingEpisode, _trainer_logp, tiny_model, tokenizer  # noqa: F401


def _run(tiny_model, tokenizer, kv_reuse, sampling, episodes):
    cfg, params = tiny_model
    policy = JaxPolicy(cfg, params, tokenizer, seed=3, kv_reuse=kv_reuse, batch_buckets=(8,))
    calls = []
    generate = policy.generate

    def spy(prompts, sampling, turn_seeds=None):
        if policy.turn_cache is not None:
            calls.append(policy.turn_cache.plan(prompts, turn_seeds)[2] is not None)
        return generate(prompts, sampling, turn_seeds=turn_seeds)
    policy.generate = spy
    trajectories = collect(episodes(), policy, sampling)
    if kv_reuse:  # nothing is kept once the episodes are done (the update that follows needs the memory)
        assert policy.turn_cache.plan([[1, 2, 3]], [(0, 9)])[2] is None and policy.turn_cache._kept is None
    return trajectories, calls


def _episodes():
    # Different lengths (rows finish at different turns) and one harness that keeps only the
    # last two messages: its context stops extending the stream, so it starts new segments.
    return [CountingEpisode("a", 5), CountingEpisode("b", 2), CountingEpisode("c", 4),
            CountingEpisode("d", 5, keep_last=2)]


@pytest.mark.parametrize("sampling", [SamplingParams(greedy=True, max_new_tokens=12),
                                      SamplingParams(temperature=0.8, max_new_tokens=12),
                                      SamplingParams(greedy=True, max_new_tokens=12, stop_strings=("t",))],
                         ids=["greedy", "sampled", "stop_string"])
def test_reuse_gives_the_streams_of_a_full_prefill(tiny_model, tokenizer, sampling):
    cfg, params = tiny_model
    full, _ = _run(tiny_model, tokenizer, False, sampling, _episodes)
    reused, calls = _run(tiny_model, tokenizer, True, sampling, _episodes)
    assert calls[0] is False and all(calls[1:])  # every later turn started from kept caches
    for a, b in zip(full, reused):
        assert len(a.segments) == len(b.segments)
        for sa, sb in zip(a.segments, b.segments):
            np.testing.assert_array_equal(sb.tokens, sa.tokens)
            np.testing.assert_array_equal(sb.loss_mask, sa.loss_mask)
            np.testing.assert_allclose(sb.logprobs, sa.logprobs, atol=1e-4)
            # ... and the trainer's recomputation agrees with the reused run's logprobs.
            idx = np.nonzero(sb.loss_mask)[0]
            logp = _trainer_logp(cfg, params, sb.tokens, sampling.logprob_temperature, length=512)
            np.testing.assert_allclose(sb.logprobs[idx], logp[idx - 1, sb.tokens[idx]], atol=1e-4)
    assert len(reused[3].segments) > 1  # the history-rewriting episode did restart segments


def test_new_params_and_new_phases_drop_the_kept_caches(tiny_model, tokenizer):
    cfg, params = tiny_model
    policy = JaxPolicy(cfg, params, tokenizer, seed=0, kv_reuse=True, batch_buckets=(8,))
    sampling = SamplingParams(greedy=True, max_new_tokens=4)
    prompt = [5, 6, 7, 8]
    first = policy.generate([prompt], sampling, turn_seeds=[(0, 0)])[0]
    longer = prompt + first.ids + [9, 10]
    assert policy.turn_cache.plan([longer], [(0, 1)])[2] is not None
    policy.update_params(params)
    assert policy.turn_cache.plan([longer], [(0, 1)])[2] is None
    policy.generate([prompt], sampling, turn_seeds=[(0, 0)])
    policy.reseed(4)
    assert policy.turn_cache.plan([longer], [(0, 1)])[2] is None
    # A prompt that does not extend the kept tokens is prefilled in full.
    policy.generate([prompt], sampling, turn_seeds=[(0, 0)])
    assert policy.turn_cache.plan([[5, 6, 99, 8, 1]], [(0, 1)])[2] is None
