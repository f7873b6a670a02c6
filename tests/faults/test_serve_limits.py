"""`serve` under hostile clients, on real uvicorn servers on 127.0.0.1: bounded stop strings (400),
a bounded queue (429 with Retry-After, at once), and requests whose clients left dropped before
their generation (the next client does not wait for them)."""
import threading
import time

import httpx
import pytest

from hsjax.llm import server as serve
from hsjax.llm.openai_api import MAX_STOP_CHARS, MAX_STOP_STRINGS
from hsjax.models.tiny import write_tiny_model
from hsjax.models.tokenizer import IM_END, build_tiny_tokenizer
from hsjax.policies.jax_policy import JaxPolicy
from hsjax.policies.scripted import ScriptedTokenPolicy


def ask(text: str, **body) -> dict:
    return {"messages": [{"role": "user", "content": text}], "max_tokens": 8, **body}


def post(server, body, timeout=60.0):
    return httpx.post(server.base_url + "/chat/completions", json=body, timeout=timeout)


def health(server) -> dict:
    return httpx.get(f"http://{server.host}:{server.port}/health").json()


class GatedChat:
    """A chat policy that records every prompt it generates for; prompts containing "slow" take
    `slow_s`, and every call first waits until `gate` is set."""

    def __init__(self, slow_s: float = 0.0):
        self.slow_s, self.gate, self.started = slow_s, threading.Event(), threading.Event()
        self.gate.set()
        self.prompts: list[str] = []

    def chat(self, contexts, sampling):
        self.prompts.extend(c[-1]["content"] for c in contexts)
        self.started.set()
        self.gate.wait(30)
        if any("slow" in c[-1]["content"] for c in contexts):
            time.sleep(self.slow_s)
        return ["ok"] * len(contexts)


def in_thread(fn, *args):
    out = {}

    def run():
        try:
            out["value"] = fn(*args)
        except Exception as e:  # the caller asserts on it
            out["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


# ------------------------------------------------------------------------------------ stop strings


@pytest.fixture(scope="module")
def scripted_server():
    tokenizer = build_tiny_tokenizer()
    policy = ScriptedTokenPolicy(lambda _: "SELECT 1; -- done", tokenizer=tokenizer,
                                 eos_id=tokenizer.convert_tokens_to_ids(IM_END))
    with serve.BackgroundServer(serve.build_app(policy, "scripted")) as server:
        yield server


@pytest.mark.parametrize("stop, why", [
    ([f"s{i}" for i in range(MAX_STOP_STRINGS + 1)], f"holds {MAX_STOP_STRINGS + 1} strings"),
    (["x" * (MAX_STOP_CHARS + 1)], f"has {MAX_STOP_CHARS + 1} characters"),
    ([f"s{i}" for i in range(100_000)], "holds 100000 strings"),
])
def test_too_many_or_too_long_stop_strings_are_a_400(scripted_server, stop, why):
    resp = post(scripted_server, ask("hi", stop=stop))
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == "stop" and error["type"] == "invalid_request_error" and why in error["message"]
    assert len(resp.content) < 2000  # the refused strings are not echoed back


def test_stop_strings_at_the_limits_are_served(scripted_server):
    stop = [";"] + [f"{i}" * MAX_STOP_CHARS for i in range(1, MAX_STOP_STRINGS)]
    resp = post(scripted_server, ask("hi", stop=stop))
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["content"] == "SELECT 1"


def test_the_tiny_model_serves_the_largest_stop_set(tmp_path):
    """The largest stop set the limits allow goes through the real sampler (one bounded shape)."""
    policy = JaxPolicy.from_pretrained(write_tiny_model(tmp_path / "tiny", seed=2), seed=0, batch_buckets=(1,))
    app = serve.build_app(policy, "tiny", max_stop_strings=2, max_stop_chars=MAX_STOP_CHARS)
    with serve.BackgroundServer(app) as server:
        assert post(server, ask("hi", stop=["a", "b", "c"])).status_code == 400
        resp = post(server, ask("hi", stop=["é" * MAX_STOP_CHARS, "\n\n"], temperature=0), timeout=300)
        assert resp.status_code == 200, resp.text


# ---------------------------------------------------------------------------------------- the queue


def test_a_full_queue_is_a_429_with_retry_after_at_once():
    policy = GatedChat()
    app = serve.build_app(policy, "gated", max_batch=1, batch_window_s=0.0, max_queue=2)
    with serve.BackgroundServer(app) as server:
        policy.gate.clear()
        threads = [in_thread(post, server, ask("first"))]
        assert policy.started.wait(10)  # the worker holds the first request
        threads += [in_thread(post, server, ask(f"waiting {i}")) for i in range(2)]
        deadline = time.monotonic() + 10
        while health(server)["waiting"] < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        start = time.monotonic()
        resp = post(server, ask("one too many"))
        elapsed = time.monotonic() - start
        assert resp.status_code == 429 and elapsed < 2.0, (resp.status_code, elapsed)
        assert int(resp.headers["retry-after"]) >= 1
        error = resp.json()["error"]
        assert error["code"] == "queue_full" and "serve.max_queue" in error["message"]
        policy.gate.set()
        for thread, out in threads:
            thread.join(30)
            assert out["value"].status_code == 200
        assert post(server, ask("after")).status_code == 200  # room again
        assert "one too many" not in policy.prompts


# -------------------------------------------------------------------------------------- disconnects


def test_a_request_whose_client_left_is_dropped_before_generation():
    """A slow request holds the worker; a second slow one's client gives up and leaves; the third
    client waits for the first only, and the second is never generated."""
    policy = GatedChat(slow_s=3.0)
    app = serve.build_app(policy, "gated", max_batch=1, batch_window_s=0.0)
    with serve.BackgroundServer(app) as server:
        first = in_thread(post, server, ask("slow first"))
        assert policy.started.wait(10)
        with pytest.raises(httpx.ReadTimeout):
            post(server, ask("slow and impatient"), timeout=0.5)
        start = time.monotonic()
        resp = post(server, ask("fast third"))
        waited = time.monotonic() - start
        first[0].join(30)
        assert first[1]["value"].status_code == 200 and resp.status_code == 200
        assert policy.prompts == ["slow first", "fast third"]
        assert waited < 3.0 + 1.0, waited  # the rest of the first's 3 s, not another 3 s for the second
        assert health(server)["dropped"] == 1
