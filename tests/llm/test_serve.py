"""The OpenAI-compatible server against real uvicorn servers on 127.0.0.1 (ephemeral ports)."""
import json
import logging
import re
import threading

import httpx
import jax
import ml_collections
import numpy as np
import pytest

from hsjax.llm import server as serve
from hsjax.modes import serve as serve_mode
from hsjax.models.tiny import write_tiny_model
from hsjax.infra.checkpoint import Checkpointer
from hsjax.models import get_preset, init_params
from hsjax.models.tokenizer import IM_END, build_tiny_tokenizer
from hsjax.harness_s.router.voters import LLMVoter, VoteRequest, VoterSpec, vote_all
from hsjax.policies.base import PolicyError, SamplingParams
from hsjax.policies.http_chat import HttpChatPolicy
from hsjax.policies.jax_policy import JaxPolicy
from hsjax.policies.scripted import ScriptedTokenPolicy
from hsjax.policies.tokens import render_prompt
from tests.serve_process import tiny_server

MESSAGES = [{"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": "Which table holds the orders?"}]
SQL_MESSAGES = [{"role": "user", "content": "SELECT name FROM users"}]
CANDIDATES = ("lenient_parse", "schema_reminder", "verify_answer")
API_KEY = "sk-serve-secret-5d2a81"


# ---------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    # Seed 2: greedy replies of this random model differ between MESSAGES and SQL_MESSAGES.
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny_model", seed=2)


class CountingSampler:
    """Wraps a policy's sampler and counts its generate calls (the batching ground truth)."""

    def __init__(self, sampler):
        self.inner, self.calls = sampler, 0

    def generate(self, *args, **kwargs):
        self.calls += 1
        return self.inner.generate(*args, **kwargs)


@pytest.fixture(scope="module")
def jax_server(tiny_dir):
    # One batch bucket: every test's batch shares the compiled programs.
    policy = JaxPolicy.from_pretrained(tiny_dir, seed=0, batch_buckets=(8,))
    policy.sampler = CountingSampler(policy.sampler)
    app = serve.build_app(policy, "tiny", max_batch=8, batch_window_s=0.2)
    with serve.BackgroundServer(app) as server:
        yield server, policy


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def ranking_policy(tokenizer):
    """A deterministic token policy that ranks the prompt's candidates in reverse order."""
    def reply(prompt_ids):
        prompt = tokenizer.decode(prompt_ids, skip_special_tokens=False)
        names = json.loads(re.findall(r"Candidates: (\[.*?\])", prompt)[-1])
        return json.dumps({"ranking": names[::-1]})

    return ScriptedTokenPolicy(reply, tokenizer=tokenizer, eos_id=tokenizer.convert_tokens_to_ids(IM_END))


@pytest.fixture(scope="module")
def stub_server(tokenizer):
    app = serve.build_app(ranking_policy(tokenizer), "stub-ranker", max_context=1024)
    with serve.BackgroundServer(app) as server:
        yield server


def post(server, body, headers=None, timeout=120.0):
    return httpx.post(server.base_url + "/chat/completions", json=body, headers=headers,
                      timeout=timeout)


def vote_request():
    cards = {name: f"rescued 3/{i + 5} failures" for i, name in enumerate(CANDIDATES)}
    return VoteRequest(task={"task_id": "dev-0007", "type": "select", "question": "How many orders?"},
                       group_summary="4/4 failed: sql_error_loop x4", cards=cards,
                       candidates=CANDIDATES)


# ---------------------------------------------------------------------------- the JAX policy


def test_chat_completion_schema_and_greedy_parity(jax_server, tiny_dir):
    server, policy = jax_server
    resp = post(server, {"model": "tiny", "messages": MESSAGES, "temperature": 0, "max_tokens": 8})
    assert resp.status_code == 200, resp.text
    data = resp.json()
    assert data["id"].startswith("chatcmpl-") and data["object"] == "chat.completion"
    assert data["model"] == "tiny" and isinstance(data["created"], int)
    (choice,) = data["choices"]
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] in ("stop", "length")
    direct = JaxPolicy.from_pretrained(tiny_dir, seed=0, batch_buckets=(8,))
    greedy = SamplingParams(greedy=True, max_new_tokens=8)
    assert choice["message"]["content"] == direct.chat([MESSAGES], greedy)[0]
    sql = post(server, {"messages": SQL_MESSAGES, "temperature": 0, "max_tokens": 8}).json()
    sql_reply = sql["choices"][0]["message"]["content"]
    assert sql_reply == direct.chat([SQL_MESSAGES], greedy)[0]
    assert sql_reply != choice["message"]["content"]
    usage = data["usage"]
    assert usage["prompt_tokens"] == len(render_prompt(policy.tokenizer, MESSAGES))
    assert 1 <= usage["completion_tokens"] <= 8
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]

    models = httpx.get(server.base_url + "/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny"] and models["object"] == "list"
    health = httpx.get(f"http://{server.host}:{server.port}/health").json()
    assert health["status"] == "ok" and health["requests"] >= 1


