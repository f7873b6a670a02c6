"""Where a run's numbers go: one writer interface over JSON lines, TensorBoard and Weights & Biases.

`MetricsWriter` is what a backend implements: `write(step, row)` (one step's metrics),
`write_config(config)` (the run's config, once, as hparams), `write_table(step, name, rows)` (a table
of rows, e.g. sample rollouts of an evaluation), `truncate_after(step)` (a resumed run rewrites the
steps after its checkpoint) and `close()`. `FanOutWriter` hands every call to each enabled backend;
`from_config` builds it from `config.log` (docs/training.md, "Tracking"):

| backend | metrics | config | tables | resume |
| --- | --- | --- | --- | --- |
| JSON lines (always) | `metrics.jsonl` | `config.json` | `tables.jsonl`, a line per table | rows after the checkpoint dropped |
| TensorBoard (`log.tensorboard`) | scalars under `tb/` | hparams and a `config` text | a markdown text | `purge_step`: later events hidden |
| W&B (`log.wandb`: `off`, `offline`, `online`) | `run.log` | `run.config` | `wandb.Table` | the same run id; steps already logged skipped |

W&B is an optional dependency (requirements-test.txt installs it, requirements.txt does not): it is
imported only when `log.wandb` is not `off`, and a missing package is one line before the run starts
(`missing_packages`, checked by `config_checks.check`). Its run lives in `<workdir>/wandb/`; the run
id and the last step logged are kept in `<workdir>/wandb/hsjax_run.json`, so a resumed run continues
the same W&B run and never logs a step twice (W&B keeps no way to delete a logged step: a step the
killed run logged after its last checkpoint keeps the values it logged then). Its own log records go
to its files under `wandb/`, never to the console (`silent`, no console capture; `log.txt` gets one
line naming the run); offline it samples no system metrics, so nothing of it reaches for the network.

Only the main process of a multi-process run writes (`enabled`); the others hold no backend, and
`write` still returns the row.
"""
from __future__ import annotations

import abc
import importlib
import importlib.util
import json
import logging
import os
import uuid
from typing import Any, Mapping, Sequence

from hsjax.infra import metrics as metrics_lib
from hsjax.infra.errors import UserError

log = logging.getLogger(__name__)

WANDB_MODES = ("off", "offline", "online")
WANDB_PIN = "wandb==0.31.0"
WANDB_KEYS = ("wandb_project", "wandb_entity", "wandb_run_name")
TABLES_FILE = "tables.jsonl"
WANDB_STATE = os.path.join("wandb", "hsjax_run.json")


