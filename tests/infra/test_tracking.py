"""The metric writers (hsjax/infra/tracking.py): JSON lines, TensorBoard and W&B (offline) each get the
config, the scalar metrics and the sample tables; the fan-out; W&B missing is one line; a resumed run
continues the W&B run and logs no step twice; and a two-step smoke training run with W&B offline.

Everything written is read back with the formats' own readers: TensorBoard's event records
(`tensorboardX.proto`) and the W&B transaction log (`wandb.proto`, records in LevelDB's log format).
No test reaches for the network: a local listener stands in for the W&B server and every proxy,
and must receive no connection."""
import glob
import json
import os
import socket
import struct
import sys
import time

import pytest
from ml_collections import ConfigDict

from hsjax.infra import config_checks, tracking
from hsjax.infra.errors import UserError
from hsjax.infra.metrics import read_metrics
from hsjax.infra.tracking import FanOutWriter, JsonlWriter, TensorBoardWriter, WandbWriter

wandb = pytest.importorskip("wandb")


# ---------------------------------------------------------------------------------------------------
# Readers of what the backends wrote.

def wandb_records(run_dir) -> list:
    """Every record of a run's `run-<id>.wandb` file, once W&B's service has written the last one
    (`exit`; `run.finish()` can return before)."""
    deadline = time.monotonic() + 30
    while True:
        records = read_wandb_log(run_dir)
        if (records and records[-1].WhichOneof("record_type") == "exit") or time.monotonic() > deadline:
            return records
        time.sleep(0.1)


def read_wandb_log(run_dir) -> list:
    """The records of `run-<id>.wandb`: LevelDB log blocks of 32 KiB after a 7-byte W&B header, each
    chunk 7 bytes of header (crc, length, type: full, first, middle, last)."""
    from wandb.proto import wandb_internal_pb2
    (path,) = glob.glob(os.path.join(run_dir, "run-*.wandb"))
    data = open(path, "rb").read()
    assert data[:4] == b":W&B"
    records, pending, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def wandb_history(run_dir) -> dict[int, dict]:
    """{step: {key: value}} of a W&B run directory's history records."""
    out = {}
    for record in wandb_records(run_dir):
        if record.WhichOneof("record_type") == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            out[row["_step"]] = row
    return out


def wandb_config(run_dir) -> dict:
    config = {}
    for record in wandb_records(run_dir):
        kind = record.WhichOneof("record_type")
        updates = record.run.config.update if kind == "run" else record.config.update if kind == "config" else []
        config.update({u.key: json.loads(u.value_json) for u in updates})
    return config


def wandb_table(run_dir, history_row: dict, name: str) -> dict:
    with open(os.path.join(run_dir, "files", history_row[f"{name}/path"])) as f:
        return json.load(f)


def wandb_runs(workdir) -> list[str]:
    return sorted(glob.glob(os.path.join(workdir, "wandb", "offline-run-*")))


def tb_events(workdir) -> list:
    """Every event of every event file under `<workdir>/tb`, in file order (TFRecord framing)."""
    from tensorboardX.proto import event_pb2
    events = []
    for path in sorted(glob.glob(os.path.join(workdir, "tb", "events.out.tfevents.*"))):
        data, pos = open(path, "rb").read(), 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            event = event_pb2.Event()
            event.ParseFromString(data[pos + 12:pos + 12 + length])
            events.append((path, event))
            pos += 12 + length + 4
    return events


def tb_values(workdir) -> dict[str, list]:
    """{tag: [(step, scalar or text)]} over all event files."""
    out = {}
    for _, event in tb_events(workdir):
        for value in event.summary.value:
            item = value.simple_value if value.HasField("simple_value") else value.tensor.string_val[0].decode() \
                if value.tensor.string_val else value.metadata.plugin_data.plugin_name
            out.setdefault(value.tag.removesuffix("/text_summary"), []).append((event.step, item))
    return out


