"""HttpChatPolicy against the fake OpenAI-compatible server (tests/fake_openai.py) on 127.0.0.1."""
import json
import logging
import re
import time

import pytest

from hsjax.policies.base import EndpointDown, FailedReply, PolicyError, SamplingParams
from hsjax.policies.http_chat import CHARS_PER_TOKEN, HttpChatPolicy, parse_chat_completion
from tests.fake_openai import completion

API_KEY = "sk-test-secret-5f2a9c"


def echo(request):
    """A reply echoing the last message, as the policy's replies are checked against it."""
    return 200, completion("echo: " + request.body["messages"][-1]["content"])


SLOW = (200, completion("late"), 0.6)  # past the 0.2 s timeout of the timeout tests
ERR = {code: (code, {"error": f"status {code}"}) for code in (400, 429, 500)}
BAD_JSON = (200, "{not json")
NO_CHOICES = (200, {"error": "oops"})


@pytest.fixture
def serve(openai_server, monkeypatch):
    monkeypatch.setenv("HSJAX_TEST_KEY", API_KEY)

    def make(*script, **kw):
        server = openai_server(*script)
        kw = {"timeout": 2.0, "max_retries": 2, "backoff": 0.01, **kw}
        return server, HttpChatPolicy(server.base_url, "test-model", "HSJAX_TEST_KEY", **kw)

    return make


MSGS = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


def failure(policy, sampling=None) -> str:
    """The reason of the `FailedReply` a one-context `chat` gives (failing if it gives a reply)."""
    (reply,) = policy.chat([MSGS], sampling or SamplingParams())
    assert isinstance(reply, FailedReply), reply
    return reply.reason


def test_success_sends_openai_payload_and_bearer_key_never_logged(serve, caplog):
    caplog.set_level(logging.DEBUG)
    server, policy = serve(echo)
    sampling = SamplingParams(temperature=0.5, top_p=0.9, max_new_tokens=17, stop_strings=("END",), seed=4)
    assert policy.chat([MSGS], sampling, [{}]) == ["echo: hi"]
    (req,) = server.requests
    assert req.path == "/v1/chat/completions"
    assert req.headers["Authorization"] == f"Bearer {API_KEY}"
    body = req.body
    assert body["model"] == "test-model" and body["messages"] == MSGS
    assert (body["temperature"], body["top_p"], body["max_tokens"], body["stop"], body["seed"]) == (
        0.5, 0.9, 17, ["END"], 4)
    assert "top_k" not in body
    assert API_KEY not in caplog.text and API_KEY not in repr(policy)


def test_greedy_sends_temperature_zero(serve):
    server, policy = serve(echo)
    policy.chat([MSGS], SamplingParams(greedy=True, top_k=5, top_p=0.5))
    body = server.requests[0].body
    assert (body["temperature"], body["top_p"]) == (0.0, 1.0)
    assert "stop" not in body and "top_k" not in body


def test_top_k_and_extra_body_go_in_the_body(serve):
    server, policy = serve(echo, extra_body={"repetition_penalty": 1.1, "top_p": 0.7})
    policy.chat([MSGS], SamplingParams(top_k=20, top_p=0.9))
    body = server.requests[0].body
    # top_k is a vLLM/SGLang field; the config's extra_body is merged last and wins.
    assert (body["top_k"], body["repetition_penalty"], body["top_p"]) == (20, 1.1, 0.7)


def test_many_contexts_concurrently_in_order(serve):
    server, policy = serve(echo, max_concurrency=4)
    contexts = [[{"role": "user", "content": f"q{i}"}] for i in range(9)]
    assert policy.chat(contexts, SamplingParams()) == [f"echo: q{i}" for i in range(9)]
    assert len(server.requests) == 9


def test_500_is_retried_then_succeeds(serve, caplog):
    caplog.set_level(logging.DEBUG)
    server, policy = serve(ERR[500], ERR[500], echo)
    assert policy.chat([MSGS], SamplingParams()) == ["echo: hi"]
    assert len(server.requests) == 3
    assert "HTTP 500" in caplog.text and API_KEY not in caplog.text


def test_500_every_time_fails_the_context_after_retries(serve):
    server, policy = serve(ERR[500])
    assert re.search(r"gave up after 3 attempts.*HTTP 500", failure(policy))
    assert len(server.requests) == 3


def test_on_error_raise_raises_policy_error(serve):
    server, policy = serve(ERR[500], on_error="raise")
    with pytest.raises(PolicyError, match=r"gave up after 3 attempts.*HTTP 500"):
        policy.chat([MSGS, MSGS], SamplingParams())


def test_429_is_retried(serve):
    server, policy = serve(ERR[429], echo)
    assert policy.chat([MSGS], SamplingParams()) == ["echo: hi"]
    assert len(server.requests) == 2


