"""The rollout engine's token streams with a real model (SmolLM2-135M-Instruct, whose chat template
adds a default system prompt): multi-turn episodes sampled at temperature 1, so replies are varied.

What the stream is: the ids the policy sampled (loss mask 1) and the template's tokens between
replies (loss mask 0). Its text is the rendering of the whole conversation; its ids equal tokenizing
that rendering except where a sampled reply is not the canonical BPE of its own text (the engine
never re-tokenizes a reply: training must see the ids the policy sampled). The logprobs recorded
while sampling match what the trainer recomputes on the stream."""
import jax
import numpy as np
import pytest

from hsjax.models import forward
from hsjax.rollout.engine import collect
from hsjax.policies.base import SamplingParams
from hsjax.policies.jax_policy import JaxPolicy
from tests.rollout.test_rollout import CountingEpisode
from tests.smollm2 import load_smollm2

LOGPROB_ATOL = 1e-4
TURNS = (3, 2, 3, 1)


class UserFirstEpisode(CountingEpisode):
    """Starts without a system message: the template inserts its default one."""

    def reset(self):
        super().reset()
        self.history = self.history[1:]


@pytest.fixture(scope="module")
def rollout():
    _, cfg, params, tokenizer = load_smollm2()
    policy = JaxPolicy(cfg, params, tokenizer, seed=0, batch_buckets=(8,))
    episodes = [CountingEpisode(f"e{k}", n) for k, n in enumerate(TURNS[:2])]
    episodes += [UserFirstEpisode(f"u{k}", n) for k, n in enumerate(TURNS[2:])]
    trajs = collect(episodes, policy, SamplingParams(temperature=1.0, max_new_tokens=12, seed=3))
    return cfg, params, tokenizer, episodes, trajs


def test_stream_is_the_rendered_conversation(rollout):
    _, _, tokenizer, episodes, trajs = rollout
    canonical = 0
    for ep, traj in zip(episodes, trajs):
        assert traj.abort_reason is None and traj.result["num_turns"] == ep.num_turns
        (seg,) = traj.segments
        tokens = seg.tokens.tolist()
        full_text = tokenizer.apply_chat_template(ep.history, tokenize=False)
        text = tokenizer.decode(tokens)
        # Up to the end-of-turn text after the last reply (never generated when it was cut by length).
        assert full_text.startswith(text) and full_text[len(text):] in ("\n", "<|im_end|>\n")
        full_ids = tokenizer.encode(full_text, add_special_tokens=False)
        replies_canonical = all(
            tokenizer.encode(m["content"], add_special_tokens=False) == ids
            for m, ids in zip([m for m in ep.history if m["role"] == "assistant"], _replies(seg)))
        if replies_canonical:
            assert tokens == full_ids[:len(tokens)]
            canonical += 1
    assert canonical >= 1


def _replies(seg):
    """The policy's ids of each reply, without its end-of-turn id."""
    out, cur = [], []
    for t, m in zip(seg.tokens.tolist(), seg.loss_mask.tolist()):
        if m:
            cur.append(t)
        elif cur:
            out.append(cur[:-1] if cur[-1] == 2 else cur)
            cur = []
    if cur:
        out.append(cur[:-1] if cur[-1] == 2 else cur)
    return out


def test_sampled_logprobs_match_the_trainers_recomputation(rollout):
    cfg, params, _, _, trajs = rollout
    logp_program = jax.jit(lambda p, t, pos: jax.nn.log_softmax(forward(cfg, p, t, pos)[0][0], axis=-1))
    for traj in trajs:
        (seg,) = traj.segments
        tokens = seg.tokens
        length = 256
        assert len(tokens) <= length
        tokens_1xT = np.zeros((1, length), np.int32)
        positions_1xT = np.full((1, length), -1, np.int32)
        tokens_1xT[0, :len(tokens)], positions_1xT[0, :len(tokens)] = tokens, np.arange(len(tokens))
        logp = np.asarray(logp_program(params, tokens_1xT, positions_1xT))
        idx = np.nonzero(seg.loss_mask)[0]
        np.testing.assert_allclose(seg.logprobs[idx], logp[idx - 1, tokens[idx]], atol=LOGPROB_ATOL)
        assert int(seg.loss_mask.sum()) == traj.num_generated_tokens > 0
