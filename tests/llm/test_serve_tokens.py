"""Token-exact serving, through the official `openai` client against real servers on 127.0.0.1:
per-token logprobs (OpenAI's shape), vLLM's token-id fields, `n`, streaming, `/v1/completions`,
unsupported fields refused; and `HttpTokenPolicy` consuming them, equal to the JAX sampler."""
import functools
import json

import httpx
import jax
import numpy as np
import openai
import pytest

from hsjax.llm import server as serve
from hsjax.llm.openai_replies import text_pieces
from hsjax.models import forward
from hsjax.models.tiny import write_tiny_model
from hsjax.models.tokenizer import IM_END
from hsjax.policies.base import FailedReply, PolicyError, SamplingParams
from hsjax.policies.http_tokens import HttpTokenPolicy
from hsjax.policies.jax_policy import JaxPolicy
from hsjax.policies.scripted import ScriptedChatPolicy
from hsjax.policies.tokens import render_prompt
from hsjax.rollout.engine import collect
from tests.rollout.test_rollout import CountingEpisode

MESSAGES = [{"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": "Which table holds the orders?"}]
OTHER = [{"role": "user", "content": "SELECT name FROM users"}]
BATCH = 8  # the server's max_batch and the policies' one batch bucket: one compiled shape per length


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny_model", seed=2)


@pytest.fixture(scope="module")
def direct(tiny_dir):
    """The JAX policy the server serves, called in-process (same weights and batch bucket)."""
    return JaxPolicy.from_pretrained(tiny_dir, seed=0, batch_buckets=(BATCH,))


@pytest.fixture(scope="module")
def server(tiny_dir):
    policy = JaxPolicy.from_pretrained(tiny_dir, seed=0, batch_buckets=(BATCH,))
    with serve.BackgroundServer(serve.build_app(policy, "tiny", max_batch=BATCH, batch_window_s=0.2)) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=300) as c:
        yield c


def greedy(max_new_tokens=8, top=0):
    return SamplingParams(greedy=True, max_new_tokens=max_new_tokens, top_logprobs=top)


@functools.lru_cache(maxsize=None)
def _logp_program(cfg):
    return jax.jit(lambda params, tokens, t: jax.nn.log_softmax(
        forward(cfg, params, tokens, jax.numpy.arange(tokens.shape[1])[None])[0][0] / t, axis=-1))


def trainer_logprobs(policy, prompt, ids, temperature):
    """What the trainer recomputes for `ids` after `prompt`: log_softmax(logits / T) at each id."""
    tokens = np.asarray([list(prompt) + list(ids)], np.int32)
    logp = np.asarray(_logp_program(policy.cfg)(policy.params, tokens, np.float32(temperature)))
    return logp[np.arange(len(prompt) - 1, len(prompt) + len(ids) - 1), ids]


# ------------------------------------------------------------------------------------------ chat


def test_chat_logprobs_and_token_ids_equal_the_jax_sampler(client, direct):
    resp = client.chat.completions.create(model="tiny", messages=MESSAGES, temperature=0, max_tokens=8,
                                          logprobs=True, top_logprobs=3, extra_body={"return_token_ids": True})
    prompt = render_prompt(direct.tokenizer, MESSAGES)
    (want,) = direct.generate([prompt], greedy(8, top=3))
    (choice,) = resp.choices
    assert resp.prompt_token_ids == prompt and choice.token_ids == want.ids
    assert resp.usage.prompt_tokens == len(prompt) and resp.usage.completion_tokens == len(want.ids)
    entries = choice.logprobs.content
    assert [e.logprob for e in entries] == want.logprobs  # the sampler's own numbers, exactly
    for e, t, top in zip(entries, want.ids, want.top_logprobs):
        assert e.token == direct.tokenizer.decode([t]) and bytes(e.bytes).decode("utf-8", "replace") == e.token
        assert [(a.logprob, a.token) for a in e.top_logprobs] == [
            (lp, direct.tokenizer.decode([a])) for a, lp in top]
        assert e.top_logprobs[0].logprob >= e.logprob  # greedy: the chosen token is the most likely
    assert choice.message.content == want.text and choice.finish_reason == want.finish_reason
    # vLLM's return_tokens_as_token_ids names each token by id.
    named = client.chat.completions.create(model="tiny", messages=MESSAGES, temperature=0, max_tokens=8,
                                           logprobs=True, extra_body={"return_tokens_as_token_ids": True})
    assert [e.token for e in named.choices[0].logprobs.content] == [f"token_id:{t}" for t in want.ids]
    assert not hasattr(named, "prompt_token_ids") or named.prompt_token_ids is None
    plain = client.chat.completions.create(model="tiny", messages=MESSAGES, temperature=0, max_tokens=8)
    assert plain.choices[0].logprobs is None and plain.choices[0].message.content == want.text


