"""The shared OpenAI-compatible client (hsjax/llm/client.py) against the fake server
(tests/fake_openai.py), the JSON extraction (hsjax/llm/json_extract.py) and the layering rule."""
import ast
import logging
import pathlib
import time

import pytest
from openai.types.chat import ChatCompletion

from hsjax.llm import client as client_lib
from hsjax.llm.client import ChatClient, ClientSettings, LLMError
from hsjax.llm.json_extract import MAX_OBJECT_STARTS, find_json, json_values
from tests.fake_openai import Reply, completion

REPO = pathlib.Path(__file__).resolve().parents[2]
API_KEY = "sk-client-secret-7d41b0"
KEY_ENV = "HSJAX_TEST_CLIENT_KEY"
MSGS = [{"role": "user", "content": "hi"}]
OK = (200, completion("hello"))


@pytest.fixture
def make(openai_server, monkeypatch):
    """(server, client) for a script; the key is exported under KEY_ENV."""
    monkeypatch.setenv(KEY_ENV, API_KEY)
    clients = []

    def make(*script, **kw):
        server = openai_server(*script)
        kw = {"api_key_env": KEY_ENV, "timeout_s": 2.0, "max_retries": 2, "backoff_s": 0.01, **kw}
        clients.append(ChatClient(ClientSettings(server.base_url, "test-model", **kw)))
        return server, clients[-1]

    yield make
    for c in clients:
        c.close()


# ---------------------------------------------------------------------------------------------
# Requests and replies


def test_success_returns_text_attempts_and_typed_response(make):
    server, client = make(OK)
    result = client.complete(MSGS, temperature=0.3, max_tokens=9, seed=2, stop=["END"],
                             extra_body={"top_k": 7})
    assert (result.text, result.attempts) == ("hello", 1)
    assert isinstance(result.response, ChatCompletion) and result.response.choices[0].finish_reason == "stop"
    (req,) = server.requests
    assert req.path == "/v1/chat/completions" and req.headers["Authorization"] == f"Bearer {API_KEY}"
    assert req.body == {"model": "test-model", "messages": MSGS, "temperature": 0.3, "max_tokens": 9,
                        "seed": 2, "stop": ["END"], "top_k": 7}  # parameters left None are not sent


def test_no_authorization_header_without_a_key_env(make, monkeypatch):
    # Ambient OpenAI settings belong to api.openai.com, not to the server base_url names.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-ambient-openai-key")
    monkeypatch.setenv("OPENAI_ORG_ID", "org-ambient")
    server, client = make(OK, api_key_env=None)
    assert client.complete(MSGS).text == "hello"
    headers = server.requests[0].headers
    assert "Authorization" not in headers and "OpenAI-Organization" not in headers
    assert "sk-ambient-openai-key" not in repr(dict(headers))


def test_missing_key_env_is_a_clear_error_before_any_request(make, monkeypatch):
    server, client = make(OK)
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(LLMError, match=f"{KEY_ENV} is unset or empty") as e:
        client.complete(MSGS)
    assert (e.value.reason, e.value.attempts) == ("missing_api_key", 0) and server.requests == []
    monkeypatch.setenv(KEY_ENV, "")
    with pytest.raises(LLMError, match=KEY_ENV):
        client.api_key()
    monkeypatch.setenv(KEY_ENV, "sk-rotated")  # read at every request
    client.complete(MSGS)
    assert server.requests[0].headers["Authorization"] == "Bearer sk-rotated"


def test_null_content_is_empty_text(make):
    _, client = make((200, completion(None)))
    assert client.complete(MSGS).text == ""


# ---------------------------------------------------------------------------------------------
# Retries


def test_5xx_and_429_are_retried_with_attempts_counted(make, caplog):
    server, client = make((500, {"error": "down"}), (429, {"error": "slow down"}), OK)
    result = client.complete(MSGS)
    assert result.attempts == 3 and len(server.requests) == 3
    assert "HTTP 500" in caplog.text and "HTTP 429" in caplog.text and "retry 2/2" in caplog.text


