"""LLM voters against the fake OpenAI-compatible server (tests/fake_openai.py): decisions and
counters for every failure kind."""
import json
import logging
import time

import pytest

from hsjax.harness_s.router import Profiles, Router
from hsjax.harness_s.router.voters import (LLMVoter, VoteCache, VoteError, VoteRequest, VoterSpec, parse_ranking,
                                 vote_all)
from tests.fake_openai import completion as completion_body

CANDIDATES = ("lenient_parse", "schema_reminder", "verify_answer")
API_KEY = "sk-voter-secret-91c3e7"


def completion(content):
    return json.dumps(completion_body(content))


def ranking(*names):
    return completion(json.dumps({"ranking": list(names)}))


def delayed(seconds, body):
    """Answer 200 with `body` after `seconds`."""
    return 200, body, seconds


def voter(server, name, **kw):
    kw.setdefault("timeout_s", 2.0)
    kw.setdefault("max_retries", 0)
    kw.setdefault("backoff_s", 0.01)
    return LLMVoter(VoterSpec(name=name, base_url=server.base_url, model="m-" + name, **kw))


def request(question="How many rows in t?"):
    return VoteRequest(task={"task_id": "t1", "type": "select", "question": question},
                       group_summary="4 rollouts, all failed.\nfailure modes: sql_error_loop x4",
                       cards={c: f"harness: {c}" for c in CANDIDATES}, candidates=CANDIDATES)


def test_agreeing_voters(openai_server):
    vs = [voter(openai_server((200, ranking("schema_reminder", "verify_answer", "lenient_parse"))), f"v{i}")
          for i in range(3)]
    out = vote_all(vs, request())
    assert out.counters == {"ok": 3}
    assert out.failures == {}
    assert list(out.rankings) == ["v0", "v1", "v2"]
    assert all(r == ["schema_reminder", "verify_answer", "lenient_parse"] for r in out.rankings.values())
    router = Router(list(CANDIDATES), Profiles(CANDIDATES), vs, k=2, profile_weight=0.0)
    d = router.top_k({"task_id": "t1", "type": "select"}, [{"failure_mode": "sql_error_loop"}] * 2)
    assert d.harnesses == ["schema_reminder", "verify_answer"] and not d.fallback
    assert d.scores == {"schema_reminder": 1.0, "verify_answer": 0.5, "lenient_parse": 0.0}


def test_disagreeing_voters_borda_and_majority(openai_server):
    vs = [voter(openai_server((200, ranking("lenient_parse", "schema_reminder", "verify_answer"))), "a"),
          voter(openai_server((200, ranking("schema_reminder", "lenient_parse", "verify_answer"))), "b"),
          voter(openai_server((200, ranking("verify_answer", "schema_reminder", "lenient_parse"))), "c")]
    out = vote_all(vs, request())
    assert out.counters == {"ok": 3} and len(set(map(tuple, out.rankings.values()))) == 3
    # Borda, n=3: lenient 2+1+0=3, schema 1+2+1=4, verify 0+0+2=2, over 3 voters * 2 points.
    borda = Router(list(CANDIDATES), Profiles(CANDIDATES), vs, k=1, aggregation="borda", profile_weight=0.0)
    d = borda.top_k({"task_id": "t1"}, [{"failure_mode": "wrong_answer"}])
    assert d.harnesses == ["schema_reminder"]
    assert d.scores == pytest.approx({"lenient_parse": 0.5, "schema_reminder": 4 / 6, "verify_answer": 2 / 6})
    # Majority: one first place each -> a three-way tie, broken by profile score, then name.
    majority = Router(list(CANDIDATES), Profiles(CANDIDATES), vs, k=3, aggregation="majority",
                      profile_weight=0.0, explore=0.0, tie_break="name")
    assert majority.top_k({"task_id": "t1"}, [{}]).harnesses == sorted(CANDIDATES)
    majority.profiles.update([{"harness": "verify_answer", "success": True}])
    assert majority.top_k({"task_id": "t2"}, [{}]).harnesses[0] == "verify_answer"


def test_slow_voter_is_dropped_as_timeout(openai_server):
    fast = voter(openai_server((200, ranking("verify_answer"))), "fast")
    slow = voter(openai_server(delayed(1.0, ranking("lenient_parse"))), "slow", timeout_s=0.3)
    start = time.monotonic()
    out = vote_all([fast, slow], request())
    assert time.monotonic() - start < 0.9
    assert out.rankings == {"fast": ["verify_answer"]}
    assert out.failures == {"slow": "timeout"}
    assert out.counters == {"ok": 1, "timeout": 1}


