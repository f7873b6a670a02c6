"""The voters' log-probability mode (letter_vote.py): letters read from a reply's first-token
alternatives, against the fake server (what is asked, each way a reply can be unreadable) and a
real `serve` of the tiny model (its logprobs are what the vote reads)."""
import json
import math

import pytest

from hsjax.harness_s.router import letter_vote
from hsjax.harness_s.router.voters import LLMVoter, VoteRequest, VoterSpec, vote_all
from hsjax.llm import server as serve
from hsjax.llm.client import ChatClient, ClientSettings
from hsjax.models.tiny import write_tiny_model
from hsjax.policies.jax_policy import JaxPolicy
from tests.fake_openai import completion

CANDIDATES = ("lenient_parse", "schema_reminder", "verify_answer")


def request():
    return VoteRequest(task={"task_id": "t1", "type": "select", "question": "How many rows in t?"},
                       group_summary="4 rollouts, all failed.\nfailure modes: sql_error_loop x4",
                       cards={c: f"harness: {c}" for c in CANDIDATES}, candidates=CANDIDATES)


def with_logprobs(first: tuple[str, float], *alternatives: tuple[str, float]) -> str:
    """A chat completion whose one generated token is `first`, with `alternatives` as its top list."""
    entry = {"token": first[0], "logprob": first[1], "bytes": None,
             "top_logprobs": [{"token": t, "logprob": lp, "bytes": None} for t, lp in alternatives]}
    body = completion(first[0])
    body["choices"][0]["logprobs"] = {"content": [entry]}
    return json.dumps(body)


def logprob_voter(server, name="lp", model="m", rotations=1):
    return LLMVoter(VoterSpec(name=name, base_url=server.base_url, model=model, timeout_s=60.0, max_retries=0,
                              vote_mode="logprob", letter_rotations=rotations))


def test_letters_read_from_tokens():
    assert [letter_vote.letter_of(t) for t in (" A", "A", "A.", "(B)", "C:", "a", "AB", " ", "{")] == [
        "A", "A", "A", "B", "C", None, None, None, None]
    with pytest.raises(ValueError, match="A-Z: 27 candidates"):
        letter_vote.letters_for([f"h{i}" for i in range(27)])


def test_a_letters_tokens_add_up_and_the_ranking_is_best_first():
    alternatives = [("B", math.log(0.3)), ("B", math.log(0.3)), (" A", math.log(0.2)), ("A", math.log(0.2)),
                    ("C.", math.log(0.1)), ("The", math.log(0.1)), ("D", math.log(0.05))]
    scores = letter_vote.letter_scores(alternatives, CANDIDATES)  # D is no candidate; B listed twice
    assert scores.keys() == set(CANDIDATES)
    assert math.isclose(scores["lenient_parse"], math.log(0.4))
    assert math.isclose(scores["schema_reminder"], math.log(0.3))
    assert letter_vote.ranking_from_scores(scores, CANDIDATES) == ["lenient_parse", "schema_reminder",
                                                                   "verify_answer"]
    tied = {"verify_answer": -1.0, "lenient_parse": -1.0}
    assert letter_vote.ranking_from_scores(tied, CANDIDATES) == ["lenient_parse", "verify_answer"]


def test_a_logprob_vote_asks_one_token_with_alternatives_and_ranks_by_them(openai_server):
    server = openai_server((200, with_logprobs(("C", -0.5), ("C", -0.5), ("A", -1.5), ("x", -2.0))))
    out = vote_all([logprob_voter(server)], request())
    assert out.counters == {"ok": 1} and out.rankings == {"lp": ["verify_answer", "lenient_parse"]}
    body = server.requests[0].body
    assert body["max_tokens"] == 1 and body["logprobs"] is True and body["top_logprobs"] == 20
    assert body["temperature"] == 0.0
    prompt = body["messages"][-1]["content"]
    assert "A) lenient_parse" in prompt and "C) verify_answer" in prompt and "one letter (A, B, C)" in prompt


@pytest.mark.parametrize("reply, detail", [
    (json.dumps(completion("B")), "no token logprobs"),
    (with_logprobs(("{", -0.1), ("{", -0.1), ("The", -3.0)), "no candidate letter"),
])
def test_a_reply_without_a_readable_letter_is_malformed(openai_server, reply, detail):
    out = vote_all([logprob_voter(openai_server((200, reply)))], request())
    assert out.counters == {"malformed": 1} and out.rankings == {}
    assert detail in out.results["lp"].detail


def test_rotations_average_out_a_voter_that_always_says_a(openai_server):
    """A voter that puts 0.6 on "A" whatever it is shown, and otherwise prefers verify_answer: with
    the order as given it ranks lenient_parse (listed first) first; over three rotations each
    candidate is A once and verify_answer wins."""
    def reply(request):
        prompt = request.body["messages"][-1]["content"]
        letter = {line.split(") ")[1]: line.split(")")[0] for line in prompt.splitlines()
                  if line[:2] in ("A)", "B)", "C)")}["verify_answer"]
        alternatives = [("A", math.log(0.6))] if letter == "A" else [("A", math.log(0.6)), (letter, math.log(0.3))]
        if letter == "A":
            alternatives.append(("B", math.log(0.2)))
        return 200, with_logprobs(alternatives[0], *alternatives)

    once = vote_all([logprob_voter(openai_server(reply))], request())
    assert once.rankings["lp"][0] == "lenient_parse"
    server = openai_server(reply)
    rotated = vote_all([logprob_voter(server, rotations=3)], request())
    assert rotated.counters == {"ok": 1} and rotated.rankings["lp"][0] == "verify_answer"
    assert len(server.requests) == 3
    firsts = [r.body["messages"][-1]["content"].split("A) ")[1].split("\n")[0] for r in server.requests]
    assert firsts == list(CANDIDATES[0:]) and len(set(firsts)) == 3


def test_an_unknown_vote_mode_is_refused():
    with pytest.raises(ValueError, match="vote_mode must be one of"):
        VoterSpec(name="v", base_url="http://127.0.0.1:1/v1", model="m", vote_mode="letters")
    with pytest.raises(ValueError, match="letter_rotations must be >= 1"):
        VoterSpec(name="v", base_url="http://127.0.0.1:1/v1", model="m", vote_mode="logprob", letter_rotations=0)


def test_a_logprob_vote_against_the_real_server_reads_its_logprobs(tmp_path):
    """The tiny random model rarely answers JSON; its first-token alternatives are all there is to
    read, and the vote reads exactly them."""
    policy = JaxPolicy.from_pretrained(write_tiny_model(tmp_path / "tiny", seed=2), seed=0, batch_buckets=(1,))
    with serve.BackgroundServer(serve.build_app(policy, "tiny")) as server:
        client = ChatClient(ClientSettings(base_url=server.base_url, model="tiny", max_retries=0))
        messages = letter_vote.letter_messages(request().task, request().group_summary, request().cards,
                                               CANDIDATES)
        raw = client.complete(messages, temperature=0.0, max_tokens=1,
                              extra_body={"logprobs": True, "top_logprobs": letter_vote.TOP_LOGPROBS})
        alternatives = letter_vote.first_token_alternatives(raw.response)
        assert alternatives is not None and len(alternatives) == 1 + letter_vote.TOP_LOGPROBS
        scores = letter_vote.letter_scores(alternatives, CANDIDATES)
        result = logprob_voter(server, model="tiny").vote(request())
        if scores:
            assert result.status == "ok"
            assert result.ranking == letter_vote.ranking_from_scores(scores, CANDIDATES)
        else:
            assert result.status == "malformed" and "no candidate letter" in result.detail, result
        client.close()