def tb_hparams(workdir) -> dict:
    """The hparams of the run's session-start record (TensorBoard's HParams plugin)."""
    from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData
    for _, event in tb_events(workdir):
        for value in event.summary.value:
            if value.tag == "_hparams_/session_start_info":
                data = HParamsPluginData.FromString(value.metadata.plugin_data.content)
                return {k: getattr(v, v.WhichOneof("kind")) for k, v in data.session_start_info.hparams.items()}
    return {}


# ---------------------------------------------------------------------------------------------------
# The environment: W&B offline, in tmp, silent, and a listener that no connection may reach.

@pytest.fixture(scope="module")
def no_network():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    yield listener, url
    listener.close()
    wandb.teardown()  # the W&B service of this process, started with this module's environment


@pytest.fixture(autouse=True)
def offline_wandb(no_network, tmp_path, monkeypatch):
    listener, url = no_network
    for key in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(key, str(tmp_path / "wandb_home" / key.lower()))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_BASE_URL", url)
    for key in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
        monkeypatch.setenv(key, url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    yield
    try:
        connection, _ = listener.accept()
    except BlockingIOError:
        return
    connection.close()
    pytest.fail("something reached for the network (the stand-in server or proxy got a connection)")


def small_config(wandb_mode="offline", tensorboard=True, **log):
    return ConfigDict({"seed": 3, "optim": {"learning_rate": 1e-6, "T_buckets": (8, 16)},
                       "log": {"tensorboard": tensorboard, "wandb": wandb_mode, "wandb_project": "hsjax-tests",
                               "wandb_entity": "", "wandb_run_name": "", "table_rows": 2, "table_chars": 10, **log}})


ROWS = [{"task": "t1", "harness": "base", "turns": 2, "success": True, "text": "SELECT 1 | x"},
        {"task": "t2", "harness": "base", "turns": 1, "success": False, "text": "line\nbreak"}]


def write_eval_file(workdir, split, step):
    episodes = [{"task_id": f"task-{i}", "harness": "base", "num_turns": i + 1, "success": i == 0,
                 "reward": 1.0 - i, "replies": ["a" * 30, "b"]} for i in range(3)]
    episodes[2]["sampled"] = True
    os.makedirs(os.path.join(workdir, "eval"), exist_ok=True)
    with open(os.path.join(workdir, "eval", f"{split}_step{step:06d}.json"), "w") as f:
        json.dump({"step": step, "summary": {}, "episodes": episodes}, f)


# ---------------------------------------------------------------------------------------------------
# Each backend gets config, metrics and tables.

def test_every_backend_receives_config_metrics_and_the_sample_table(tmp_path):
    workdir = str(tmp_path / "run")
    writer = tracking.from_config(small_config(), workdir)
    assert [type(w) for w in writer.writers] == [JsonlWriter, TensorBoardWriter, WandbWriter]
    writer.truncate_after(0)
    row = writer.write(1, {"reward/mean": 0.25, "loss/pg": float("nan"), "note": "text"})
    assert row == {"step": 1, "reward/mean": 0.25, "loss/pg": None, "note": "text"}
    write_eval_file(workdir, "heldout", 2)
    writer.write(2, {"reward/mean": 0.5, "eval/heldout/base/success": 0.5})
    writer.write_table(2, "custom", ROWS)
    writer.close()

    # JSON lines: config.json, metrics.jsonl, tables.jsonl.
    assert json.load(open(os.path.join(workdir, "config.json")))["optim"]["T_buckets"] == [8, 16]
    assert [r["reward/mean"] for r in read_metrics(workdir)] == [0.25, 0.5]
    tables = [json.loads(line) for line in open(os.path.join(workdir, "tables.jsonl"))]
    assert [(t["step"], t["table"]) for t in tables] == [(2, "eval/heldout/samples"), (2, "custom")]
    samples = tables[0]["rows"]
    assert [r["task"] for r in samples] == ["task-0", "task-1"]  # table_rows=2
    assert samples[0] == {"task": "task-0", "harness": "base", "turns": 1, "success": True, "reward": 1.0,
                          "sampled": False, "text": "aaaaaaaaaa…[truncated 26 chars]"}  # table_chars=10

    # TensorBoard: scalars, hparams, the config and the tables as text.
    values = tb_values(workdir)
    assert values["reward/mean"] == [(1, 0.25), (2, 0.5)] and "loss/pg" not in values
    assert values["eval/heldout/base/success"] == [(2, 0.5)]
    assert tb_hparams(workdir) == {"seed": 3, "optim.learning_rate": 1e-6, "optim.T_buckets": "[8, 16]",
                                   "log.tensorboard": True, "log.wandb": "offline", "log.wandb_project": "hsjax-tests",
                                   "log.wandb_entity": "", "log.wandb_run_name": "", "log.table_rows": 2,
                                   "log.table_chars": 10}
    assert '"learning_rate": 1e-06' in values["config"][0][1]
    (step, text), = values["eval/heldout/samples"]
    assert step == 2 and text.splitlines()[0] == "| task | harness | turns | success | reward | sampled | text |"
    assert "SELECT 1 \\| x" in values["custom"][0][1] and "line\\nbreak" in values["custom"][0][1]

    # W&B: the config, the history and the tables, read back from the offline run's own log.
    (run_dir,) = wandb_runs(workdir)
    assert wandb_config(run_dir)["optim"] == {"learning_rate": 1e-6, "T_buckets": [8, 16]}
    history = wandb_history(run_dir)
    assert history[1]["reward/mean"] == 0.25 and history[2]["eval/heldout/base/success"] == 0.5
    assert "loss/pg" not in history[1]  # a non-finite value is not logged as a number
    table = wandb_table(run_dir, history[2], "eval/heldout/samples")
    assert table["columns"] == ["task", "harness", "turns", "success", "reward", "sampled", "text"]
    assert table["data"][1][:4] == ["task-1", "base", 2, False]
    assert wandb_table(run_dir, history[2], "custom")["data"][0] == ["t1", "base", 2, True, "SELECT 1 | x"]


def test_fan_out_hands_each_call_to_every_writer_and_disabled_writes_nothing(tmp_path):
    class Recorder(tracking.MetricsWriter):
        def __init__(self):
            self.calls = []

        def write(self, step, row):
            self.calls.append(("write", step, dict(row)))

        def write_config(self, config):
            self.calls.append(("config", config))

        def write_table(self, step, name, rows):
            self.calls.append(("table", step, name, rows))

        def truncate_after(self, step):
            self.calls.append(("truncate", step))

        def close(self):
            self.calls.append(("close",))

    a, b = Recorder(), Recorder()
    writer = FanOutWriter([a, b])
    writer.write_config({"x": 1})
    writer.truncate_after(4)
    writer.write(5, {"m": 1})
    writer.write_table(5, "t", [{"c": 2}])
    writer.close()
    assert a.calls == b.calls == [("config", {"x": 1}), ("truncate", 4), ("write", 5, {"step": 5, "m": 1}),
                                  ("table", 5, "t", [{"c": 2}]), ("close",)]
    workdir = tmp_path / "other_process"
    idle = tracking.from_config(small_config(), str(workdir), enabled=False)
    assert idle.writers == [] and idle.write(1, {"m": 2}) == {"step": 1, "m": 2}
    idle.close()
    assert os.listdir(workdir) == []


# ---------------------------------------------------------------------------------------------------
# W&B optional, unread keys, resume.

def test_wandb_missing_is_one_line_before_the_run(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError; find_spec is None
    with pytest.raises(UserError, match=r"needs the optional package wandb: pip install wandb==0\.31\.0"):
        config_checks.check(small_config("offline"))
    with pytest.raises(UserError, match="pip install wandb==0.31.0, or set --config.log.wandb=off"):
        tracking.from_config(small_config("online"), str(tmp_path))
    config_checks.check(small_config("off"))  # W&B off needs no wandb
    tracking.from_config(small_config("off"), str(tmp_path)).close()
    with pytest.raises(UserError, match="log.wandb='yes' is out of range"):
        config_checks.check(small_config("yes"))


def test_wandb_keys_are_unread_when_wandb_is_off():
    from hsjax.infra import experiments
    from hsjax.modes import train
    config = experiments.get_config("dbbench", "smoke")
    assert train.unread(config)["log.wandb_project"] == "log.wandb=off"
    config.log.wandb = "offline"
    assert not {"log.wandb_project", "log.wandb_entity", "log.wandb_run_name"} & set(train.unread(config))


def test_a_resumed_run_continues_the_wandb_run_and_logs_no_step_twice(tmp_path):
    workdir = str(tmp_path / "run")
    first = tracking.from_config(small_config(), workdir)
    first.truncate_after(0)
    for step in (1, 2, 3):  # killed after logging step 3; its last checkpoint is step 2
        first.write(step, {"reward/mean": step / 10})
    first.close()
    second = tracking.from_config(small_config(), workdir)
    second.truncate_after(2)
    for step in (3, 4):
        second.write(step, {"reward/mean": step / 10 + 1})
    second.close()

    runs = wandb_runs(workdir)
    assert len(runs) == 2 and len({os.path.basename(glob.glob(f"{r}/run-*.wandb")[0]) for r in runs}) == 1
    first_run_id = json.load(open(os.path.join(workdir, "wandb", "hsjax_run.json")))
    assert first_run_id["step"] == 4 and runs[0].endswith(first_run_id["id"])
    assert sorted(wandb_history(runs[0])) == [1, 2, 3]
    assert {s: r["reward/mean"] for s, r in wandb_history(runs[1]).items()} == {4: 1.4}  # step 3 not again
    assert [(r["step"], r["reward/mean"]) for r in read_metrics(workdir)] == [(1, .1), (2, .2), (3, 1.3), (4, 1.4)]
    # TensorBoard: the second file starts with a purge at step 3, hiding the first file's step 3.
    by_file = {}
    for path, event in tb_events(workdir):
        by_file.setdefault(path, []).append(event)
    assert len(by_file) == 2
    purges = {tuple(e.step for e in events if e.HasField("session_log")): events for events in by_file.values()}
    assert sorted(purges) == [(1,), (3,)]  # each run's truncate_after(step) purges from step + 1
    assert [e.step for e in purges[3,] if e.summary.value and e.summary.value[0].tag == "reward/mean"] == [3, 4]


# ---------------------------------------------------------------------------------------------------
# End to end: two training steps through run.py with W&B offline.

def test_smoke_training_logs_to_wandb_offline_and_keeps_the_console_quiet(tmp_path):
    from tests.modes.test_train import run
    workdir = tmp_path / "smoke"
    proc = run(workdir, 2, "--config.log.wandb=offline", "--config.log.table_rows=3")
    assert "wandb" not in (proc.stdout + proc.stderr).lower(), proc.stdout + proc.stderr
    rows = read_metrics(workdir)
    (run_dir,) = wandb_runs(workdir)
    history = wandb_history(run_dir)
    assert sorted(history) == [1, 2]
    for row in rows:
        assert history[row["step"]]["reward/mean"] == row["reward/mean"]
        assert history[row["step"]]["rollouts/total"] == row["rollouts/total"]
    config = wandb_config(run_dir)
    assert config["total_steps"] == 2 and config["log"]["wandb"] == "offline"
    table = wandb_table(run_dir, history[2], "eval/standard_heldout/samples")
    episodes = json.load(open(workdir / "eval" / "standard_heldout_step000002.json"))["episodes"]
    assert [r[0] for r in table["data"]] == [e["task_id"] for e in episodes[:3]]
    samples = [json.loads(line) for line in open(workdir / "tables.jsonl")]
    assert [(t["step"], t["table"], len(t["rows"])) for t in samples] == [(2, "eval/standard_heldout/samples", 2)]
    assert "eval/standard_heldout/samples" in tb_values(workdir)
