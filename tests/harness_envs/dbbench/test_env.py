"""DBBenchEpisode: the AgentBench v0.2 protocol details, every knob, the failure taxonomy, robustness."""
import json
import random

import pytest

from harness_envs.dbbench.benchmark import KNOBS
from harness_envs.base import RESULT_KEYS, Episode, check_result
from harness_envs.dbbench import harness as dbbench_harness
from harness_envs.dbbench import taxonomy
from harness_envs.dbbench.backends import hash_rows
from harness_envs.dbbench.data import DBTask, Table
from harness_envs.dbbench.env import DBBenchEpisode

BASE = KNOBS.base()

ROWS = tuple((f"City{i:02d}", "Austria" if i % 3 == 0 else "Italy", str(1000 * i)) for i in range(40))
TABLE = Table(name="cities", columns=("name", "country", "population"), rows=ROWS)
SELECT_TASK = DBTask(task_id="t-select", split="test", index=0, type="other",
                     question="Which city has population 7000?",
                     add_description="The name of this table is cities, and the headers of this table are name,country,population.",
                     table=TABLE, label=("City07",), answer_md5=None, source="test")
INSERT_SQL = "INSERT INTO cities (name, country, population) VALUES ('Graz', 'Austria', '300')"
INSERT_TASK = DBTask(task_id="t-insert", split="test", index=1, type="INSERT",
                     question="Add Graz (Austria, 300).", add_description=SELECT_TASK.add_description,
                     table=TABLE, label=(INSERT_SQL,), answer_md5=hash_rows(ROWS + (("Graz", "Austria", "300"),)),
                     source="test")


def op(sql):
    return f"Action: Operation\n```sql\n{sql}\n```"


def ans(items):
    return "Action: Answer\nFinal Answer: " + json.dumps(items)


@pytest.fixture
def backend(sqlite_backend):
    return sqlite_backend


def run(task, replies, backend, **knobs):
    spec = BASE.with_knobs(name="t", **knobs) if knobs else BASE
    ep = DBBenchEpisode(task, spec, backend)
    ep.reset()
    for reply in replies:
        if ep.done:
            break
        ep.step(reply)
    return ep


# ------------------------------------------------------------------ the strict (published) parser

@pytest.mark.parametrize("reply, kind, value", [
    ("Action: Operation\n```sql\nSELECT 1\n```", "sql", "SELECT 1"),
    ("Let me look.\nAction: Operation\n```sql\n  SELECT a\nFROM t\n```", "sql", "SELECT a FROM t"),
    ("Action: Operation\n```sql\nSELECT 1\n```\n```sql\nSELECT 2\n```", "sql", "SELECT 1"),
    # Operation wins over a Final Answer in the same reply
    ("Action: Operation\n```sql\nSELECT 1\n```\nFinal Answer: [\"x\"]", "sql", "SELECT 1"),
    ("Action: Answer\nFinal Answer: [\"x\"]", "answer", ' ["x"]'),  # the raw rest of the line
    ("I know it.\nFinal Answer: Vienna\nmore text", "answer", " Vienna"),  # no Action line needed
    ("Action: Answer\nFinal Answer:", "answer", ""),
])
def test_strict_parser_accepts(reply, kind, value):
    a = dbbench_harness.parse_strict(reply)
    assert a.kind == kind and (a.sql if kind == "sql" else a.answer) == value


@pytest.mark.parametrize("reply", [
    "",
    "Action: Operation",  # the action line needs a trailing newline ...
    "Action: Operation ```sql\nSELECT 1\n```",  # ... so this action is "Operation ```sql"
    "Action: Operation\n```SQL\nSELECT 1\n```",  # only a lowercase ```sql fence
    "Action: Operation\n```sql SELECT 1 ```",  # the fence needs a newline on both sides
    "Action: Operation\nSELECT 1",
    "Final Answer: [\"x\"]",  # the answer needs a newline before it
    "Action: Answer\nfinal answer: [\"x\"]",
    "action: operation\n```sql\nSELECT 1\n```",
])
def test_strict_parser_rejects(reply):
    assert dbbench_harness.parse_strict(reply).kind == "malformed"