def test_http_chat_policy_gets_replies(jax_server):
    server, _ = jax_server
    contexts = [MESSAGES, [{"role": "user", "content": "hi"}], [{"role": "user", "content": "SELECT 1"}]]
    with HttpChatPolicy(server.base_url, "tiny", max_retries=0, timeout=120.0) as http_policy:
        replies = http_policy.chat(contexts, SamplingParams(greedy=True, max_new_tokens=8))
        assert len(replies) == 3 and all(isinstance(r, str) for r in replies)
        sampled = http_policy.chat(contexts[:1], SamplingParams(temperature=0.8, top_p=0.9,
                                                                max_new_tokens=8, seed=3))
        assert isinstance(sampled[0], str)
    with HttpChatPolicy(server.base_url, "not-served", max_retries=0, on_error="raise") as wrong_model:
        with pytest.raises(PolicyError, match="404"):
            wrong_model.chat([MESSAGES], SamplingParams(greedy=True, max_new_tokens=8))


def test_concurrent_requests_are_batched(jax_server):
    server, policy = jax_server
    calls_before = policy.sampler.calls
    num = 6
    barrier = threading.Barrier(num)
    statuses = [None] * num

    def one(i):
        barrier.wait()
        body = {"model": "tiny", "messages": [{"role": "user", "content": f"question {i}"}],
                "temperature": 0, "max_tokens": 8}
        statuses[i] = post(server, body).status_code

    threads = [threading.Thread(target=one, args=(i,)) for i in range(num)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert statuses == [200] * num
    sampler_calls = policy.sampler.calls - calls_before
    assert 1 <= sampler_calls < num
    health = httpx.get(f"http://{server.host}:{server.port}/health").json()
    assert health["largest_batch"] >= 2


def test_random_model_as_voter_is_counted_never_raises(jax_server):
    server, _ = jax_server
    voter = LLMVoter(VoterSpec(name="local", base_url=server.base_url, model="tiny",
                               max_tokens=16, timeout_s=120.0, max_retries=0))
    try:
        outcome = vote_all([voter], vote_request())
    finally:
        voter.close()
    result = outcome.results["local"]
    assert result.attempts == 1  # the HTTP call itself succeeded; the reply is judged
    assert result.status in ("ok", "malformed", "unknown_names")
    assert sum(v for k, v in outcome.counters.items() if k != "cache_hit") == 1
    assert (result.status == "ok") == ("local" in outcome.rankings)


def test_too_long_prompt_for_the_model_is_400(jax_server):
    server, policy = jax_server
    long_text = "orders customers " * 3000
    assert len(render_prompt(policy.tokenizer, [{"role": "user", "content": long_text}])) > 4096
    resp = post(server, {"messages": [{"role": "user", "content": long_text}], "max_tokens": 8})
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "context_length_exceeded"


# -------------------------------------------------------------------------- injected policies


def test_voter_parses_a_ranking_end_to_end(stub_server):
    voter = LLMVoter(VoterSpec(name="stub", base_url=stub_server.base_url, model="stub-ranker",
                               max_retries=0))
    try:
        outcome = vote_all([voter], vote_request())
    finally:
        voter.close()
    assert outcome.failures == {}
    assert outcome.rankings == {"stub": list(CANDIDATES[::-1])}
    assert outcome.counters == {"ok": 1}


def test_stop_strings_are_cut_from_the_reply(tokenizer):
    eos = tokenizer.convert_tokens_to_ids(IM_END)
    policy = ScriptedTokenPolicy(lambda _: "SELECT id FROM orders; -- done", tokenizer=tokenizer,
                                 eos_id=eos)
    with serve.BackgroundServer(serve.build_app(policy, "scripted")) as server:
        body = {"messages": MESSAGES, "max_tokens": 64}
        full = post(server, body).json()["choices"][0]
        assert full["message"]["content"] == "SELECT id FROM orders; -- done"
        cut = post(server, {**body, "stop": [";", "--"]}).json()["choices"][0]
        assert cut["message"]["content"] == "SELECT id FROM orders"
        assert cut["finish_reason"] == "stop"
        short = post(server, {**body, "max_tokens": 2}).json()
        assert short["choices"][0]["finish_reason"] == "length"
        assert short["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("body, status, param", [
    ({"model": "stub-ranker"}, 400, "messages"),
    ({"messages": []}, 400, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 7}]}, 400, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "hi"}], "n": 9}, 400, "n"),  # more than max_batch (8)
    ({"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}, 400, "stream"),
    ({"messages": [{"role": "user", "content": "hi"}], "temperature": -1}, 400, "temperature"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, 400, "max_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "stop": [1]}, 400, "stop"),
    ({"messages": [{"role": "user", "content": "word " * 400}]}, 400, "messages"),
    ({"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}, 404, "model"),
    ([1, 2], 400, None),
])
def test_bad_requests_get_openai_errors(stub_server, body, status, param):
    resp = post(stub_server, body)
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert error["param"] == param


def test_malformed_json_and_unknown_route(stub_server):
    resp = httpx.post(stub_server.base_url + "/chat/completions", content=b"{not json",
                      headers={"Content-Type": "application/json"})
    assert resp.status_code == 400 and "not valid JSON" in resp.json()["error"]["message"]
    resp = httpx.get(stub_server.base_url + "/embeddings")
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"


def test_internal_failure_is_500_and_the_worker_survives(tokenizer):
    eos = tokenizer.convert_tokens_to_ids(IM_END)

    def reply(prompt_ids):
        if "explode" in tokenizer.decode(prompt_ids):
            raise RuntimeError("device fell over" + " at /some/internal/path" * 10_000)
        return "fine"

    policy = ScriptedTokenPolicy(reply, tokenizer=tokenizer, eos_id=eos)
    with serve.BackgroundServer(serve.build_app(policy, "fragile")) as server:
        resp = post(server, {"messages": [{"role": "user", "content": "explode"}]})
        assert resp.status_code == 500
        error = resp.json()["error"]
        assert error["type"] == "server_error" and "device fell over" in error["message"]
        assert len(error["message"]) < 200, len(error["message"])  # the exception's text is quoted, never whole
        ok = post(server, {"messages": [{"role": "user", "content": "hello"}]})
        assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == "fine"


def test_bearer_auth_and_the_key_never_logged(tokenizer, monkeypatch, caplog):
    monkeypatch.setenv("HSJAX_SERVE_TEST_KEY", API_KEY)
    caplog.set_level(logging.DEBUG)
    def never_loaded(path):
        raise AssertionError(f"a weight push without the key reached the loader: {path}")

    app = serve.build_app(ranking_policy(tokenizer), "stub-ranker", api_key_env="HSJAX_SERVE_TEST_KEY",
                          load_weights=never_loaded)
    with serve.BackgroundServer(app, log_level="debug") as server:
        body = {"messages": vote_request().messages()}
        assert post(server, body).status_code == 401
        push = httpx.post(f"http://{server.host}:{server.port}/update_weights_from_disk", json={"model_path": "/"})
        assert push.status_code == 401  # the weight push takes the key like /v1/*
        wrong = post(server, body, headers={"Authorization": "Bearer sk-wrong"})
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(server.base_url + "/models").status_code == 401
        assert post(server, body, headers={"Authorization": f"Bearer {API_KEY}"}).status_code == 200
        assert httpx.get(f"http://{server.host}:{server.port}/health").status_code == 200
        voter = LLMVoter(VoterSpec(name="keyed", base_url=server.base_url, model="stub-ranker",
                                   api_key_env="HSJAX_SERVE_TEST_KEY", max_retries=0))
        try:
            assert vote_all([voter], vote_request()).rankings == {"keyed": list(CANDIDATES[::-1])}
        finally:
            voter.close()
    assert API_KEY not in caplog.text
    monkeypatch.delenv("HSJAX_SERVE_TEST_KEY")
    with pytest.raises(ValueError, match="HSJAX_SERVE_TEST_KEY is unset"):
        serve.build_app(ranking_policy(tokenizer), "x", api_key_env="HSJAX_SERVE_TEST_KEY")


# ------------------------------------------------------------------------ loading and main


def test_load_policy_from_a_workdir_checkpoint(tiny_dir, tmp_path):
    params = jax.jit(init_params, static_argnums=0)(get_preset("tiny"), jax.random.PRNGKey(7))
    with Checkpointer(tmp_path / "train") as ckpt:
        ckpt.save(3, {"params": params})
    cfg = ml_collections.ConfigDict({"hf_dir": str(tiny_dir), "checkpoint": str(tmp_path / "train")})
    policy, name = serve_mode.load_policy(cfg)
    assert name == "train"
    np.testing.assert_array_equal(np.asarray(policy.params["embed"]), np.asarray(params["embed"]))
    with pytest.raises(ValueError, match="serve.hf_dir"):
        serve_mode.load_policy(ml_collections.ConfigDict({"hf_dir": "", "checkpoint": str(tmp_path / "train")}))


def test_run_py_serves_the_tiny_variant(tmp_path):
    with tiny_server(tmp_path / "serve") as proc:
        resp = httpx.post(f"http://127.0.0.1:{proc.port}/v1/chat/completions", timeout=120,
                          json={"model": "tiny_model", "messages": MESSAGES, "max_tokens": 4})
        assert resp.status_code == 200, resp.text
        assert resp.json()["usage"]["completion_tokens"] <= 4
        saved = json.loads((tmp_path / "serve" / "config.json").read_text())
        assert saved["mode"] == "serve" and saved["serve"]["init_tiny"] is True
