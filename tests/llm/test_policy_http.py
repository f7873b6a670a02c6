"""HttpChatPolicy against a real HTTP server on 127.0.0.1 (stdlib, in a thread)."""
import http.server
import json
import logging
import threading
import time

import pytest

from hsjax.rollout.policy import HttpChatPolicy, PolicyError, SamplingParams

API_KEY = "sk-test-secret-5f2a9c"


class FakeServer:
    """Answers POST /v1/chat/completions from a script of actions, one per request.

    Actions: "ok" (echo the last message), "500", "429", "400", "slow" (sleep past the client's
    timeout, then answer), "badjson", "nochoices". The last action repeats when the script runs out.
    """

    def __init__(self, script):
        self.script = list(script)
        self.requests = []
        self.lock = threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.requests.append({"path": self.path, "headers": dict(self.headers),
                                            "body": body})
                    action = server.script.pop(0) if len(server.script) > 1 else server.script[0]
                if action == "slow":
                    time.sleep(0.6)
                    action = "ok"
                if action == "ok":
                    reply = "echo: " + body["messages"][-1]["content"]
                    self._send(200, json.dumps({"choices": [{"message": {
                        "role": "assistant", "content": reply}, "finish_reason": "stop"}]}))
                elif action == "badjson":
                    self._send(200, "{not json")
                elif action == "nochoices":
                    self._send(200, json.dumps({"error": "oops"}))
                else:
                    self._send(int(action), json.dumps({"error": f"status {action}"}))

            def _send(self, code, text):
                data = text.encode()
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,),
                                       daemon=True)
        self.thread.start()
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve(monkeypatch):
    monkeypatch.setenv("HSJAX_TEST_KEY", API_KEY)
    servers = []

    def make(script, **kw):
        server = FakeServer(script)
        servers.append(server)
        kw = {"timeout": 2.0, "max_retries": 2, "backoff": 0.01, **kw}
        return server, HttpChatPolicy(server.base_url, "test-model", "HSJAX_TEST_KEY", **kw)

    yield make
    for s in servers:
        s.close()


MSGS = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


def test_success_sends_openai_payload_and_bearer_key_never_logged(serve, caplog):
    caplog.set_level(logging.DEBUG)
    server, policy = serve(["ok"])
    sampling = SamplingParams(temperature=0.5, top_p=0.9, max_new_tokens=17, stop_strings=("END",))
    assert policy.chat([MSGS], sampling, [{}]) == ["echo: hi"]
    (req,) = server.requests
    assert req["path"] == "/v1/chat/completions"
    assert req["headers"]["Authorization"] == f"Bearer {API_KEY}"
    body = req["body"]
    assert body["model"] == "test-model" and body["messages"] == MSGS
    assert (body["temperature"], body["top_p"], body["max_tokens"], body["stop"]) == (
        0.5, 0.9, 17, ["END"])
    assert API_KEY not in caplog.text and API_KEY not in repr(policy)


def test_greedy_sends_temperature_zero(serve):
    server, policy = serve(["ok"])
    policy.chat([MSGS], SamplingParams(greedy=True))
    assert server.requests[0]["body"]["temperature"] == 0.0
    assert "stop" not in server.requests[0]["body"]


def test_many_contexts_concurrently_in_order(serve):
    server, policy = serve(["ok"], max_concurrency=4)
    contexts = [[{"role": "user", "content": f"q{i}"}] for i in range(9)]
    assert policy.chat(contexts, SamplingParams()) == [f"echo: q{i}" for i in range(9)]
    assert len(server.requests) == 9


def test_500_is_retried_then_succeeds(serve, caplog):
    caplog.set_level(logging.DEBUG)
    server, policy = serve(["500", "500", "ok"])
    assert policy.chat([MSGS], SamplingParams()) == ["echo: hi"]
    assert len(server.requests) == 3
    assert "HTTP 500" in caplog.text and API_KEY not in caplog.text


def test_500_every_time_raises_after_retries(serve):
    server, policy = serve(["500"])
    with pytest.raises(PolicyError, match=r"gave up after 3 attempts.*HTTP 500"):
        policy.chat([MSGS], SamplingParams())
    assert len(server.requests) == 3


def test_429_is_retried(serve):
    server, policy = serve(["429", "ok"])
    assert policy.chat([MSGS], SamplingParams()) == ["echo: hi"]
    assert len(server.requests) == 2


def test_400_fails_at_once(serve):
    server, policy = serve(["400"])
    with pytest.raises(PolicyError, match=r"HTTP 400 \(not retried\)"):
        policy.chat([MSGS], SamplingParams())
    assert len(server.requests) == 1


def test_timeout_is_retried_then_raises(serve):
    server, policy = serve(["slow"], timeout=0.2, max_retries=1)
    t0 = time.perf_counter()
    with pytest.raises(PolicyError, match="timed out"):
        policy.chat([MSGS], SamplingParams())
    assert len(server.requests) == 2
    assert time.perf_counter() - t0 < 2.0


def test_timeout_then_success(serve):
    server, policy = serve(["slow", "ok"], timeout=0.2)
    assert policy.chat([MSGS], SamplingParams()) == ["echo: hi"]


@pytest.mark.parametrize("bad", ["badjson", "nochoices"])
def test_malformed_reply_raises_clear_error_after_retries(serve, bad):
    server, policy = serve([bad])
    with pytest.raises(PolicyError, match="malformed reply"):
        policy.chat([MSGS], SamplingParams())
    assert len(server.requests) == 3


def test_malformed_then_ok_succeeds(serve):
    server, policy = serve(["badjson", "ok"])
    assert policy.chat([MSGS], SamplingParams()) == ["echo: hi"]


def test_on_error_empty_returns_empty_string(serve, caplog):
    server, policy = serve(["400"], on_error="empty")
    contexts = [MSGS, MSGS]
    assert policy.chat(contexts, SamplingParams()) == ["", ""]
    assert "empty string" in caplog.text


def test_connection_refused_is_retried_then_raises():
    policy = HttpChatPolicy("http://127.0.0.1:9/v1", "m", timeout=0.5, max_retries=1,
                            backoff=0.01)
    with pytest.raises(PolicyError, match="connection error"):
        policy.chat([MSGS], SamplingParams())


def test_missing_api_key_env_names_the_variable(monkeypatch):
    monkeypatch.delenv("HSJAX_NO_SUCH_KEY", raising=False)
    with pytest.raises(PolicyError, match="HSJAX_NO_SUCH_KEY"):
        HttpChatPolicy("http://127.0.0.1:9/v1", "m", api_key_env="HSJAX_NO_SUCH_KEY")
