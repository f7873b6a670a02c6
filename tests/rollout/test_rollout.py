"""The rollout engine: multi-turn episodes, token-exact streams, segments, context overflow."""
import functools

import jax
import numpy as np
import pytest

from hsjax.models import forward, get_preset, init_params
from hsjax.models.tokenizer import IM_END, build_tiny_tokenizer
from hsjax.policies.base import FailedReply, SamplingParams
from hsjax.policies.jax_policy import JaxPolicy
from hsjax.policies.recording import RecordingChatPolicy
from hsjax.policies.scripted import ScriptedChatPolicy, ScriptedTokenPolicy
from hsjax.rollout.engine import CONTEXT_OVERFLOW, POLICY_ERROR, collect, continuation_ids, rollout_stats


class CountingEpisode:
    """A toy game: the agent says something, the environment answers with a count, for
    `num_turns` turns. `keep_last` keeps only the system prompt and the last n messages (a
    harness that rewrites history)."""

    def __init__(self, task_id, num_turns, keep_last=None):
        self.info = {"task_id": task_id, "type": "count", "harness": "toy", "task": num_turns}
        self.num_turns = num_turns
        self.keep_last = keep_last
        self.reset_calls = 0

    def reset(self):
        self.reset_calls += 1
        self.history = [{"role": "system", "content": "Count with me."},
                        {"role": "user", "content": f"Task {self.info['task_id']}: start at 0."}]
        self._done, self._turn, self.failure_mode = False, 0, "none"

    def messages(self):
        if self.keep_last is None or len(self.history) <= self.keep_last + 1:
            return list(self.history)
        return self.history[:1] + self.history[-self.keep_last:]

    def step(self, action_text):
        assert not self._done
        self.history.append({"role": "assistant", "content": action_text})
        self._turn += 1
        if self._turn >= self.num_turns:
            self._done = True
        else:
            self.history.append({"role": "user",
                                 "content": f"Count is {self._turn}. You said {len(action_text)} "
                                            "characters. Go on."})

    @property
    def done(self):
        return self._done

    @property
    def turn(self):
        return self._turn

    def abort(self, reason):
        self._done, self.failure_mode = True, reason

    def result(self):
        success = self.failure_mode == "none"
        return {"task_id": self.info["task_id"], "type": "count", "harness": "toy",
                "success": success, "reward": float(success), "failure_mode": self.failure_mode,
                "answer": None, "num_turns": self._turn, "actions": ["say"] * self._turn}


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def _template(tokenizer, messages, gen_prompt):
    return tokenizer.apply_chat_template(messages, add_generation_prompt=gen_prompt,
                                         tokenize=False)


def _template_ids(tokenizer, messages, gen_prompt):
    return tokenizer.apply_chat_template(messages, add_generation_prompt=gen_prompt,
                                         tokenize=True, return_dict=False)


# ------------------------------------------------------------------------- chat policies


def test_collect_with_scripted_chat_policy_episodes_end_at_different_turns():
    def reply(context, info):
        n_assistant = sum(m["role"] == "assistant" for m in context)
        return f"{info['task_id']} says {n_assistant + 1}"

    policy = ScriptedChatPolicy(reply)
    episodes = [CountingEpisode(f"t{k}", k) for k in (1, 3, 2)]
    trajs = collect(episodes, policy, SamplingParams(max_new_tokens=5))
    assert [len(c) for c in policy.calls] == [3, 2, 1]  # one batched call per turn
    assert [t.result["num_turns"] for t in trajs] == [1, 3, 2]
    assert [t["text"] for t in trajs[1].turns] == ["t3 says 1", "t3 says 2", "t3 says 3"]
    assert all(t.segments == [] and t.abort_reason is None for t in trajs)
    assert all(ep.reset_calls == 1 for ep in episodes)
    stats = rollout_stats(trajs)
    assert stats["rollout/episodes"] == 3 and stats["rollout/turns_max"] == 3


def test_chat_policy_context_overflow_with_tokenizer(tokenizer):
    policy = ScriptedChatPolicy(lambda ctx, info: "word " * 30)
    episodes = [CountingEpisode("long", 5), CountingEpisode("short", 1)]
    trajs = collect(episodes, policy, SamplingParams(max_new_tokens=10), tokenizer=tokenizer,
                    max_context_tokens=80)
    assert trajs[0].abort_reason == CONTEXT_OVERFLOW
    assert trajs[0].result["failure_mode"] == CONTEXT_OVERFLOW
    assert 1 <= trajs[0].result["num_turns"] < 5
    assert trajs[1].abort_reason is None and trajs[1].result["success"]


