"""The policy interface: every hook has a no-op default, benchmark agents become chat policies, and
the engine calls the hooks without asking whether a policy has them."""
import pytest

from hsjax.policies.base import AgentPolicy, ChatPolicy, Policy, SamplingParams, TokenPolicy, as_policy
from hsjax.policies.scripted import ScriptedChatPolicy, ScriptedTokenPolicy
from hsjax.rollout.engine import collect


class Agent:
    """A benchmark agent as harness_envs writes one: no hsjax base class."""

    def chat(self, contexts, sampling, infos=None):
        return ["done"] * len(contexts)


class OneTurn:
    def __init__(self):
        self.info, self.done, self.replies = {"task_id": "t"}, False, []

    def reset(self):
        self.done = False

    def messages(self):
        return [{"role": "user", "content": "go"}]

    def step(self, text):
        self.replies.append(text)
        self.done = True

    def abort(self, reason):
        self.done = True

    def result(self):
        return {"reward": 1.0, "replies": self.replies}


def test_the_hooks_and_attributes_have_defaults():
    policy = ScriptedChatPolicy(["a"])
    assert isinstance(policy, Policy) and isinstance(policy, ChatPolicy) and not isinstance(policy, TokenPolicy)
    assert policy.tokenizer is None and policy.eos_ids == () and policy.max_context is None
    policy.update_params({"w": 1})
    policy.reseed(3)
    policy.end_rollout()
    policy.close()
    with ScriptedTokenPolicy([[1, 2]]) as token_policy:
        assert isinstance(token_policy, TokenPolicy)


def test_a_policy_needs_its_kind_method():
    class NoChat(ChatPolicy):
        pass

    with pytest.raises(TypeError):
        NoChat()


def test_a_benchmark_agent_is_wrapped_as_a_chat_policy():
    agent = Agent()
    policy = as_policy(agent)
    assert isinstance(policy, AgentPolicy) and policy.agent is agent
    assert as_policy(policy) is policy
    assert policy.chat([[{"role": "user", "content": "x"}]], SamplingParams(), [{}]) == ["done"]
    with pytest.raises(TypeError, match="neither a hsjax Policy"):
        as_policy(object())


def test_collect_ends_the_rollout_of_every_policy():
    class Counting(ScriptedChatPolicy):
        ended = 0

        def end_rollout(self):
            self.ended += 1

    policy = Counting(lambda ctx, info: "ok")
    trajs = collect([OneTurn()], policy, SamplingParams())
    assert policy.ended == 1 and trajs[0].result["replies"] == ["ok"]
    assert collect([OneTurn()], Agent(), SamplingParams())[0].result["replies"] == ["done"]
