"""HttpChatPolicy against the fake OpenAI-compatible server (tests/fake_openai.py) on 127.0.0.1."""
import json
import logging
import time

import pytest

from hsjax.llm.http_policy import HttpChatPolicy, parse_chat_completion
from hsjax.rollout.policy import PolicyError, SamplingParams
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


def test_500_every_time_raises_after_retries(serve):
    server, policy = serve(ERR[500])
    with pytest.raises(PolicyError, match=r"gave up after 3 attempts.*HTTP 500"):
        policy.chat([MSGS], SamplingParams())
    assert len(server.requests) == 3


def test_429_is_retried(serve):
    server, policy = serve(ERR[429], echo)
    assert policy.chat([MSGS], SamplingParams()) == ["echo: hi"]
    assert len(server.requests) == 2


def test_400_fails_at_once(serve):
    server, policy = serve(ERR[400])
    with pytest.raises(PolicyError, match=r"HTTP 400 \(not retried\)"):
        policy.chat([MSGS], SamplingParams())
    assert len(server.requests) == 1


def test_timeout_is_retried_then_raises(serve):
    server, policy = serve(SLOW, timeout=0.2, max_retries=1)
    t0 = time.perf_counter()
    with pytest.raises(PolicyError, match="timed out"):
        policy.chat([MSGS], SamplingParams())
    assert len(server.requests) == 2
    assert time.perf_counter() - t0 < 2.0


def test_timeout_then_success(serve):
    server, policy = serve(SLOW, echo, timeout=0.2)
    assert policy.chat([MSGS], SamplingParams()) == ["echo: hi"]


@pytest.mark.parametrize("bad", [BAD_JSON, NO_CHOICES], ids=["badjson", "nochoices"])
def test_malformed_reply_raises_clear_error_after_retries(serve, bad):
    server, policy = serve(bad)
    with pytest.raises(PolicyError, match="malformed reply"):
        policy.chat([MSGS], SamplingParams())
    assert len(server.requests) == 3


def test_malformed_then_ok_succeeds(serve):
    server, policy = serve(BAD_JSON, echo)
    assert policy.chat([MSGS], SamplingParams()) == ["echo: hi"]


def test_null_content_is_an_empty_reply(serve):
    server, policy = serve((200, completion(None)))
    assert policy.chat([MSGS], SamplingParams()) == [""]
    assert len(server.requests) == 1


def test_on_error_empty_returns_empty_string(serve, caplog):
    server, policy = serve(ERR[400], on_error="empty")
    contexts = [MSGS, MSGS]
    assert policy.chat(contexts, SamplingParams()) == ["", ""]
    assert "empty string" in caplog.text


def test_connection_refused_is_retried_then_raises(openai_server):
    gone = openai_server()
    gone.close()
    policy = HttpChatPolicy(gone.base_url, "m", timeout=0.5, max_retries=1, backoff=0.01)
    with pytest.raises(PolicyError, match="connection error"):
        policy.chat([MSGS], SamplingParams())


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