def test_env_error_aborts_only_that_episode():
    class Broken(CountingEpisode):
        def step(self, action_text):
            raise RuntimeError("database went away")

    trajs = collect([Broken("b", 3), CountingEpisode("ok", 2)],
                    ScriptedChatPolicy(lambda c, i: "x"), SamplingParams())
    assert trajs[0].abort_reason == "env_error" and "database went away" in trajs[0].error
    assert trajs[1].result["success"]


def test_a_failed_reply_ends_only_that_episode():
    def reply(context, info):
        n = sum(m["role"] == "assistant" for m in context)
        return FailedReply("HTTP 500 after 4 attempts") if info["task_id"] == "bad" and n == 1 else "x"

    trajs = collect([CountingEpisode("bad", 3), CountingEpisode("ok", 3)], ScriptedChatPolicy(reply),
                    SamplingParams())
    assert trajs[0].abort_reason == POLICY_ERROR and trajs[0].result["failure_mode"] == POLICY_ERROR
    assert trajs[0].error == "HTTP 500 after 4 attempts" and [t["text"] for t in trajs[0].turns] == ["x"]
    assert trajs[1].abort_reason is None and trajs[1].result["success"] and trajs[1].result["num_turns"] == 3


def test_chat_context_budget_in_characters_without_a_tokenizer():
    policy = ScriptedChatPolicy(lambda ctx, info: "word " * 40)  # 200 characters a reply
    trajs = collect([CountingEpisode("long", 5), CountingEpisode("short", 1)], policy, SamplingParams(),
                    max_context_chars=400)
    assert trajs[0].abort_reason == CONTEXT_OVERFLOW and trajs[0].result["failure_mode"] == CONTEXT_OVERFLOW
    assert 1 <= trajs[0].result["num_turns"] < 5
    assert trajs[1].abort_reason is None and trajs[1].result["success"]
    assert collect([CountingEpisode("long", 5)], policy, SamplingParams())[0].result["num_turns"] == 5


# --------------------------------------------------------------------- token streams


def test_scripted_token_stream_equals_template_rendering(tokenizer):
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    replies = {"a": ["SELECT 1;", "done"], "b": ["x y z"]}

    def reply(prompt):
        text = tokenizer.decode(prompt)
        key = "a" if "Task a" in text else "b"
        return replies[key].pop(0)

    policy = ScriptedTokenPolicy(reply, tokenizer=tokenizer, eos_id=im_end, logprob=-0.5)
    episodes = [CountingEpisode("a", 2), CountingEpisode("b", 1)]
    trajs = collect(episodes, policy, SamplingParams(max_new_tokens=20))
    for ep, traj in zip(episodes, trajs):
        (seg,) = traj.segments
        full = _template_ids(tokenizer, ep.history, False)
        # The model does not generate the "\n" after its final <|im_end|>.
        assert seg.tokens.tolist() == full[:-1]
        generated = [t for t, m in zip(seg.tokens, seg.loss_mask) if m]
        expected = sum((tokenizer.encode(m["content"]) + [im_end]
                        for m in ep.history if m["role"] == "assistant"), [])
        assert generated == expected and traj.num_generated_tokens == len(expected)
        assert np.all(seg.logprobs[seg.loss_mask == 1] == -0.5)
        assert np.all(seg.logprobs[seg.loss_mask == 0] == 0)
        assert seg.tokens.dtype == np.int32 and seg.logprobs.dtype == np.float32


def test_reply_cut_by_length_gets_end_of_turn_as_non_policy_tokens(tokenizer):
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    policy = ScriptedTokenPolicy(["one two three four five six", "seven eight nine ten"],
                                 tokenizer=tokenizer, eos_id=im_end)
    ep = CountingEpisode("c", 2)
    (traj,) = collect([ep], policy, SamplingParams(max_new_tokens=3))
    assert [t["finish_reason"] for t in traj.turns] == ["length", "length"]
    (seg,) = traj.segments
    tokens, mask = seg.tokens.tolist(), seg.loss_mask.tolist()
    first_end = tokens.index(im_end, mask.index(1))
    assert mask[first_end - 3:first_end] == [1, 1, 1] and mask[first_end] == 0
    text = tokenizer.decode(tokens)
    assert _template(tokenizer, ep.history, False) == text + "<|im_end|>\n"