def test_decision_deadline_bounds_the_whole_vote(openai_server):
    slow = voter(openai_server(delayed(1.0, ranking("lenient_parse"))), "slow", timeout_s=5.0)
    start = time.monotonic()
    out = vote_all([slow], request(), deadline_s=0.2)
    assert time.monotonic() - start < 0.8
    assert out.failures == {"slow": "timeout"} and out.rankings == {}


def test_500_then_success_on_retry(openai_server):
    s = openai_server((500, '{"error": "overloaded"}'), (200, ranking("verify_answer", "lenient_parse")))
    out = vote_all([voter(s, "v", max_retries=2)], request())
    assert out.rankings == {"v": ["verify_answer", "lenient_parse"]}
    assert out.counters == {"ok": 1}
    assert out.results["v"].attempts == 2 and len(s.requests) == 2


def test_500_forever_is_an_http_error(openai_server):
    s = openai_server((500, '{"error": "down"}'))
    out = vote_all([voter(s, "v", max_retries=2)], request())
    assert out.failures == {"v": "http_error"} and out.counters == {"http_error": 1}
    assert len(s.requests) == 3  # first try + 2 retries


def test_4xx_is_not_retried(openai_server):
    s = openai_server((404, '{"error": "no such model"}'))
    out = vote_all([voter(s, "v", max_retries=3)], request())
    assert out.failures == {"v": "http_error"} and len(s.requests) == 1


def test_malformed_replies(openai_server):
    vs = [voter(openai_server((200, "{not json")), "not_json"),
          voter(openai_server((200, json.dumps({"error": "oops"}))), "no_choices"),
          voter(openai_server((200, completion("I would pick the schema one."))), "prose"),
          voter(openai_server((200, completion('{"ranking": "schema_reminder"}'))), "not_a_list")]
    out = vote_all(vs, request())
    assert out.rankings == {}
    assert out.failures == {v.name: "malformed" for v in vs}
    assert out.counters == {"malformed": 4}


def test_malformed_is_not_retried(openai_server):
    s = openai_server((200, completion("no JSON here")))
    out = vote_all([voter(s, "v", max_retries=3)], request())
    assert out.failures == {"v": "malformed"}
    assert out.results["v"].attempts == 1 and len(s.requests) == 1  # a deterministic voter would repeat it
    s = openai_server((200, "{not json"))
    out = vote_all([voter(s, "w", max_retries=3)], request())
    assert out.failures == {"w": "malformed"} and len(s.requests) == 1


def test_unknown_names(openai_server):
    bad = voter(openai_server((200, ranking("sql_wizard", "magic"))), "bad")
    mixed = voter(openai_server((200, ranking("sql_wizard", "Schema_Reminder ", "schema_reminder", 7))), "mixed")
    out = vote_all([bad, mixed], request())
    assert out.failures == {"bad": "unknown_names"}
    assert out.rankings == {"mixed": ["schema_reminder"]}  # unknown dropped, case folded, deduplicated
    assert out.counters == {"ok": 1, "unknown_names": 1}


def test_ranking_inside_a_code_fence(openai_server):
    text = ('Looking at the cards, the errors point to grounding.\n```json\n'
            '{"ranking": ["schema_reminder", "lenient_parse"]}\n```\nGood luck!')
    out = vote_all([voter(openai_server((200, completion(text))), "fenced")], request())
    assert out.rankings == {"fenced": ["schema_reminder", "lenient_parse"]}


def test_connection_refused_is_counted(openai_server):
    s = openai_server((200, ranking("verify_answer")))
    s.close()
    out = vote_all([voter(s, "gone", max_retries=1)], request())
    assert out.failures == {"gone": "connection_error"}


def test_cache_prevents_a_second_call(openai_server):
    s = openai_server((200, ranking("verify_answer")))
    v = voter(s, "v")
    cache = VoteCache()
    first = vote_all([v], request(), cache=cache)
    second = vote_all([v], request(), cache=cache)
    assert len(s.requests) == 1
    assert second.rankings == first.rankings == {"v": ["verify_answer"]}
    assert second.counters == {"ok": 1, "cache_hit": 1}
    vote_all([v], request("Another question?"), cache=cache)
    assert len(s.requests) == 2
    # Failures are not cached: a failing voter is asked again.
    bad = voter(openai_server((200, "{not json")), "bad")
    vote_all([bad], request(), cache=cache)
    vote_all([bad], request(), cache=cache)
    assert len(cache) == 2