def test_400_fails_at_once(serve):
    server, policy = serve(ERR[400])
    assert "HTTP 400 (not retried)" in failure(policy)
    assert len(server.requests) == 1


def test_timeout_is_retried_then_fails(serve):
    server, policy = serve(SLOW, timeout=0.2, max_retries=1)
    t0 = time.perf_counter()
    assert "timed out" in failure(policy)
    assert len(server.requests) == 2
    assert time.perf_counter() - t0 < 2.0


def test_timeout_then_success(serve):
    server, policy = serve(SLOW, echo, timeout=0.2)
    assert policy.chat([MSGS], SamplingParams()) == ["echo: hi"]


@pytest.mark.parametrize("bad", [BAD_JSON, NO_CHOICES], ids=["badjson", "nochoices"])
def test_malformed_reply_fails_with_a_clear_reason_after_retries(serve, bad):
    server, policy = serve(bad)
    assert "malformed reply" in failure(policy)
    assert len(server.requests) == 3


def test_malformed_then_ok_succeeds(serve):
    server, policy = serve(BAD_JSON, echo)
    assert policy.chat([MSGS], SamplingParams()) == ["echo: hi"]


def test_null_content_is_an_empty_reply(serve):
    server, policy = serve((200, completion(None)))
    assert policy.chat([MSGS], SamplingParams()) == [""]
    assert len(server.requests) == 1


def test_one_failing_context_does_not_fail_the_others(serve):
    server, policy = serve(lambda req: ERR[400] if req.body["messages"][-1]["content"] == "bad" else echo(req))
    contexts = [[{"role": "user", "content": c}] for c in ("a", "bad", "b")]
    a, bad, b = policy.chat(contexts, SamplingParams())
    assert (a, b) == ("echo: a", "echo: b") and "HTTP 400" in bad.reason


def test_connection_refused_is_retried_then_fails(openai_server):
    gone = openai_server()
    gone.close()
    policy = HttpChatPolicy(gone.base_url, "m", timeout=0.5, max_retries=1, backoff=0.01)
    assert "connection error" in failure(policy)


def test_missing_api_key_env_names_the_variable(monkeypatch):
    monkeypatch.delenv("HSJAX_NO_SUCH_KEY", raising=False)
    with pytest.raises(PolicyError, match="HSJAX_NO_SUCH_KEY"):
        HttpChatPolicy("http://127.0.0.1:9/v1", "m", api_key_env="HSJAX_NO_SUCH_KEY")


def test_parse_chat_completion():
    assert parse_chat_completion(json.dumps(completion("hi"))) == "hi"
    assert parse_chat_completion(json.dumps(completion(None))) == ""
    for bad in ("{not json", "[1, 2]", json.dumps({"error": "oops"}), json.dumps({"choices": []}),
                json.dumps({"choices": [{"message": {"content": 5}}]})):
        with pytest.raises(ValueError):
            parse_chat_completion(bad)


def test_the_breaker_trips_after_consecutive_failures_and_names_the_endpoint(serve):
    server, policy = serve(ERR[400], max_consecutive_failures=3)
    assert isinstance(policy.chat([MSGS, MSGS], SamplingParams())[1], FailedReply)
    with pytest.raises(EndpointDown, match=r"looks down: 3 requests in a row failed .*HTTP 400.*"
                                           r"policy.max_consecutive_failures") as e:
        policy.chat([MSGS], SamplingParams())
    assert server.base_url in str(e.value) and isinstance(e.value, PolicyError)
    with pytest.raises(EndpointDown):  # once down, no more requests
        policy.chat([MSGS], SamplingParams())
    assert len(server.requests) == 3


def test_a_success_resets_the_breaker(serve):
    server, policy = serve(ERR[400], ERR[400], echo, ERR[400], ERR[400], echo, max_consecutive_failures=3)
    replies = [policy.chat([MSGS], SamplingParams())[0] for _ in range(6)]
    assert [isinstance(r, FailedReply) for r in replies] == [True, True, False, True, True, False]
    assert policy.consecutive_failures == 0


def test_a_reply_longer_than_max_tokens_allows_is_cut_and_counted(serve, caplog):
    server, policy = serve((200, completion("y" * 1000)))
    assert policy.chat([MSGS], SamplingParams(max_new_tokens=4)) == ["y" * 4 * CHARS_PER_TOKEN]
    assert policy.truncated_replies == 1 and "was cut to 64" in caplog.text
    server, policy = serve((200, completion("y" * 1000)), max_reply_chars=10)
    assert policy.chat([MSGS], SamplingParams(max_new_tokens=100)) == ["y" * 10]


def test_a_key_echoed_in_a_reply_never_reaches_the_episode(serve):
    server, policy = serve(lambda req: (200, completion(f"your key is {req.headers['Authorization']}")))
    assert policy.chat([MSGS], SamplingParams()) == ["your key is Bearer [REDACTED]"]