def test_history_rewrite_starts_new_segment(tokenizer):
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    policy = ScriptedTokenPolicy(lambda p: "go", tokenizer=tokenizer, eos_id=im_end)
    ep = CountingEpisode("r", 4, keep_last=4)
    (traj,) = collect([ep], policy, SamplingParams(max_new_tokens=8))
    # Turn 1 and 2 extend the first stream; from turn 3 the kept window slides every turn.
    assert [t["segment"] for t in traj.turns] == [0, 0, 1, 2]
    assert len(traj.segments) == 3
    for seg, prompt in zip(traj.segments[1:], policy.calls[2:]):
        assert seg.tokens[:len(prompt[0])].tolist() == prompt[0]
        assert prompt[0] == _template_ids(tokenizer, _context_before(prompt[0], tokenizer), True)
    assert sum(s.num_policy_tokens for s in traj.segments) == traj.num_generated_tokens


def _context_before(prompt_ids, tokenizer):
    """Parses a ChatML prompt back into messages (test helper for the rewrite test)."""
    text = tokenizer.decode(prompt_ids)
    messages = []
    for block in text.split("<|im_start|>")[1:]:
        role, _, rest = block.partition("\n")
        if rest:
            messages.append({"role": role, "content": rest.removesuffix("<|im_end|>\n")})
    return messages


def test_context_overflow_aborts_and_never_truncates(tokenizer):
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    policy = ScriptedTokenPolicy(lambda p: "a b c d e f", tokenizer=tokenizer, eos_id=im_end)
    episodes = [CountingEpisode("long", 6), CountingEpisode("short", 1)]
    limit = 90
    trajs = collect(episodes, policy, SamplingParams(max_new_tokens=10), max_context_tokens=limit)
    long = trajs[0]
    assert long.abort_reason == CONTEXT_OVERFLOW == long.result["failure_mode"]
    assert 1 <= len(long.turns) < 6
    (seg,) = long.segments
    assert seg.loss_mask[-1] == 1  # ends with the last reply: nothing cut, nothing half-added
    assert all(t["prompt_tokens"] + 10 <= limit for t in long.turns)
    assert trajs[1].abort_reason is None


def test_continuation_ids_refuses_non_extensions(tokenizer):
    prev = [{"role": "user", "content": "hi"}]
    prompt_text = _template(tokenizer, prev, True)
    ids = tokenizer.encode("yo")
    new_ok = prev + [{"role": "assistant", "content": "yo"}, {"role": "user", "content": "?"}]
    tail, _ = continuation_ids(tokenizer, prev, prompt_text, "yo", ids, new_ok)
    assert tokenizer.decode(tail) == "<|im_end|>\n<|im_start|>user\n?<|im_end|>\n<|im_start|>assistant\n"
    edited = prev + [{"role": "assistant", "content": "yo!"}, {"role": "user", "content": "?"}]
    assert continuation_ids(tokenizer, prev, prompt_text, "yo", ids, edited) is None
    assert continuation_ids(tokenizer, prev, prompt_text, "yo", ids, new_ok[1:]) is None


# ------------------------------------------------------------- JAX policy, token exactness


@pytest.fixture(scope="module")
def tiny_model(tokenizer):
    cfg = get_preset("tiny")
    params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.PRNGKey(1))
    return cfg, params


class RecordingPolicy(JaxPolicy):
    def generate(self, prompts, sampling, turn_seeds=None):
        gens = super().generate(prompts, sampling, turn_seeds=turn_seeds)
        self.log.append((prompts, gens))
        return gens


def _policy(tiny_model, tokenizer, seed, cls=JaxPolicy):
    cfg, params = tiny_model
    policy = cls(cfg, params, tokenizer, seed=seed, batch_buckets=(64,))
    policy.log = []
    return policy