class MetricsWriter(abc.ABC):
    """One tracking backend. Rows and tables arrive JSON-ready (`metrics.to_python`)."""

    @abc.abstractmethod
    def write(self, step: int, row: Mapping[str, Any]) -> None:
        """One step's metrics (`row` holds `step` too)."""

    @abc.abstractmethod
    def write_config(self, config: Mapping[str, Any]) -> None:
        """The run's config as a nested dict, once, before the first step."""

    @abc.abstractmethod
    def write_table(self, step: int, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """A table at `step`: rows of the same columns (the first row's keys)."""

    def truncate_after(self, step: int) -> None:
        """Forgets what was written after `step`, as far as the backend can (a resumed run)."""

    def close(self) -> None:
        """Flushes and closes; nothing is written after."""


def _scalars(row: Mapping[str, Any]) -> dict[str, float]:
    return {k: v for k, v in row.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}


def markdown_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """`rows` as a markdown table (TensorBoard's text plugin renders it); `|` and newlines in cells
    are escaped so a reply cannot break the table."""
    if not rows:
        return "(no rows)"
    columns = list(rows[0])

    def cell(value) -> str:
        return str(value).replace("\\", "\\\\").replace("|", "\\|").replace("\n", "\\n")
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


class JsonlWriter(MetricsWriter):
    """`metrics.jsonl` (a row a step), `config.json`, `tables.jsonl` ({"step", "table", "rows"})."""

    def __init__(self, workdir: str):
        self.workdir = workdir
        self.path = os.path.join(workdir, "metrics.jsonl")
        self.tables_path = os.path.join(workdir, TABLES_FILE)

    def write(self, step, row):
        metrics_lib.append_jsonl(self.path, [row])

    def write_config(self, config):
        with open(os.path.join(self.workdir, "config.json"), "w") as f:
            f.write(json.dumps(config, indent=2, sort_keys=True))

    def write_table(self, step, name, rows):
        metrics_lib.append_jsonl(self.tables_path, [{"step": int(step), "table": name, "rows": list(rows)}])

    def truncate_after(self, step):
        metrics_lib.truncate_jsonl_after(self.path, step)
        metrics_lib.truncate_jsonl_after(self.tables_path, step)


def flat_hparams(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted keys to str, int, float or bool values (lists and None as their text): what
    TensorBoard's hparams plugin can hold."""
    out = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            out.update(flat_hparams(value, f"{prefix}{key}."))
        elif isinstance(value, (str, int, float, bool)):
            out[f"{prefix}{key}"] = value
        else:
            out[f"{prefix}{key}"] = json.dumps(value)
    return out


class TensorBoardWriter(MetricsWriter):
    """Event files under `<workdir>/tb`. Opened at the first write, so a resumed run's
    `truncate_after(step)` becomes the file's `purge_step` (TensorBoard hides the older files'
    events from step + 1 on) and the config (hparams plus a `config` text) is written after it."""

    def __init__(self, workdir: str):
        self.logdir = os.path.join(workdir, "tb")
        self._tb = None
        self._purge_step = None
        self._config = None

    def _writer(self):
        if self._tb is None:
            from tensorboardX import SummaryWriter  # Imported lazily: only the loop needs it.
            from tensorboardX.summary import hparams
            # A file of its own even when a resumed run opens one in the same second as the last.
            self._tb = SummaryWriter(self.logdir, purge_step=self._purge_step,
                                     filename_suffix=f".{uuid.uuid4().hex[:8]}")
            if self._config is not None:
                for summary in hparams(flat_hparams(self._config), {}):
                    self._tb.file_writer.add_summary(summary)
                text = json.dumps(self._config, indent=2, sort_keys=True)
                self._tb.add_text("config", "    " + text.replace("\n", "\n    "), 0)
        return self._tb

    def write(self, step, row):
        tb = self._writer()
        for name, value in _scalars(row).items():
            tb.add_scalar(name, value, int(step))
        tb.flush()

    def write_config(self, config):
        self._config = dict(config)

    def write_table(self, step, name, rows):
        self._writer().add_text(name, markdown_table(rows), int(step))

    def truncate_after(self, step):
        if self._tb is None:
            self._purge_step = step + 1 if self._purge_step is None else min(self._purge_step, step + 1)

    def close(self):
        if self._tb is not None:
            self._tb.close()


def import_wandb():
    """The `wandb` module, or one `UserError` line saying how to get it."""
    try:
        return importlib.import_module("wandb")
    except ImportError as e:
        raise UserError(f"log.wandb is on, but the optional package wandb is not installed ({e}): "
                        f"pip install {WANDB_PIN}, or set --config.log.wandb=off") from e


class WandbWriter(MetricsWriter):
    """A W&B run in `<workdir>/wandb/`, offline (`wandb sync` later) or online. The run id and the
    last step logged are kept in `<workdir>/wandb/hsjax_run.json`: a resumed run continues that run
    and skips the steps it logged before."""

    def __init__(self, workdir: str, *, mode: str, project: str, entity: str = "", name: str = ""):
        self.wandb = import_wandb()
        self.state_path = os.path.join(workdir, WANDB_STATE)
        state = {"id": uuid.uuid4().hex[:12], "step": -1}
        if os.path.exists(self.state_path):
            with open(self.state_path) as f:
                state.update(json.load(f))
        self.run_id, self.logged_through = state["id"], int(state["step"])
        self.resume_after = self.logged_through  # steps up to here were logged by an earlier process
        os.makedirs(os.path.dirname(self.state_path), exist_ok=True)
        self._save_state()
        settings = self.wandb.Settings(silent=True, console="off", x_disable_stats=mode == "offline")
        try:
            self.run = self.wandb.init(mode=mode, dir=workdir, project=project, entity=entity or None,
                                       name=name or os.path.basename(os.path.abspath(workdir)),
                                       id=self.run_id, resume="allow", settings=settings)
        except self.wandb.Error as e:
            raise UserError(f"log.wandb={mode}: wandb.init failed ({' '.join(str(e).split())[:300]}); "
                            "for online runs log in first (wandb login, or WANDB_API_KEY), or run with "
                            "--config.log.wandb=offline and `wandb sync` the run later") from e
        log.info("W&B run %s (%s) in %s", self.run_id, mode, self.run.dir)

    def _save_state(self):
        metrics_lib.write_json(self.state_path, {"id": self.run_id, "step": self.logged_through})

    def _fresh(self, step: int) -> bool:
        if step <= self.resume_after:
            log.info("W&B: step %d was logged before the resume; not logged again", step)
            return False
        return True

    def write(self, step, row):
        if self._fresh(step):
            self.run.log(_scalars(row), step=int(step))
            self.logged_through = max(self.logged_through, int(step))
            self._save_state()

    def write_config(self, config):
        self.run.config.update(dict(config), allow_val_change=True)

    def write_table(self, step, name, rows):
        if self._fresh(step) and rows:
            columns = list(rows[0])
            data = [[json.dumps(row.get(c)) if isinstance(row.get(c), (list, dict)) else row.get(c)
                     for c in columns] for row in rows]
            self.run.log({name: self.wandb.Table(columns=columns, data=data)}, step=int(step))

    def close(self):
        self.run.finish()


def eval_sample_rows(workdir: str, step: int, split: str, *, max_rows: int, max_chars: int) -> list[dict]:
    """Up to `max_rows` episodes of the evaluation file `eval/<split>_step<N>.json` as table rows:
    task, harness, turns, success, reward, whether it was a sampled draw, and the replies joined and
    cut to `max_chars` characters ([] when the file is missing)."""
    path = os.path.join(workdir, "eval", f"{split}_step{step:06d}.json")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        episodes = json.load(f).get("episodes", [])
    rows = []
    for record in episodes[:max_rows]:
        replies = record.get("replies") or []
        text = "\n---\n".join(str(r) for r in replies)
        rows.append({"task": str(record.get("task_id", "")), "harness": str(record.get("harness", "")),
                     "turns": int(record.get("num_turns", len(replies)) or 0),
                     "success": bool(record.get("success", False)), "reward": float(record.get("reward") or 0.0),
                     "sampled": bool(record.get("sampled", False)),
                     "text": metrics_lib.truncate_strings(text, max_chars)})
    return rows


class FanOutWriter(MetricsWriter):
    """Hands every call to each backend. `write(step, metrics)` converts the metrics to a JSON-ready
    row once and returns it; when the row holds an evaluation (`eval/<split>/base/success`) and
    `samples_from` names the run's workdir, the first `table_rows` episodes of each evaluated split
    also go out as the table `eval/<split>/samples` (`eval_sample_rows`)."""

    def __init__(self, writers: Sequence[MetricsWriter], *, samples_from: str | None = None,
                 table_rows: int = 16, table_chars: int = 400):
        self.writers = list(writers)
        self.samples_from, self.table_rows, self.table_chars = samples_from, table_rows, table_chars

    def write(self, step, metrics) -> dict:
        row = {"step": int(step)}
        row.update({k: metrics_lib.to_python(v) for k, v in metrics.items()})
        for writer in self.writers:
            writer.write(int(step), row)
        if self.writers and self.samples_from and self.table_rows > 0:
            splits = [k.split("/")[1] for k in row if k.startswith("eval/") and k.endswith("/base/success")]
            for split in splits:
                rows = eval_sample_rows(self.samples_from, int(step), split, max_rows=self.table_rows,
                                        max_chars=self.table_chars)
                if rows:
                    self.write_table(step, f"eval/{split}/samples", rows)
        return row

    def write_config(self, config):
        for writer in self.writers:
            writer.write_config(config)

    def write_table(self, step, name, rows):
        rows = [metrics_lib.to_python(r) for r in rows]
        for writer in self.writers:
            writer.write_table(int(step), name, rows)

    def truncate_after(self, step):
        for writer in self.writers:
            writer.truncate_after(step)

    def close(self):
        for writer in self.writers:
            writer.close()


def metric_writer(workdir: str, *, tensorboard: bool = True, enabled: bool = True) -> FanOutWriter:
    """`metrics.jsonl` and, with `tensorboard`, TensorBoard scalars: the writer of the study modes."""
    os.makedirs(workdir, exist_ok=True)
    writers = [JsonlWriter(workdir)] + ([TensorBoardWriter(workdir)] if tensorboard else [])
    return FanOutWriter(writers if enabled else [])


def from_config(config, workdir: str, *, enabled: bool = True) -> FanOutWriter:
    """The training run's writer from `config.log` (`tensorboard`, `wandb`, `wandb_project`,
    `wandb_entity`, `wandb_run_name` (empty: the workdir's name), `table_rows`, `table_chars`), with
    the config written to every backend (`config.json` among them)."""
    c = config.log
    os.makedirs(workdir, exist_ok=True)
    writers = []
    if enabled:
        writers.append(JsonlWriter(workdir))
        if c.get("tensorboard", False):
            writers.append(TensorBoardWriter(workdir))
        if c.get("wandb", "off") != "off":
            writers.append(WandbWriter(workdir, mode=c.wandb, project=c.get("wandb_project", "hsjax"),
                                       entity=c.get("wandb_entity", ""), name=c.get("wandb_run_name", "")))
    writer = FanOutWriter(writers, samples_from=workdir, table_rows=c.get("table_rows", 16),
                          table_chars=c.get("table_chars", 400))
    writer.write_config(json.loads(config.to_json_best_effort()))
    return writer


def unread(config) -> dict[str, str]:
    """The W&B keys a config holds but does not read (`log.wandb=off`)."""
    c = config.get("log")
    if c is None or c.get("wandb", "off") != "off":
        return {}
    return {f"log.{key}": "log.wandb=off" for key in WANDB_KEYS if key in c}


def missing_packages(config) -> list[str]:
    """One phrase per optional package the config needs but this environment lacks (W&B)."""
    mode = config.get("log", {}).get("wandb", "off")
    if mode in ("offline", "online") and importlib.util.find_spec("wandb") is None:
        return [f"--config.log.wandb={mode!r} needs the optional package wandb: pip install {WANDB_PIN}, "
                "or set --config.log.wandb=off"]
    return []