def test_strict_operation_with_trailing_space_is_not_an_operation():
    # "Action: Operation \n" is not exactly "Operation": the reply is read as an answer attempt.
    assert dbbench_harness.parse_strict("Action: Operation \n```sql\nSELECT 1\n```").kind == "malformed"
    a = dbbench_harness.parse_strict("Action: Operation \n```sql\nSELECT 1\n```\nFinal Answer: 3")
    assert a.kind == "answer" and a.answer == " 3"


@pytest.mark.parametrize("reply, kind, value", [
    ("```sql\nSELECT 1\n```", "sql", "SELECT 1"),
    ("Action: Operation\n```SQL\nSELECT 1\n```", "sql", "SELECT 1"),
    ("Action: Operation\n```mysql\nSELECT a\nFROM t;\n```", "sql", "SELECT a FROM t;"),
    ("Action: Operation\n```sql SELECT 1 ```", "sql", "SELECT 1"),
    ("Action: Operation\n```\nSELECT 1\n```", "sql", "SELECT 1"),
    ("**Action:** Operation\nSELECT name FROM t\nWHERE x = 1\n\nThat is all.", "sql", "SELECT name FROM t WHERE x = 1"),
    ("Final Answer: [\"x\"]", "answer", ' ["x"]'),
    ("Action: Answer\nfinal answer:\n[\"x\"]", "answer", '["x"]'),
    ("Action: Operation\n```sql\nSELECT 1\n```", "sql", "SELECT 1"),  # strict results unchanged
])
def test_lenient_parser_repairs(reply, kind, value):
    a = dbbench_harness.parse_lenient(reply)
    assert a.kind == kind and (a.sql if kind == "sql" else a.answer) == value


@pytest.mark.parametrize("reply", ["", "I am thinking.", "```python\nprint(1)\n```", "Action: Answer\nno idea"])
def test_lenient_parser_still_rejects(reply):
    assert dbbench_harness.parse_lenient(reply).kind == "malformed"


# ------------------------------------------------------------------ history, instruction, observations

def test_initial_history_is_the_published_one(backend):
    ep = run(SELECT_TASK, [], backend)
    m = ep.messages()
    assert [x["role"] for x in m] == ["user", "assistant", "user"]
    assert m[1]["content"] == "Ok."
    assert m[2]["content"] == SELECT_TASK.question + "\n" + SELECT_TASK.add_description
    assert "Action: Operation\n```sql" in m[0]["content"] and 'Final Answer: ["ANSWER1"' in m[0]["content"]
    assert isinstance(ep, Episode) and ep.turn == 0 and not ep.done
    ep.abort("test")


def test_instruction_variants_and_hint():
    texts = {v: dbbench_harness.render_instruction(BASE.with_knobs(instruction=v)) for v in ("agentbench", "schema_first", "concise")}
    assert len(set(texts.values())) == 3
    assert "LIMIT 3" in texts["schema_first"] and texts["schema_first"].startswith(texts["agentbench"])
    hinted = dbbench_harness.render_instruction(BASE.with_knobs(hint="Count rows with COUNT(*)."))
    assert hinted == texts["agentbench"] + "\nHint: Count rows with COUNT(*)."


def test_observation_is_raw_and_cut_at_800(backend):
    ep = run(SELECT_TASK, [op("SELECT * FROM cities")], backend)
    obs = ep.messages()[-1]["content"]
    assert obs.startswith("[('City00', 'Austria', '0'), ('City01', 'Italy', '1000')")
    assert len(obs) == 800 + len("[TRUNCATED]") and obs.endswith("[TRUNCATED]")
    t = ep._turns[-1]
    assert t.truncated and t.ok and t.sql == "SELECT * FROM cities"
    ep2 = run(SELECT_TASK, [op("SELECT * FROM cities")], backend, obs_max_chars=5000)
    assert ep2.messages()[-1]["content"] == str(list(ROWS))
    ep3 = run(SELECT_TASK, [op("SELECT COUNT(*) FROM cities")], backend)
    assert ep3.messages()[-1]["content"] == "[(40,)]"
    for e in (ep, ep2, ep3):
        e.abort("test")