def _trainer_logp(cfg, params, tokens, temperature, length=256):
    """log_softmax(logits / T) of the stream, as the trainer computes it (padded to one shape)."""
    assert len(tokens) <= length
    tokens_1xT = np.zeros((1, length), np.int32)
    positions_1xT = np.full((1, length), -1, np.int32)
    tokens_1xT[0, :len(tokens)], positions_1xT[0, :len(tokens)] = tokens, np.arange(len(tokens))
    logp = _logp_program(cfg)(params, tokens_1xT, positions_1xT, np.float32(temperature))
    return np.asarray(logp)[:len(tokens)]


@functools.lru_cache(maxsize=None)
def _logp_program(cfg):
    return jax.jit(lambda params, tokens, positions, t: jax.nn.log_softmax(
        forward(cfg, params, tokens, positions)[0][0] / t, axis=-1))


def test_token_exact_streams_with_jax_policy(tiny_model, tokenizer):
    cfg, params = tiny_model
    policy = _policy(tiny_model, tokenizer, seed=0, cls=RecordingPolicy)
    temperature = 0.8
    sampling = SamplingParams(temperature=temperature, max_new_tokens=8)
    episodes = [CountingEpisode(f"e{k}", k) for k in (2, 3, 1, 4)]
    trajs = collect(episodes, policy, sampling)

    generated = {id(ep): [] for ep in episodes}
    for prompts, gens in policy.log:
        # the episodes live at a call are those with turns still to generate, in order
        for ep, gen in zip([e for e in episodes if len(generated[id(e)]) < e.turn], gens):
            generated[id(ep)].append(gen)

    reasons = set()
    for ep, traj in zip(episodes, trajs):
        assert traj.result["num_turns"] == ep.num_turns and traj.abort_reason is None
        (seg,) = traj.segments
        tokens, mask = seg.tokens, seg.loss_mask
        # The loss mask covers exactly the generated ids, in order.
        gens = generated[id(ep)]
        assert tokens[mask == 1].tolist() == sum((g.ids for g in gens), [])
        assert int(mask.sum()) == traj.num_generated_tokens
        reasons |= {g.finish_reason for g in gens}
        # The trainer's recomputation agrees with the sampler's logprobs.
        logp = _trainer_logp(cfg, params, tokens, temperature)
        idx = np.nonzero(mask)[0]
        recomputed = logp[idx - 1, tokens[idx]]
        np.testing.assert_allclose(seg.logprobs[idx], recomputed, atol=1e-4)
        # The stream is the chat-template rendering of the whole conversation, up to the
        # end-of-turn text after the last reply.
        full = _template(tokenizer, ep.history, False)
        text = tokenizer.decode(tokens.tolist())
        assert full.startswith(text) and full[len(text):] in ("\n", "<|im_end|>\n")
    assert "length" in reasons


def test_fifty_episode_run_compiles_nothing_after_warmup(tiny_model, tokenizer):
    sampling = SamplingParams(temperature=1.0, max_new_tokens=8)

    def run(seed):
        policy = _policy(tiny_model, tokenizer, seed)
        episodes = [CountingEpisode(f"w{seed}-{k}", k % 4 + 1) for k in range(50)]
        trajs = collect(episodes, policy, sampling, env_workers=4)
        assert sorted(t.result["num_turns"] for t in trajs) == sorted(k % 4 + 1 for k in range(50))
        return policy

    warm = run(seed=0)
    program = warm.sampler._program
    cache_size = program._cache_size()
    assert warm.sampler.num_compilations >= 1
    measured = run(seed=1)
    assert measured.sampler._program is program
    assert set(measured.sampler.compiled_shapes) <= set(warm.sampler.compiled_shapes)
    assert program._cache_size() == cache_size


def test_recording_policy_keeps_no_failed_reply():
    class HalfDown:
        def chat(self, contexts, sampling, infos=None):
            return ["ok" if i % 2 == 0 else FailedReply("HTTP 500") for i in range(len(contexts))]

    recorder = RecordingChatPolicy(HalfDown())
    contexts = [[{"role": "user", "content": f"q{i}"}] for i in range(4)]
    replies = recorder.chat(contexts, SamplingParams(), [{"episode_id": f"e{i}"} for i in range(4)])
    assert isinstance(replies[1], FailedReply)  # passed through: the engine ends that episode
    assert sorted(recorder.turns) == ["e0", "e2"]
