"""The names regime's behaviour summary on episodes written by hand, so every share is known."""
import json

import pytest

from harness_envs.synth import names
from studies.testbed import names_behaviour as nb
from studies.testbed import names_report as nr

VISIBLE, HIDDEN = 0, len(names.NAMES_TYPES)  # task indices: the second block of types hides the name


def turn(sql=None, ok=True, kind="sql"):
    return {"kind": kind, "sql": sql, "ok": ok if kind == "sql" else None}


def episode(index, turns, success, mode="success"):
    replies = [f"Action: Operation\n```sql\n{t['sql']}\n```" if t["kind"] == "sql" else "Action: Answer"
               for t in turns]
    return {"task_id": f"distinct_heldout-s2-{index:05d}", "success": success, "replies": replies,
            "turns": turns, "num_turns": len(turns), "failure_mode": mode}


SHOW_THEN_WIN = episode(HIDDEN, [turn("SHOW TABLES"), turn("SELECT a FROM t"), turn(kind="answer")], True)
GUESS_THEN_SHOW = episode(HIDDEN + 1, [turn("SELECT a FROM x", ok=False), turn("SHOW TABLES"),
                                       turn("SELECT a FROM t"), turn(kind="answer")], True)
GUESS_LOOP = episode(HIDDEN + 2, [turn("SELECT a FROM x", ok=False), turn("SELECT a FROM y", ok=False)],
                     False, "sql_error_loop")
MALFORMED = episode(HIDDEN + 3, [turn(kind="malformed")], False, "malformed_action")
VISIBLE_WIN = episode(VISIBLE, [turn("SELECT a FROM t"), turn(kind="answer")], True)


def test_openings_and_recovery_are_classified():
    assert [nb.opening(e) for e in (SHOW_THEN_WIN, GUESS_THEN_SHOW, MALFORMED, VISIBLE_WIN)] == [
        "show_tables", "query", "malformed", "query"]
    assert nb.show_tables_after_error(GUESS_THEN_SHOW) and not nb.show_tables_after_error(GUESS_LOOP)
    # a SHOW TABLES before the error is an opening, not a recovery
    assert not nb.show_tables_after_error(episode(HIDDEN, [turn("SHOW TABLES"), turn("SELECT 1 FROM x", ok=False)],
                                                  False))


def test_summary_by_slice():
    out = nb.by_slice([SHOW_THEN_WIN, GUESS_THEN_SHOW, GUESS_LOOP, MALFORMED, VISIBLE_WIN])
    hidden = out["hidden"]
    assert hidden["episodes"] == 4 and hidden["success"] == 0.5
    assert hidden["openings"] == {"show_tables": 0.25, "query": 0.5, "answer": 0.0, "malformed": 0.25}
    assert hidden["success_by_opening"] == {"show_tables": 1.0, "query": 0.5, "malformed": 0.0}
    assert hidden["first_statement_failed"] == 0.5 and hidden["show_after_error"] == 0.5
    assert hidden["failure_modes"] == {"sql_error_loop": 0.25, "malformed_action": 0.25}
    assert hidden["mean_turns"] == pytest.approx((3 + 4 + 2 + 1) / 4)
    assert out["visible"]["success"] == 1.0 and out["visible"]["show_after_error"] is None


def test_pooling_summaries_equals_summarising_the_union():
    a, b = [SHOW_THEN_WIN, GUESS_LOOP, VISIBLE_WIN], [GUESS_THEN_SHOW, MALFORMED, GUESS_LOOP]
    pooled, union = nb.pool([nb.summarise(a), nb.summarise(b)]), nb.summarise(a + b)
    assert pooled.keys() == union.keys()
    for key in ("episodes", "success", "first_statement_failed", "show_after_error", "mean_turns"):
        assert pooled[key] == pytest.approx(union[key]), key
    for key in ("openings", "success_by_opening", "failure_modes"):
        assert pooled[key] == pytest.approx(union[key]), key


def write_workdir(root, arm, seed, eval_episodes, train_episodes):
    workdir = root / arm / f"seed{seed}"
    (workdir / "eval").mkdir(parents=True)
    (workdir / "episodes").mkdir()
    (workdir / "config.json").write_text(json.dumps({"seed": seed, "rollout": {"n": 4},
                                                     "eval": {"split": "distinct_heldout"}}))
    primary, mechanism, guardrail = nr.keys("distinct_heldout")
    (workdir / "metrics.jsonl").write_text(json.dumps({"step": 20, "rollouts/total": 700, primary: 0.5,
                                                       mechanism: 0.25, guardrail: 1.0}) + "\n")
    (workdir / "eval" / "distinct_heldout_step000020.json").write_text(
        json.dumps({"step": 20, "summary": {}, "episodes": eval_episodes}))
    (workdir / "episodes" / "step_000001.jsonl").write_text(
        "\n".join(json.dumps(e) for e in train_episodes) + "\n")
    return workdir


def test_a_run_is_summarised_written_and_reported(tmp_path, capsys):
    rescue = dict(SHOW_THEN_WIN, harness="tables_first")
    workdir = write_workdir(tmp_path, "names_tables_first_base", 0,
                            [SHOW_THEN_WIN, GUESS_LOOP, VISIBLE_WIN], [dict(GUESS_LOOP, harness="base"), rescue])
    out = nb.main(["--run", str(workdir)])
    assert out["step"] == 20 and out["eval"]["hidden"]["success"] == 0.5
    assert list(out["rescue"]) == ["tables_first"]  # base rollouts are not rescues
    assert out["rescue"]["tables_first"]["hidden"]["openings"]["show_tables"] == 1.0
    assert json.loads((workdir / nb.OUTPUT).read_text()) == out
    capsys.readouterr()
    report = nr.main(["--root", str(tmp_path), "--out", str(tmp_path / "out")])
    printed = capsys.readouterr().out
    assert "| names_tables_first_base (1 seed) | rescue, tables_first | hidden | 1 | 100 | 100 (100) |" in printed
    assert report["behaviour"]["names_tables_first_base"]["eval"]["hidden"]["episodes"] == 2


def test_a_run_without_its_evaluation_is_an_error(tmp_path):
    workdir = write_workdir(tmp_path, "names_policy_only", 0, [], [])
    (workdir / "eval" / "distinct_heldout_step000020.json").unlink()
    with pytest.raises(FileNotFoundError, match="no evaluation"):
        nb.main(["--run", str(workdir)])