def test_error_observation_and_schema_reminder(backend):
    ep = run(SELECT_TASK, [op("SELECT nonexistent FROM cities")], backend)
    obs = ep.messages()[-1]["content"]
    assert "nonexistent" in obs and dbbench_harness.SCHEMA_REMINDER_LEAD not in obs and ep._turns[-1].ok is False
    ep2 = run(SELECT_TASK, [op("SELECT nonexistent FROM cities"), op("SELECT 1")], backend,
              schema_reminder_on_error=True)
    first, second = ep2.messages()[4]["content"], ep2.messages()[6]["content"]
    assert first.startswith(obs) and first.endswith(
        "\nReminder: the table `cities` has the columns: `name`, `country`, `population`.")
    assert dbbench_harness.SCHEMA_REMINDER_LEAD not in second  # only on errors
    ep.abort("t"), ep2.abort("t")


def test_paging_serves_the_next_rows_for_the_same_statement(backend):
    q = "SELECT name FROM cities"
    ep = run(SELECT_TASK, [op(q), op(q), op("SELECT name FROM cities WHERE country = 'Austria'"), op(q)], backend,
             obs_page_rows=15)
    obs = [m["content"] for m in ep.messages()[4::2]]
    names = [(r[0],) for r in ROWS]
    assert obs[0] == str(names[:15]) + "\n[rows 1-15 of 40; send the same statement again for the next rows]"
    assert obs[1] == str(names[15:30]) + "\n[rows 16-30 of 40; send the same statement again for the next rows]"
    austria = [(r[0],) for r in ROWS if r[1] == "Austria"]  # 14 rows: fits, no paging
    assert obs[2] == str(austria)
    assert obs[3].startswith(str(names[:15]))  # another statement came between: from the start
    ep.abort("t")
    ep = run(SELECT_TASK, [op(q)] * 3, backend, obs_page_rows=15)
    assert ep.messages()[-1]["content"] == str(names[30:]) + "\n[rows 31-40 of 40; end of result]"
    ep.abort("t")


def test_context_management_modes(backend):
    replies = [op(f"SELECT {i}") for i in range(6)]
    full = run(SELECT_TASK, replies, backend)
    last = run(SELECT_TASK, replies, backend, context="last_n", context_last_n=2)
    comp = run(SELECT_TASK, replies, backend, context="compress", context_last_n=2)
    f, l, c = full.messages(), last.messages(), comp.messages()
    assert len(f) == 3 + 12 and l == f[:3] + f[-4:]
    assert len(c) == len(f) and c[-4:] == f[-4:] and c[4]["content"].startswith("[earlier observation elided")
    for e in (full, last, comp):
        e.abort("t")


# ------------------------------------------------------------------ turn budget

def test_fifteen_statements_then_one_more_reply(backend):
    ep = run(SELECT_TASK, [op("SELECT 1")] * 15 + [ans(["City07"])], backend)
    r = ep.result()
    assert r["success"] and r["num_turns"] == 16 and r["num_statements"] == 15
    ep = run(SELECT_TASK, [op("SELECT 1")] * 16, backend)
    r = ep.result()
    assert ep.done and r["failure_mode"] == "turn_limit" and r["num_statements"] == 15 and r["num_turns"] == 16
    # At the limit, a Final Answer anywhere in the last reply counts, even after an Operation ...
    ep = run(SELECT_TASK, [op("SELECT 1")] * 15 + [op("SELECT 2") + '\nFinal Answer: ["City07"]'], backend)
    assert ep.result()["success"] and ep.result()["num_statements"] == 15
    # ... and an empty Final Answer there is a turn limit, while below the limit it is an (empty) answer.
    ep = run(SELECT_TASK, [op("SELECT 1")] * 15 + ["Action: Answer\nFinal Answer:"], backend)
    assert ep.result()["failure_mode"] == "turn_limit"
    ep = run(SELECT_TASK, ["Action: Answer\nFinal Answer:"], backend)
    assert ep.result()["status"] == "answered" and ep.result()["answer"] == ""