def test_retries_exhausted(make):
    server, client = make((503, "overloaded"))
    with pytest.raises(LLMError, match=r"gave up after 3 attempts; last error: HTTP 503: 'overloaded'") as e:
        client.complete(MSGS)
    assert (e.value.reason, e.value.attempts, len(server.requests)) == ("http_error", 3, 3)


@pytest.mark.parametrize("status", [400, 401, 404, 422])
def test_other_4xx_fail_fast(make, status):
    server, client = make((status, {"error": {"message": "no"}}))
    with pytest.raises(LLMError, match=rf"HTTP {status} \(not retried\).*'test-model'") as e:
        client.complete(MSGS)
    assert (e.value.reason, e.value.attempts, len(server.requests)) == ("http_error", 1, 1)


def test_timeout_is_retried_then_fails(make):
    server, client = make((200, completion("late"), 0.6), timeout_s=0.2, max_retries=1)
    t0 = time.monotonic()
    with pytest.raises(LLMError, match="timed out after 0.2s") as e:
        client.complete(MSGS)
    assert (e.value.reason, e.value.attempts, len(server.requests)) == ("timeout", 2, 2)
    assert time.monotonic() - t0 < 1.5


def test_connection_refused(openai_server):
    gone = openai_server()
    gone.close()
    with ChatClient(ClientSettings(gone.base_url, "m", timeout_s=0.5, max_retries=1, backoff_s=0.01)) as client:
        with pytest.raises(LLMError, match="connection error") as e:
            client.complete(MSGS)
    assert (e.value.reason, e.value.attempts) == ("connection_error", 2)


BAD_REPLIES = {"not_json": (200, "{not json"),
               "text_plain": Reply(200, "hello", headers={"Content-Type": "text/plain"}),
               "no_choices": (200, {"error": "oops"}), "empty_choices": (200, {"choices": []}),
               "no_message": (200, {"choices": [{"index": 0}]}),
               "content_not_text": (200, {"choices": [{"message": {"content": 5}}]}), "a_list": (200, [1, 2])}


@pytest.mark.parametrize("bad", list(BAD_REPLIES))
def test_malformed_retried_when_asked(make, bad):
    server, client = make(BAD_REPLIES[bad], OK)
    assert client.complete(MSGS).attempts == 2
    server, client = make(BAD_REPLIES[bad])
    with pytest.raises(LLMError, match="malformed reply") as e:
        client.complete(MSGS)
    assert (e.value.reason, e.value.attempts) == ("malformed", 3)


@pytest.mark.parametrize("bad", list(BAD_REPLIES))
def test_malformed_not_retried_when_off(make, bad):
    server, client = make(BAD_REPLIES[bad], OK, retry_malformed=False)
    with pytest.raises(LLMError, match=r"malformed reply .*\(not retried\)") as e:
        client.complete(MSGS)
    assert (e.value.reason, e.value.attempts, len(server.requests)) == ("malformed", 1, 1)


def gap(server) -> float:
    return server.requests[1].time - server.requests[0].time


def test_retry_after_is_honoured(make):
    server, client = make(Reply(429, {"error": "rate"}, headers={"Retry-After": "1"}), OK, backoff_s=0.01)
    assert client.complete(MSGS).attempts == 2
    assert 0.9 <= gap(server) < 1.6


def test_retry_after_is_capped_at_max_backoff(make):
    server, client = make(Reply(503, "busy", headers={"Retry-After": "30"}), OK, backoff_s=0.01,
                          max_backoff_s=0.2)
    assert client.complete(MSGS).attempts == 2
    assert 0.15 <= gap(server) < 0.9


def test_retry_schedule_is_pure():
    d = client_lib.retry_delay
    assert [d(n, 0.5, 30.0) for n in (1, 2, 3)] == [0.5, 1.0, 2.0]
    assert d(10, 1.0, 30.0) == 30.0
    assert d(1, 0.01, 30.0, retry_after_s=1.0) == 1.0 and d(3, 1.0, 30.0, retry_after_s=1.0) == 4.0
    assert d(1, 0.01, 0.2, retry_after_s=30.0) == 0.2
    p = client_lib.parse_retry_after
    assert (p("2"), p("0.5"), p(None), p("Wed, 21 Oct 2015 07:28:00 GMT"), p("-1"), p("nan")) == (
        2.0, 0.5, None, None, None, None)