def test_request_content(openai_server):
    s = openai_server((200, ranking("verify_answer")))
    vote_all([voter(s, "v")], request())
    body = s.requests[0].body
    assert s.requests[0].path == "/v1/chat/completions" and body["model"] == "m-v"
    user = body["messages"][-1]["content"]
    assert "How many rows in t?" in user and "sql_error_loop x4" in user
    assert all(f"harness: {c}" in user for c in CANDIDATES)
    assert '"ranking"' in body["messages"][0]["content"]


def test_api_key_is_sent_and_never_leaks(openai_server, monkeypatch, caplog):
    monkeypatch.setenv("HSJAX_TEST_VOTER_KEY", API_KEY)
    caplog.set_level(logging.DEBUG)
    good = openai_server((200, ranking("lenient_parse")))
    # A server that echoes the Authorization header in its error text: the log must redact it.
    echo = openai_server(lambda req: (500, {"error": f"bad auth {req.headers['Authorization']}"}))
    specs = [VoterSpec("good", good.base_url, "m", api_key_env="HSJAX_TEST_VOTER_KEY"),
             VoterSpec("echo", echo.base_url, "m", api_key_env="HSJAX_TEST_VOTER_KEY", max_retries=1,
                       backoff_s=0.01)]
    router = Router(list(CANDIDATES), Profiles(CANDIDATES), specs, k=1)
    d = router.top_k({"task_id": "t9", "type": "select"}, [{"failure_mode": "malformed_action"}])
    assert good.requests[0].headers["Authorization"] == f"Bearer {API_KEY}"
    assert d.votes == {"good": ["lenient_parse"]} and d.failures == {"echo": "http_error"}
    assert "[REDACTED]" in caplog.text
    router.observe([{"task_id": "t9", "harness": "lenient_parse", "success": True}])
    for text in (caplog.text, repr(router), repr(router.voters), repr(specs), json.dumps(router.state_dict()),
                 json.dumps(router.drain_log()), repr(d)):
        assert API_KEY not in text
    # An unset key is a counted failure, not an exception, and no request is sent.
    monkeypatch.delenv("HSJAX_TEST_VOTER_KEY")
    sent = len(good.requests)
    out = vote_all(router.voters, request())
    assert out.failures == {"good": "missing_api_key", "echo": "missing_api_key"}
    assert "HSJAX_TEST_VOTER_KEY" in out.results["good"].detail and out.results["good"].attempts == 0
    assert len(good.requests) == sent


def test_key_echoed_in_a_reply_is_redacted_from_details(openai_server, monkeypatch, caplog):
    monkeypatch.setenv("HSJAX_TEST_VOTER_KEY", API_KEY)
    caplog.set_level(logging.DEBUG)
    s = openai_server(lambda req: (200, completion(f"my key is {req.headers['Authorization']}")))
    out = vote_all([voter(s, "v", api_key_env="HSJAX_TEST_VOTER_KEY")], request())
    assert out.failures == {"v": "malformed"}
    assert "[REDACTED]" in out.results["v"].detail
    assert API_KEY not in out.results["v"].detail and API_KEY not in caplog.text


def test_no_key_env_sends_no_authorization(openai_server, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-ambient-not-for-voters")
    s = openai_server((200, ranking("verify_answer")))
    assert vote_all([voter(s, "v")], request()).rankings == {"v": ["verify_answer"]}
    assert "Authorization" not in s.requests[0].headers


def test_parse_ranking_forms():
    assert parse_ranking('{"ranking": ["verify_answer"]}', CANDIDATES) == ["verify_answer"]
    bare = '["verify_answer", "lenient_parse"]'
    assert parse_ranking(bare, CANDIDATES) == ["verify_answer", "lenient_parse"]
    assert parse_ranking("```\n[\"verify_answer\"]\n```", CANDIDATES) == ["verify_answer"]
    prose = 'My ranking: {"ranking": ["x", "lenient_parse"]} as asked'
    assert parse_ranking(prose, CANDIDATES) == ["lenient_parse"]
    with pytest.raises(VoteError) as e:
        parse_ranking('{"ranking": []}', CANDIDATES)
    assert e.value.reason == "unknown_names"
    with pytest.raises(VoteError) as e:
        parse_ranking('```json\n{"rank": ["lenient_parse"]}\n```', CANDIDATES)
    assert e.value.reason == "malformed"