def test_sampled_logprobs_are_what_the_trainer_recomputes(client, direct):
    temperature = 0.7
    resp = client.chat.completions.create(model="tiny", messages=OTHER, temperature=temperature, top_p=0.9,
                                          max_tokens=12, seed=5, logprobs=True, top_logprobs=2,
                                          extra_body={"return_token_ids": True, "top_k": 40})
    (choice,) = resp.choices
    ids, logprobs = choice.token_ids, [e.logprob for e in choice.logprobs.content]
    assert len(ids) == len(logprobs) >= 1
    recomputed = trainer_logprobs(direct, resp.prompt_token_ids, ids, temperature)
    np.testing.assert_allclose(logprobs, recomputed, atol=1e-5)
    for e in choice.logprobs.content:  # alternatives at the same temperature, most likely first
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob and e.logprob <= e.top_logprobs[0].logprob


def test_n_choices_share_one_generate_call(client, direct):
    resp = client.chat.completions.create(model="tiny", messages=OTHER, temperature=1.0, max_tokens=8, n=4,
                                          seed=3, extra_body={"return_token_ids": True})
    assert [c.index for c in resp.choices] == [0, 1, 2, 3]
    ids = [tuple(c.token_ids) for c in resp.choices]
    assert len(set(ids)) > 1  # independent draws
    assert resp.usage.prompt_tokens == len(resp.prompt_token_ids)  # the prompt counted once
    assert resp.usage.completion_tokens == sum(map(len, ids))
    for c in resp.choices:
        assert c.message.content == direct.reply_text(list(c.token_ids))
    same = client.chat.completions.create(model="tiny", messages=OTHER, temperature=0, max_tokens=8, n=2)
    assert same.choices[0].message.content == same.choices[1].message.content
    with pytest.raises(openai.BadRequestError, match="max_batch"):
        client.chat.completions.create(model="tiny", messages=OTHER, n=BATCH + 1)