def test_max_rounds_knob(backend):
    ep = run(SELECT_TASK, [op("SELECT 1")] * 3, backend, max_rounds=2)
    assert ep.done and ep.result()["failure_mode"] == "turn_limit" and ep.result()["num_statements"] == 2
    ep = run(SELECT_TASK, [op("SELECT 1")] * 20 + [ans(["City07"])], backend, max_rounds=30)
    assert ep.result()["success"] and ep.result()["num_statements"] == 20


# ------------------------------------------------------------------ malformed replies, verification, answers

def test_malformed_fails_at_once_or_gets_feedback(backend):
    ep = run(SELECT_TASK, ["I think it is City07."], backend)
    assert ep.done and ep.result()["failure_mode"] == "malformed_action" and ep.turn == 1
    ep = run(SELECT_TASK, ["I think it is City07.", "still thinking", ans(["City07"])], backend,
             on_malformed="retry", max_format_retries=2)
    r = ep.result()
    assert r["success"] and r["actions"] == ["malformed", "malformed", "answer"]
    assert [t["feedback"] for t in r["turns"]] == ["format_retry", "format_retry", None]
    assert "could not be parsed" in r["turns"][0]["observation"]
    ep = run(SELECT_TASK, ["a", "b", "c", ans(["City07"])], backend, on_malformed="retry", max_format_retries=2)
    assert ep.result()["failure_mode"] == "malformed_action" and ep.turn == 3


def test_lenient_parse_through_the_episode(backend):
    slips = ["```sql\nSELECT 1\n```", "Final Answer: [\"City07\"]"]
    assert run(SELECT_TASK, slips, backend).result()["failure_mode"] == "malformed_action"
    r = run(SELECT_TASK, slips, backend, parse_mode="lenient").result()
    assert r["success"] and r["actions"] == ["sql", "answer"]


def test_verify_before_answer(backend):
    ep = run(SELECT_TASK, [ans(["City08"])], backend)
    assert ep.result()["failure_mode"] == "answered_without_querying"
    ep = run(SELECT_TASK, [ans(["City08"]), op("SELECT name FROM cities WHERE population = '7000'"), ans(["City07"])],
             backend, verify_before_answer=True)
    r = ep.result()
    assert r["success"] and r["turns"][0]["feedback"] == "verify" and r["turns"][0]["observation"] == dbbench_harness.VERIFY_PROMPT
    # one prompt per episode: the second premature answer is accepted
    ep = run(SELECT_TASK, [ans(["City08"]), ans(["City08"])], backend, verify_before_answer=True)
    assert ep.result()["failure_mode"] == "answered_without_querying" and ep.turn == 2
    # after a successful statement a non-empty answer is accepted at once, an empty one is questioned
    ep = run(SELECT_TASK, [op("SELECT 1"), ans(["City07"])], backend, verify_before_answer=True)
    assert ep.result()["success"] and ep.turn == 2
    ep = run(SELECT_TASK, [op("SELECT 1"), ans([""]), ans(["City07"])], backend, verify_before_answer=True)
    assert ep.result()["success"] and ep.turn == 3
    # modifications: the answer can be anything once a statement succeeded
    ep = run(INSERT_TASK, [op(INSERT_SQL), ans([])], backend, verify_before_answer=True)
    assert ep.result()["success"] and ep.turn == 2


def test_answer_normalization(backend):
    slipped = "Action: Answer\nFinal Answer: [\"  'City07' \"]"
    r = run(SELECT_TASK, [op("SELECT 1"), slipped], backend).result()
    assert not r["success"] and r["failure_mode"] == "answer_format" and r["answer"] == r["raw_answer"]
    r = run(SELECT_TASK, [op("SELECT 1"), slipped], backend, answer_normalization="strip").result()
    assert r["success"] and r["answer"] == '["City07"]'


# ------------------------------------------------------------------ modifications and scoring