# ---------------------------------------------------------------------------------------------
# Redaction


def test_echoed_key_is_redacted_from_errors_and_logs(make, caplog):
    caplog.set_level(logging.DEBUG)
    # A body long enough that the key straddles the quoting limit: redaction must come before the cut.
    echo = lambda req: (500, {"pad": "x" * 170, "error": f"bad auth {req.headers['Authorization']}"})  # noqa: E731
    server, client = make(echo, max_retries=1)
    with pytest.raises(LLMError) as e:
        client.complete(MSGS)
    text = f"{e.value} {e.value.detail} {e.value!r} {caplog.text} {client!r}"
    assert "HTTP 500" in caplog.text and API_KEY[:8] not in text
    server, client = make(lambda req: (400, f"key was {req.headers['Authorization']}"))
    with pytest.raises(LLMError, match=r"\[REDACTED\]") as e:
        client.complete(MSGS)
    assert API_KEY not in str(e.value) and e.value.__cause__ is None and e.value.__suppress_context__
    assert client_lib.redact(f"a {API_KEY} b {API_KEY}", API_KEY) == "a [REDACTED] b [REDACTED]"
    assert client_lib.redact("text", None) == "text"


# ---------------------------------------------------------------------------------------------
# Settings and lifecycle


def test_settings_are_checked():
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        ClientSettings("http://x/v1", "m", timeout_s=0)
    with pytest.raises(ValueError, match="base_url and a model"):
        ClientSettings("", "m")
    with pytest.raises(ValueError, match="reason"):
        LLMError("nope", "x")


def test_context_manager_closes_the_sdk_client(openai_server):
    server = openai_server(OK)
    with ChatClient(ClientSettings(server.base_url, "m")) as client:
        client.complete(MSGS)
    assert client._sdk.is_closed()


# ---------------------------------------------------------------------------------------------
# JSON extraction


def pick(key):
    return lambda value, whole: value.get(key) if isinstance(value, dict) else None


def test_json_values_order_and_wholeness():
    text = 'Sure.\n```json\n["a", "b"]\n```\nAlso {"x": {"y": 1}} and [1, 2]'
    assert list(json_values(text)) == [(["a", "b"], True), ({"x": {"y": 1}}, False), ({"y": 1}, False)]
    assert list(json_values('{"k": 1}')) == [({"k": 1}, True), ({"k": 1}, False)]
    assert find_json("```python\n{\"k\": 2}\n```", pick("k")) == 2
    assert find_json('prose {"a": 1} then {"k": 3} end', pick("k")) == 3
    assert find_json("no json at all", pick("k")) is None


def test_extraction_is_bounded():
    # CPU time of this process, not wall time: other test workers on a loaded machine stretched
    # the wall to 1.6 s for 0.1 s of work. A quadratic scan of these inputs takes many seconds.
    for text in ("{" * 200_000, '{"a": [' * 30_000, "[" * 200_000, "```" * 60_000):
        t0 = time.process_time()
        assert find_json(text, pick("k")) is None
        assert time.process_time() - t0 < 0.5, text[:10]
    # Objects after MAX_OBJECT_STARTS braces are not looked for.
    assert find_json("{ " * (MAX_OBJECT_STARTS - 1) + '{"k": 1}', pick("k")) == 1
    assert find_json("{ " * MAX_OBJECT_STARTS + '{"k": 1}', pick("k")) is None


# ---------------------------------------------------------------------------------------------
# Layering


def project_imports(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return {n for n in names if n.startswith("hsjax")}


@pytest.mark.parametrize("package,forbidden", [
    ("hsjax/llm", ("hsjax.harness_s", "hsjax.modes", "hsjax.builders")),
    ("hsjax/rollout", ("hsjax.llm",)),
])
def test_layering(package, forbidden):
    bad = {f"{p.relative_to(REPO)}: {name}" for p in (REPO / package).glob("*.py")
           for name in project_imports(p) if name.startswith(forbidden)}
    assert not bad, f"{package} must not import {forbidden}: {sorted(bad)}"