def test_stream_sends_the_same_tokens_as_sse_chunks(client, server):
    body = dict(model="tiny", messages=MESSAGES, temperature=0, max_tokens=8, logprobs=True)
    whole = client.chat.completions.create(**body, extra_body={"return_token_ids": True})
    chunks = list(client.chat.completions.create(**body, stream=True, stream_options={"include_usage": True},
                                                 extra_body={"return_token_ids": True}))
    assert {c.object for c in chunks} == {"chat.completion.chunk"} and len({c.id for c in chunks}) == 1
    first, *middle, last_choice, usage = chunks
    assert first.choices[0].delta.role == "assistant" and first.prompt_token_ids == whole.prompt_token_ids
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert sum((c.choices[0].token_ids for c in chunks if c.choices), []) == whole.choices[0].token_ids
    streamed = [e for c in middle for e in c.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [
        (e.token, e.logprob) for e in whole.choices[0].logprobs.content]
    assert last_choice.choices[0].finish_reason == whole.choices[0].finish_reason
    assert usage.choices == [] and usage.usage.total_tokens == whole.usage.total_tokens
    # The raw wire: server-sent events ending with [DONE].
    raw = httpx.post(server.base_url + "/chat/completions", timeout=300,
                     json={**body, "stream": True, "n": 2})
    assert raw.headers["content-type"].startswith("text/event-stream")
    events = [line for line in raw.text.split("\n\n") if line]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    indices = {json.loads(e[6:])["choices"][0]["index"] for e in events[:-1]}
    assert indices == {0, 1}


def test_text_pieces_hold_back_partial_characters(direct):
    tok = direct.tokenizer
    text = "Zürich 日本"
    ids = tok.encode(text, add_special_tokens=False)
    pieces = text_pieces(lambda i: tok.decode(i), ids, text)
    assert "".join(pieces) == text and len(pieces) == len(ids)
    assert all("\ufffd" not in p for p in pieces)
    # The end-of-turn id and a cut stop string add nothing.
    eos = tok.convert_tokens_to_ids(IM_END)
    assert "".join(text_pieces(lambda i: tok.decode(i), ids + [eos], "Zürich")) == "Zürich"


# ----------------------------------------------------------------------------------- completions


def test_completions_take_token_ids_and_text(client, direct):
    prompt = render_prompt(direct.tokenizer, OTHER)
    resp = client.completions.create(model="tiny", prompt=prompt, temperature=0, max_tokens=8, logprobs=2,
                                     extra_body={"return_token_ids": True})
    (want,) = direct.generate([prompt], greedy(8, top=2))
    (choice,) = resp.choices
    assert resp.object == "text_completion" and choice.prompt_token_ids == prompt
    assert choice.token_ids == want.ids and choice.logprobs.token_logprobs == want.logprobs
    assert choice.text == want.text
    assert choice.logprobs.tokens == [direct.tokenizer.decode([t]) for t in want.ids]
    assert all(len(top) >= 2 for top in choice.logprobs.top_logprobs)
    assert choice.logprobs.text_offset[0] == 0
    # A text prompt is tokenized by the server; a batch of prompts gives n choices each, in order.
    text = "SELECT name FROM users WHERE id = 3;"
    batch = client.completions.create(model="tiny", prompt=[text, prompt], temperature=0, max_tokens=4, n=2,
                                      extra_body={"return_token_ids": True})
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    assert batch.choices[0].prompt_token_ids == direct.tokenizer.encode(text) == batch.choices[1].prompt_token_ids
    assert batch.choices[2].token_ids == want.ids[:4] == batch.choices[3].token_ids
    stream = list(client.completions.create(model="tiny", prompt=prompt, temperature=0, max_tokens=8, stream=True))
    assert "".join(c.choices[0].text for c in stream) == want.text
    assert stream[-1].choices[0].finish_reason == want.finish_reason


@pytest.mark.parametrize("prompt, why", [
    ([1, 2, 10**6], "outside the vocabulary"),
    ([], "is empty"),
    ([[1, 2], []], "is empty"),
    ({"ids": [1]}, "'prompt' must be"),
])
def test_bad_prompts_are_400(client, prompt, why):
    with pytest.raises(openai.BadRequestError, match=why) as e:
        client.completions.create(model="tiny", prompt=prompt, max_tokens=2)
    assert e.value.body["param"] == "prompt"


# ---------------------------------------------------------------------------------- refused fields


@pytest.mark.parametrize("route, field, value", [
    ("chat", "tools", [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]),
    ("chat", "tool_choice", "auto"),
    ("chat", "response_format", {"type": "json_object"}),
    ("chat", "functions", [{"name": "lookup"}]),
    ("chat", "function_call", "auto"),
    ("chat", "logit_bias", {"17": 5}),
    ("chat", "presence_penalty", 0.5),
    ("chat", "frequency_penalty", 1.0),
    ("chat", "repetition_penalty", 1.1),
    ("chat", "min_p", 0.1),
    ("chat", "reasoning_effort", "low"),
    ("chat", "no_such_field", 1),
    ("completion", "echo", True),
    ("completion", "suffix", "end"),
    ("completion", "best_of", 3),
    ("completion", "tools", [{"type": "function", "function": {"name": "lookup"}}]),
])
def test_unsupported_fields_are_a_400_naming_them(client, route, field, value):
    call = client.chat.completions.create if route == "chat" else client.completions.create
    base = {"messages": OTHER} if route == "chat" else {"prompt": [1, 2, 3]}
    with pytest.raises(openai.BadRequestError) as e:
        call(model="tiny", max_tokens=2, **base, extra_body={field: value})
    error = e.value.body
    assert error["param"] == field and error["code"] == "unsupported_parameter" and field in error["message"]


def test_neutral_values_and_labels_are_accepted(client):
    resp = client.chat.completions.create(model="tiny", messages=OTHER, temperature=0, max_tokens=2,
                                          presence_penalty=0, frequency_penalty=0.0, user="alice", tool_choice="none",
                                          response_format={"type": "text"}, metadata={"run": "x"},
                                          extra_body={"repetition_penalty": 1.0, "top_k": -1})
    assert resp.choices[0].finish_reason in ("stop", "length")


def test_a_text_only_policy_refuses_token_requests():
    policy = ScriptedChatPolicy(lambda messages, info: "ok")
    with serve.BackgroundServer(serve.build_app(policy, "scripted")) as s:
        with openai.OpenAI(base_url=s.base_url, api_key="unused", max_retries=0) as c:
            assert c.chat.completions.create(model="scripted", messages=OTHER, n=2).choices[1].message.content == "ok"
            for call in (lambda: c.chat.completions.create(model="scripted", messages=OTHER, logprobs=True),
                         lambda: c.completions.create(model="scripted", prompt=[1, 2])):
                with pytest.raises(openai.BadRequestError, match="text only"):
                    call()


# ------------------------------------------------------------------------------ the HTTP token policy


def test_http_token_policy_equals_the_jax_sampler(server, direct):
    prompts = [render_prompt(direct.tokenizer, m) for m in (MESSAGES, OTHER)]
    with HttpTokenPolicy(server.base_url, "tiny", direct.tokenizer, max_retries=0, timeout=300) as http:
        got = http.generate(prompts, greedy(8, top=2))
        want = direct.generate(prompts, greedy(8, top=2))
        for g, w in zip(got, want):
            assert (g.ids, g.logprobs, g.top_logprobs, g.finish_reason) == (
                w.ids, w.logprobs, w.top_logprobs, w.finish_reason)
        # Sampled: the logprobs are the trainer's recomputation of the ids the server drew.
        sampling = SamplingParams(temperature=0.8, top_k=30, max_new_tokens=10, seed=11)
        (g,) = http.generate(prompts[1:], sampling)
        np.testing.assert_allclose(g.logprobs, trainer_logprobs(direct, prompts[1], g.ids, 0.8), atol=1e-5)


def test_rollouts_through_the_server_are_the_jax_policys_streams(server, direct):
    """The rollout engine records the same token streams (tokens, loss mask, logprobs) from the
    server through HttpTokenPolicy as from the JAX policy in-process: a run can train from them."""
    sampling = greedy(6)
    with HttpTokenPolicy(server.base_url, "tiny", direct.tokenizer, max_retries=0, timeout=300) as http:
        remote = collect([CountingEpisode(f"e{k}", k) for k in (2, 1, 3)], http, sampling)
    local = collect([CountingEpisode(f"e{k}", k) for k in (2, 1, 3)], direct, sampling)
    for r, l in zip(remote, local):
        assert r.result == l.result and len(r.segments) == len(l.segments) == 1
        for a, b in zip(r.segments, l.segments):
            np.testing.assert_array_equal(a.tokens, b.tokens)
            np.testing.assert_array_equal(a.loss_mask, b.loss_mask)
            # In process, later turns decode on the KV cache the last turn ended with; the server
            # prefills each request in full. Same tokens, logprobs equal up to float32 summation order.
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5, rtol=0)
        assert int(r.segments[0].loss_mask.sum()) > 0