def test_modifications_are_scored_by_the_final_table(backend):
    r = run(INSERT_TASK, [op(INSERT_SQL), ans(["anything"])], backend).result()
    assert r["success"] and r["reward"] == 1.0 and r["table_changed"] is True
    # as published: the hash decides even when the episode then ends on a malformed reply
    r = run(INSERT_TASK, [op(INSERT_SQL), "oops"], backend).result()
    assert r["success"] and r["status"] == "malformed" and r["failure_mode"] == "success"
    r = run(INSERT_TASK, [ans(["done"])], backend).result()
    assert r["failure_mode"] == "answered_without_querying" and r["table_changed"] is False
    r = run(INSERT_TASK, [op("SELECT 1"), ans(["done"])], backend).result()
    assert r["failure_mode"] == "no_modification"
    r = run(INSERT_TASK, [op(INSERT_SQL), op(INSERT_SQL), ans(["done"])], backend).result()
    assert r["failure_mode"] == "wrong_modification"  # a doubled insert
    r = run(INSERT_TASK, [op("DROP TABLE cities"), ans(["done"])], backend).result()
    assert not r["success"] and r["failure_mode"] == "wrong_modification"


def test_result_record(backend):
    ep = run(SELECT_TASK, [op("SELECT nope FROM cities"), op("SELECT 1"), ans(["City07"])], backend)
    r = ep.result()
    check_result(r)
    assert set(RESULT_KEYS) <= set(r)
    assert r["task_id"] == "t-select" and r["type"] == "other" and r["harness"] == "base"
    assert r["actions"] == ["sql", "sql", "answer"] and r["sql_errors"] == 1 and r["num_turns"] == 3
    assert r["turns"][0]["ok"] is False and r["turns"][0]["obs_chars"] == len(r["turns"][0]["observation"])
    json.dumps(r)
    assert ep.info["task"] is SELECT_TASK and ep.info["harness"] == "base" and ep.info["episode_id"]


# ------------------------------------------------------------------ life cycle and robustness

def test_life_cycle_errors_and_abort(backend):
    ep = DBBenchEpisode(SELECT_TASK, BASE, backend)
    with pytest.raises(RuntimeError, match="reset"):
        ep.messages()
    ep.reset()
    with pytest.raises(RuntimeError, match="before the episode ended"):
        ep.result()
    ep.step(op("SELECT 1"))
    ep.abort("context_overflow")
    assert ep.done and ep._db is None and ep.result()["failure_mode"] == "context_overflow"
    ep.abort("again")  # no-op
    assert ep.result()["abort_reason"] == "context_overflow"
    with pytest.raises(RuntimeError, match="after the episode ended"):
        ep.step("x")
    ep.reset()  # a reset starts afresh
    assert not ep.done and ep.turn == 0 and len(ep.messages()) == 3
    ep.abort("rollout_error")
    assert ep.result()["failure_mode"] == "env_error"


class _FlakyBackend:
    """Wraps a backend; counts opens/closes; can fail on open, execute or hash."""

    def __init__(self, inner, fail_on):
        self.inner, self.fail_on, self.opened, self.closed = inner, fail_on, 0, 0

    def open(self, task):
        if self.fail_on == "open":
            raise OSError("disk full")
        self.opened += 1
        db, outer = self.inner.open(task), self

        class DB:
            def execute(self, sql):
                if outer.fail_on == "execute":
                    raise ConnectionError("server went away")
                return db.execute(sql)

            def table_hash(self):
                if outer.fail_on == "hash":
                    raise ConnectionError("server went away")
                return db.table_hash()

            def close(self):
                outer.closed += 1
                db.close()

        return DB()


@pytest.mark.parametrize("fail_on", ["open", "execute", "hash"])
def test_environment_failures_end_the_episode_cleanly(backend, fail_on):
    flaky = _FlakyBackend(backend, fail_on)
    task = INSERT_TASK if fail_on == "hash" else SELECT_TASK
    ep = DBBenchEpisode(task, BASE, flaky)
    ep.reset()
    if not ep.done:
        ep.step(op("SELECT 1"))
    if not ep.done:
        ep.step(ans(["x"]))
    r = ep.result()
    assert ep.done and r["failure_mode"] == "env_error" and not r["success"] and r["error"]
    assert flaky.opened == flaky.closed


