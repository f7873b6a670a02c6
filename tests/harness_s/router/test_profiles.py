"""Profiles: Beta posterior math by hand, backoff, decay, cards, exact JSON round trip."""
import json
import random
from fractions import Fraction

import pytest

from hsjax.harness_s.router.profiles import Profiles


def outcome(harness, task_type, mode, success, turns=None, tokens=None, snippet=None):
    return {"harness": harness, "task_type": task_type, "base_failure_mode": mode, "success": success,
            "num_turns": turns, "num_tokens": tokens, "snippet": snippet}


@pytest.fixture
def learned():
    p = Profiles(["a", "b"], directions={"a": "schema_grounding"}, prior=(1.0, 1.0), backoff=2.0)
    p.update([outcome("a", "select", "sql_error_loop", True, 3, 300, "SELECT name FROM t -> rescued")] * 3
             + [outcome("a", "select", "wrong_answer", False, 5, 500, "Final Answer: 42")]
             + [outcome("a", "insert", "sql_error_loop", False, 7, 700)])
    return p


def test_posterior_and_backoff_by_hand(learned):
    # overall 3/5 -> Beta(4, 3); select 3/4; sql_error_loop 3/4; wrong_answer 0/1.
    assert learned.posterior("a") == (4.0, 3.0)
    assert learned.posterior("a", "type", "select") == (4.0, 2.0)
    assert learned.posterior("a", "mode", "wrong_answer") == (1.0, 2.0)
    m_all = Fraction(4, 7)
    m_type = (3 + 2 * m_all) / (4 + 2)
    m_mode = (3 + 2 * m_type) / (4 + 2)
    assert m_mode == Fraction(46, 63)
    assert learned.score("a", "select", "sql_error_loop") == pytest.approx(float(m_mode), abs=1e-15)
    # Unseen cells back off to the level above; missing keys skip their level.
    assert learned.score("a", "update", "turn_limit") == pytest.approx(4 / 7, abs=1e-15)
    assert learned.score("a") == pytest.approx(4 / 7, abs=1e-15)
    assert learned.score("a", None, "wrong_answer") == pytest.approx((0 + 2 * 4 / 7) / 3, abs=1e-15)
    assert learned.score("a", "select") == pytest.approx(float(m_type), abs=1e-15)
    # No data at all: the prior mean, for a known and an unknown harness.
    assert learned.score("b", "select", "sql_error_loop") == 0.5
    assert learned.score("nobody") == 0.5


def test_prior_is_configurable():
    p = Profiles(["a"], prior=(2.0, 6.0))
    assert p.score("a") == 0.25
    p.update([outcome("a", None, None, True)])
    assert p.score("a") == pytest.approx(3 / 9)
    with pytest.raises(ValueError, match="prior"):
        Profiles(prior=(0.0, 1.0))


def test_more_evidence_dominates_backoff():
    p = Profiles(["a"])
    p.update([outcome("a", "select", "m1", False)] * 50 + [outcome("a", "select", "m2", True)] * 50)
    assert p.score("a", "select", "m2") > 0.95
    assert p.score("a", "select", "m1") < 0.05
    assert 0.45 < p.score("a", "select", "other") < 0.55


def test_decay_moves_counts_toward_the_prior(learned):
    before = learned.score("a", "select", "sql_error_loop")
    learned.decay(0.5)
    assert learned.posterior("a") == (2.5, 2.0)
    after = learned.score("a", "select", "sql_error_loop")
    assert 0.5 < after < before
    # Cost means keep their value under decay.
    assert learned["a"].mean_turns() == pytest.approx((3 * 3 + 5 + 7) / 5)
    learned.decay(0.0)
    assert learned.score("a", "select", "sql_error_loop") == 0.5
    with pytest.raises(ValueError, match="decay"):
        learned.decay(1.5)


def test_card_content(learned):
    card = learned.card("a")
    assert "harness: a (repair direction: schema_grounding)" in card
    assert "0.57" in card and "3 of 5" in card  # overall posterior mean and counts
    assert "sql_error_loop 0.67 (3/4)" in card and "wrong_answer 0.33 (0/1)" in card
    assert "select" in card and "insert" in card
    assert "mean cost per rollout: 4.2 turns, 420 tokens" in card
    assert "example rescued [select/sql_error_loop]: SELECT name FROM t -> rescued" in card
    assert "example not rescued [select/wrong_answer]: Final Answer: 42" in card
    assert len(card.splitlines()) <= 10
    assert learned.card("b").startswith("harness: b\nrescue rate overall: 0.50 (0 of 0")


def test_snippets_keep_the_most_recent_and_are_cut():
    p = Profiles(["a"], max_snippets=2, snippet_chars=10)
    p.update([outcome("a", "t", "m", True, snippet=f"example {i} with a long tail") for i in range(5)])
    assert [e["text"] for e in p["a"].rescued_examples] == ["example 3 ", "example 4 "]


def test_update_names_a_missing_key():
    with pytest.raises(ValueError, match="'success'"):
        Profiles().update([{"harness": "a"}])


def test_json_round_trip_is_exact(tmp_path):
    rng = random.Random(0)
    p = Profiles(["a", "b", "c"], directions={"b": "paging"}, prior=(0.7, 1.3), backoff=3.0)
    for _ in range(20):
        p.update(outcome(rng.choice("abcd"), rng.choice(["select", "insert", None]),
                         rng.choice(["m1", "m2", None]), rng.random() < 0.4, rng.randint(1, 9),
                         rng.choice([None, rng.randint(10, 999)]), rng.choice([None, "snip é ✓"]))
                 for _ in range(7))
        p.decay(0.93)
    text = p.to_json()
    q = Profiles.from_json(text)
    assert q.to_json() == text
    assert q.to_dict() == p.to_dict()
    for h in "abcd":
        for t in ("select", "insert", None):
            for m in ("m1", "m2", None):
                assert q.score(h, t, m) == p.score(h, t, m)  # bit for bit
        assert q.card(h) == p.card(h)
    path = p.save(tmp_path)
    assert path.name == "profiles.json"
    assert Profiles.load(tmp_path).to_json() == text
    assert json.loads(path.read_text())["backoff"] == 3.0
    # The copy is independent of the original.
    q.update([outcome("a", "select", "m1", True)])
    assert q.to_json() != p.to_json() and p.to_json() == text