def test_http_token_policy_needs_token_ids_from_the_server(openai_server, direct):
    """A server that answers completions without vLLM's token_ids cannot feed a token-exact run."""
    fake = openai_server((200, {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": "m",
                                "choices": [{"index": 0, "text": "hi", "finish_reason": "stop", "logprobs": None}]}))
    with HttpTokenPolicy(fake.base_url, "m", direct.tokenizer, max_retries=1, backoff=0.01) as http:
        (reply,) = http.generate([[1, 2, 3]], greedy(4))
        assert isinstance(reply, FailedReply) and "token_ids" in reply.reason
        body = fake.requests[0].body
        assert (body["prompt"], body["return_token_ids"], body["logprobs"]) == ([1, 2, 3], True, 0)
        assert len(fake.requests) == 2  # malformed replies are retried
    with HttpTokenPolicy(fake.base_url, "m", direct.tokenizer, max_retries=0, on_error="raise") as http:
        with pytest.raises(PolicyError, match="token_ids"):
            http.generate([[1, 2, 3]], greedy(4))


def test_an_eval_config_can_name_the_token_policy(server, tiny_dir, direct):
    """policy.kind=http_tokens: the server's URL and model, and the HF directory whose tokenizer
    renders the prompts (its http keys as kind http; max_reply_chars is not read)."""
    from hsjax import builders
    from hsjax.infra import experiments

    block = experiments.load("common").policy("http_tokens")
    block.base_url, block.model, block.hf_dir, block.max_retries = server.base_url, "tiny", str(tiny_dir), 0
    assert set(builders.policy_unread(block)) == {"policy.noise", "policy.checkpoint", "policy.max_reply_chars"}
    policy = builders.make_policy(block, bench=None, seed=0)
    try:
        assert isinstance(policy, HttpTokenPolicy) and policy.tokenizer.get_vocab() == direct.tokenizer.get_vocab()
        prompt = render_prompt(direct.tokenizer, OTHER)
        assert policy.generate([prompt], greedy(4))[0].ids == direct.generate([prompt], greedy(4))[0].ids
    finally:
        policy.close()