def test_fuzzed_and_hostile_replies_never_crash(backend, tmp_path):
    attach_target = tmp_path / "attached.db"
    rng = random.Random(0)
    alphabet = "Action: Operation Answer Final\n```sql SELECT * FROM cities;'\"\\`\x00\ud800é[]()"
    hostile = [
        op(f"ATTACH DATABASE '{attach_target}' AS y"), op("SELECT load_extension('x')"),
        op("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n+1 FROM r) SELECT n FROM r"),
        op("SELECT 1; DROP TABLE cities"), op("DROP TABLE cities"), op("\ud800"), op("SELECT '\x00'"),
        "Action: Operation\n```sql\n\n```", "x" * 200_000, "Final Answer" * 1000, None, b"\xff\xfe",
        "\nFinal Answer: " + "[" * 500, "\nFinal Answer: __import__('os').system('echo pwned')",
    ]
    replies = hostile + ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 300))) for _ in range(150)]
    for spec in (BASE, BASE.with_knobs(parse_mode="lenient", on_malformed="retry", obs_page_rows=5,
                                             verify_before_answer=True, answer_normalization="numeric",
                                             schema_reminder_on_error=True, context="compress")):
        for i in range(0, len(replies), 4):
            for task in (SELECT_TASK, INSERT_TASK):
                ep = DBBenchEpisode(task, spec, backend)
                ep.reset()
                for reply in replies[i:i + 4]:
                    if ep.done:
                        break
                    ep.step(reply)
                    assert all(isinstance(m["content"], str) for m in ep.messages()) or ep.done
                if not ep.done:
                    ep.abort("test")
                r = ep.result()
                json.dumps(r)
                assert r["failure_mode"] in taxonomy.FAILURE_MODES and ep._db is None
    assert not attach_target.exists()


# ------------------------------------------------------------------ failure taxonomy, rule by rule

def _sql(ok, truncated=False):
    return taxonomy.ActionRecord(kind="sql", reply="", sql="q", ok=ok, truncated=truncated)


ANSWER = taxonomy.ActionRecord(kind="answer", reply="")


def _outcome(status="answered", success=False, modification=False, **kw):
    return {"status": status, "abort_reason": kw.get("abort_reason"), "success": success,
            "is_modification": modification, "table_changed": kw.get("table_changed"),
            "correct_if_normalized": kw.get("correct_if_normalized", False)}


@pytest.mark.parametrize("turns, outcome, mode", [
    ([_sql(True), ANSWER], _outcome(success=True), "success"),
    ([_sql(True)], _outcome("malformed", success=True, modification=True), "success"),
    ([_sql(True)], _outcome("aborted", abort_reason="context_overflow"), "context_overflow"),
    ([_sql(True)], _outcome("aborted", abort_reason="env_error"), "env_error"),
    ([_sql(True)], _outcome("aborted", abort_reason="policy_error"), "policy_error"),
    ([], _outcome("env_error", success=True), "env_error"),
    ([_sql(False), _sql(False), _sql(False)], _outcome("malformed"), "malformed_action"),
    ([_sql(False), _sql(False), _sql(False), _sql(True), ANSWER], _outcome(), "sql_error_loop"),
    ([_sql(True), _sql(False), ANSWER], _outcome(), "sql_error_loop"),
    ([_sql(False), _sql(False), _sql(True), ANSWER], _outcome(), "wrong_answer"),
    ([_sql(True)] * 16, _outcome("turn_limit"), "turn_limit"),
    ([_sql(False)] * 16, _outcome("turn_limit"), "sql_error_loop"),
    ([ANSWER], _outcome(correct_if_normalized=True), "answer_format"),
    ([ANSWER], _outcome(), "answered_without_querying"),
    ([ANSWER], _outcome(modification=True, table_changed=False), "answered_without_querying"),
    ([_sql(True, truncated=True), ANSWER], _outcome(), "truncated_observation"),
    ([_sql(True), ANSWER], _outcome(modification=True, table_changed=False), "no_modification"),
    ([_sql(True), ANSWER], _outcome(modification=True, table_changed=True), "wrong_modification"),
    ([_sql(True), ANSWER], _outcome(), "wrong_answer"),
])
def test_taxonomy_rules(turns, outcome, mode):
    assert taxonomy.assign(turns, outcome) == mode


def test_taxonomy_rejects_unknown_status():
    with pytest.raises(ValueError, match="not one of"):
        taxonomy.assign([], _outcome("exploded"))
