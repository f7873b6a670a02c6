"""Red-team tests of evaluation (issue 36, item 4b): an eval never lies silently and never dies on
its own output.

* A hostile agent behind real HTTP whose replies hold a lone surrogate (a JSON \\udcff escape) or
  bytes that are not UTF-8 inside SQL strings: the DBBench eval finishes and writes valid UTF-8
  JSON (d648ba9: every episode ran, then write_json raised UnicodeEncodeError; rc 1).
* The rerun of such an eval from its episode log works (d648ba9: the log's surrogate failed again).
* Every writer of JSON or logs takes such strings (eval JSON, episode log, metrics.jsonl, episode
  files, log.txt, the console).
* A dead endpoint ends `run.py` non-zero with one line naming the count and the URL, after the
  results are written with the policy_error episodes counted (d648ba9: overall_cat 0.0, rc 0).
Each failed on d648ba9 (docs/reliability.md)."""
import json
import logging
import os
import subprocess
import sys

from harness_envs.dbbench.benchmark import DBBench
from hsjax.infra import console, experiments
from hsjax.infra.episode_log import EpisodeLog, fingerprint
from hsjax.infra.metrics import append_jsonl, write_episodes, write_json
from hsjax.infra.tracking import metric_writer
from hsjax.modes import evaluate
from tests.faults.hostile import dbbench_oracle, hostile, invalid_utf8_sql, surrogate_sql  # noqa: F401 (fixture)
from tests.modes.test_run_errors import ENV, REPO

SURROGATE = "\udcff"
FAST_POLICY = dict(timeout=2.0, max_retries=0, backoff=0.01, max_backoff=0.01)


def http_eval_config(base_url: str, limit: int):
    config = experiments.get_config("dbbench", "eval")
    config.limit = limit
    config.policy.kind, config.policy.base_url, config.policy.model = "http", base_url, "m"
    for key, value in FAST_POLICY.items():
        config.policy[key] = value
    return config


def read_utf8_json(path) -> dict:
    """The file as strict UTF-8 JSON: any unencodable character would fail here."""
    with open(path, "rb") as f:
        return json.loads(f.read().decode("utf-8"))


def test_surrogate_and_invalid_utf8_replies_through_a_real_dbbench_eval(tmp_path, hostile):
    config = http_eval_config("", limit=6)
    with DBBench() as bench:
        tasks = bench.load_split(config.split, limit=config.limit)
    surrogate_tasks = [tasks[0].task_id, tasks[1].task_id]
    broken = tasks[2].task_id
    server = hostile(dbbench_oracle(tasks, special={broken: invalid_utf8_sql()},
                                    opening={t: surrogate_sql() for t in surrogate_tasks}))
    config.policy.base_url = server.base_url
    out = evaluate.main(config, str(tmp_path))

    data = read_utf8_json(out["path"])
    episodes = {e["task_id"]: e for e in data["episodes"]}
    for task_id in surrogate_tasks:  # the hostile SQL ran, then the oracle answered: a success
        assert episodes[task_id]["failure_mode"] == "success", episodes[task_id]
        assert "SELECT 'hostile \\udcff output';" in episodes[task_id]["replies"][0]  # escaped, as text
    assert episodes[broken]["failure_mode"] == "policy_error" and "malformed" in episodes[broken]["rollout_error"]
    assert data["policy_errors"]["episodes"] == 1 and data["policy_errors"]["of"] == 6
    assert out["policy_errors"]["by_harness"] == {"base": 1}  # 1 of 6: under the bound, so no stop


def test_rerun_from_an_episode_log_holding_a_surrogate(tmp_path):
    """The log as d648ba9 left it after the failed write: records whose strings decode to a lone
    surrogate. The same command run again writes the result from it."""
    config = experiments.get_config("dbbench", "eval")
    config.limit = 3
    first = evaluate.main(config, str(tmp_path / "first"))
    records = read_utf8_json(first["path"])["episodes"]
    records[1]["raw_answer"] = f"answer {SURROGATE} with a lone surrogate"
    log = EpisodeLog(tmp_path / "w" / "eval" / "dbbench.episodes.jsonl",
                     fingerprint(config.to_dict(), evaluate.RESUMABLE_CHANGES))
    os.makedirs(os.path.dirname(log.path))
    with open(log.path, "w") as f:  # json.dumps' default ensure_ascii writes the surrogate as \udcff
        f.write(json.dumps({"fingerprint": log.fingerprint}) + "\n")
        f.writelines(json.dumps({"job": i, "record": r}) + "\n" for i, r in enumerate(records))
    out = evaluate.main(config, str(tmp_path / "w"))
    data = read_utf8_json(out["path"])
    assert data["episodes"][1]["raw_answer"] == "answer \\udcff with a lone surrogate"
    assert not os.path.exists(log.path)


def test_every_json_and_log_writer_takes_unencodable_strings(tmp_path, capsys):
    undecodable = b"\xff\xfe".decode("utf-8", "surrogateescape")  # invalid UTF-8 read as surrogateescape does
    hostile_text = f"SELECT '{SURROGATE}' -- {undecodable}"
    record = {"reply": hostile_text, hostile_text: [hostile_text], "n": 1}
    write_json(tmp_path / "eval" / "x.json", record)
    append_jsonl(str(tmp_path / "rows.jsonl"), [record])
    write_episodes(str(tmp_path), 3, [record])
    metric_writer(str(tmp_path), tensorboard=False).write(1, {"sample/reply": hostile_text})
    log = EpisodeLog(tmp_path / "eval" / "x.episodes.jsonl", "fp")
    log.start({0: record})
    log.append({1: record})
    assert read_utf8_json(tmp_path / "eval" / "x.json")["reply"] == "SELECT '\\udcff' -- \\udcff\\udcfe"
    for path in [tmp_path / "rows.jsonl", tmp_path / "episodes" / "step_000003.jsonl", tmp_path / "metrics.jsonl"]:
        for line in path.read_bytes().decode("utf-8").splitlines():
            assert SURROGATE not in json.dumps(json.loads(line), ensure_ascii=False), path
    for loaded in log.load().values():  # read back, nothing unencodable is left to trip a later write
        write_json(tmp_path / "again.json", loaded)
        assert loaded["reply"] == "SELECT '\\udcff' -- \\udcff\\udcfe"

    root = logging.getLogger()
    saved = list(root.handlers)
    try:
        log_path = console.setup_logging(str(tmp_path / "logs"))
        logging.getLogger("hsjax.test").warning("agent said %s", hostile_text)
        console.say(f"agent said {hostile_text}")
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
            handler.close()
        for handler in saved:
            root.addHandler(handler)
    captured = capsys.readouterr()
    assert "Logging error" not in captured.err
    assert "agent said SELECT '\\udcff'" in open(log_path, encoding="utf-8").read()


def test_a_dead_endpoint_ends_run_py_non_zero_with_the_episodes_counted(tmp_path, hostile):
    gone = hostile()
    gone.close()  # a port nothing listens on any more: every request is refused
    workdir = tmp_path / "w"
    overrides = [f"--config.policy.{k}={v}" for k, v in FAST_POLICY.items()]
    cmd = [sys.executable, str(REPO / "run.py"), "--config", f"{REPO}/experiments/dbbench.py:eval",
           "--config.policy.kind=http", f"--config.policy.base_url={gone.base_url}", "--config.policy.model=m",
           "--config.limit=2", *overrides, f"--workdir={workdir}"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("run.py: 2 of 2 episodes (100%) ended in policy_error") and gone.base_url in last, last
    assert "Traceback" not in proc.stderr
    assert "policy_error: 2 of 2 episodes" in proc.stdout
    data = read_utf8_json(workdir / "eval" / "dbbench.json")  # the results were written first
    assert data["policy_errors"]["episodes"] == 2 and data["policy_errors"]["share"] == 1.0
    assert {e["failure_mode"] for e in data["episodes"]} == {"policy_error"}


def test_the_policy_error_bound_is_a_config_key(tmp_path, hostile):
    """max_policy_error_share=1.0 accepts a dead endpoint's eval (rc 0), still counting it."""
    gone = hostile()
    gone.close()
    config = http_eval_config(gone.base_url, limit=2)
    config.max_policy_error_share = 1.0
    out = evaluate.main(config, str(tmp_path))
    assert out["policy_errors"]["episodes"] == 2
