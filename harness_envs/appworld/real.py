"""The real AppWorld, isolated: a worker process run by the python of AppWorld's own venv.

`RealAppWorld` starts `real_worker.py` with that interpreter (never importing AppWorld here, so its
pins never meet ours). One short-lived worker lists a split's tasks; each episode gets its own
worker (`RealSession`), started inside the sandbox walls of `harness_envs.sandbox` (no network,
writes only to the episode's directory, where AppWorld's outputs go), with AppWorld's data linked
in read-only from `root/data`.

What a user brings: the venv (`scripts/setup_appworld.sh`) and the data (`appworld download data`,
or a copy of a `data/` directory). Without data, the error names that command.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import select
import shutil
import subprocess
import tempfile
import threading

from harness_envs.appworld.session import Cell
from harness_envs.appworld.tasks import TaskTest
from harness_envs.sandbox import Limits, SandboxUser, child_env, isolation as resolve_isolation, wrap
from harness_envs.sandbox_mounts import venv_mounts

SPLITS = ("train", "dev", "test_normal", "test_challenge")
REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
WORKER = pathlib.Path(__file__).with_name("real_worker.py")
DEFAULT_PYTHON = REPO_ROOT / ".venv-appworld" / "bin" / "python"
SETUP_HELP = "create it with scripts/setup_appworld.sh (pip install appworld; appworld install)"
_FAILED = "Execution failed. Traceback:"
_STATUS = re.compile(r"status code is (\d{3})|(\d{3}) (?:Unauthorized|Unprocessable|Not Found)", re.I)
_STATUS_KIND = {"401": "auth", "422": "wrong_arguments", "404": "unknown_api"}
_CALL = re.compile(r"apis\.(\w+)\.(\w+)\s*\(")
REQUEST_TIMEOUT_S = 600.0
HELD_OUTPUT = "Not run yet: this cell calls complete_task; read the note below first."


class WorkerError(RuntimeError):
    """The AppWorld worker failed or refused a request (the message says why and what to do)."""


class SetupMissing(FileNotFoundError):
    """The AppWorld venv or its data is not where the config says (the message names the fix)."""


def data_help(root: str) -> str:
    return (f"AppWorld's data is not in {root}/data: run `appworld download data` there with the AppWorld venv "
            "(or copy a data/ directory in) and point benchmark.backend.root at it")


@dataclasses.dataclass(frozen=True)
class RealTask:
    task_id: str
    type: str  # the scenario (AppWorld's generator id): tasks of a scenario share their type
    question: str
    scenario_id: str
    split: str
    supervisor: dict
    kind: str = "unknown"


class Worker:
    """One worker process: JSON requests in, JSON replies out, one at a time."""

    def __init__(self, python: str, root: str, *, argv: list | None = None, cwd: str | None = None):
        self._lock = threading.Lock()
        self._stderr = tempfile.TemporaryFile()
        try:  # a minimal environment, never this process's (its API keys stay here)
            self.proc = subprocess.Popen(argv or [python, str(WORKER), root],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                         text=True, cwd=cwd, start_new_session=True, env=child_env(cwd or root))
        except OSError as e:
            raise WorkerError(f"could not start the AppWorld worker with {python}: {e}; {SETUP_HELP}") from None

    def request(self, op: str, *, timeout_s: float = REQUEST_TIMEOUT_S, **fields) -> dict:
        with self._lock:
            if self.proc.poll() is not None:
                raise WorkerError(f"the AppWorld worker has exited ({self.proc.returncode}): {self.stderr_tail()}")
            self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
            self.proc.stdin.flush()
            poller = select.poll()
            poller.register(self.proc.stdout.fileno(), select.POLLIN | select.POLLHUP)
            if not poller.poll(int(timeout_s * 1000)):
                self.proc.kill()
                raise WorkerError(f"the AppWorld worker did not answer {op!r} within {timeout_s:g} s; it was stopped")
            line = self.proc.stdout.readline()
        if not line:
            raise WorkerError(f"the AppWorld worker ended during {op!r}: {self.stderr_tail()}")
        reply = json.loads(line)
        if not reply.get("ok"):
            raise WorkerError(f"AppWorld {op}: {reply.get('error')}: {reply.get('message')}")
        return reply

    def stderr_tail(self, n: int = 2000) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode("utf-8", "replace")[-n:].strip() or "(no output)"

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "close"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
        self._stderr.close()


class RealAppWorld:
    """The real benchmark: `python` is the AppWorld venv's interpreter, `root` the directory that
    holds (or will hold) AppWorld's `data/`."""

    def __init__(self, *, python: str | None = None, root: str | None = None, limits: Limits = Limits(),
                 isolation: str = "auto", experiment: str = "hsjax"):
        self.python = str(python or DEFAULT_PYTHON)
        if not os.path.exists(self.python):
            raise SetupMissing(f"the AppWorld venv's python {self.python} does not exist; {SETUP_HELP}")
        self.root = os.path.abspath(root or os.environ.get("APPWORLD_ROOT") or REPO_ROOT)
        self.limits, self.isolation, self.experiment = limits, isolation, experiment
        self._catalog: Worker | None = None

    def check_data(self) -> None:
        if not os.path.isdir(os.path.join(self.root, "data", "tasks")):
            raise SetupMissing(data_help(self.root))

    def hello(self) -> dict:
        return self.catalog.request("hello")

    @property
    def catalog(self) -> Worker:
        if self._catalog is None:
            self._catalog = Worker(self.python, self.root)
        return self._catalog

    def load_split(self, name: str) -> list[RealTask]:
        if name not in SPLITS:
            raise ValueError(f"AppWorld split {name!r} is not one of {SPLITS}")
        self.check_data()
        tasks = self.catalog.request("tasks", split=name)["tasks"]
        return [RealTask(t["task_id"], t["task_id"].split("_")[0], t["instruction"], t["task_id"].split("_")[0], name,
                         _supervisor(t["supervisor"])) for t in tasks]

    def open(self, task: RealTask) -> "RealSession":
        self.check_data()
        return RealSession(self, task)

    def close(self) -> None:
        catalog, self._catalog = self._catalog, None
        if catalog is not None:
            catalog.close()


def _supervisor(raw: dict) -> dict:
    return {"first_name": raw.get("first_name", ""), "last_name": raw.get("last_name", ""),
            "email": raw.get("email", ""), "phone": raw.get("phone_number", raw.get("phone", ""))}


class RealSession:
    """One task's real world in its own sandboxed worker; its outputs go to a temporary directory
    that is also the worker's AppWorld root (with `data` linked from the real root)."""

    def __init__(self, owner: RealAppWorld, task: RealTask):
        self.task = task
        self.dir = tempfile.mkdtemp(prefix="hsjax-appworld-")
        os.symlink(os.path.join(owner.root, "data"), os.path.join(self.dir, "data"))
        self.owner = owner
        self._hold = self._completed = False
        self.worker = None
        self.user: SandboxUser | None = None
        try:
            if os.geteuid() == 0:  # the worker runs the agent's code: as a uid of this session's own
                self.user = SandboxUser.lease()
                self.user.own(self.dir)
            self.worker = self._start_worker()
            self.worker.request("open", task_id=task.task_id, experiment=owner.experiment,
                                timeout_s=int(owner.limits.wall_s))
        except Exception:
            self.close()
            raise

    def _start_worker(self) -> Worker:
        """The worker under the sandbox: bubblewrap shows it the AppWorld venv, the worker script
        and the data read-only besides the session directory; as root it drops to the session's
        uid with `setpriv` (util-linux: no capabilities, no_new_privs, no groups) before AppWorld
        starts. Not exercised by the CPU suite (it needs the AppWorld venv)."""
        mode = resolve_isolation(self.owner.isolation)
        venv = os.path.dirname(os.path.dirname(os.path.abspath(self.owner.python)))
        argv = [self.owner.python, str(WORKER), self.dir]
        if self.user is not None:
            uid = str(self.user.uid)
            argv = ["setpriv", "--reuid", uid, "--regid", uid, "--clear-groups", "--no-new-privs",
                    "--inh-caps=-all", "--bounding-set=-all", "--", *argv]
        show = [*venv_mounts(venv), str(WORKER), os.path.realpath(os.path.join(self.owner.root, "data"))]
        argv = wrap(argv, self.dir, mode, show=show, drop_to_user=self.user is not None)
        return Worker(self.owner.python, self.dir, argv=argv, cwd=self.dir)

    def hold_completion(self) -> None:
        self._hold = True

    def run(self, code: str) -> Cell:
        if self._hold and "complete_task" in code:
            # AppWorld's complete_task runs inside its process: the confirmation knobs hold back the
            # first cell that calls it, before it runs (docs/appworld.md).
            self._hold = False
            return Cell(HELD_OUTPUT, held=True)
        output = self.worker.request("execute", code=code, timeout_s=self.owner.limits.wall_s + 60)["output"]
        failed = output.startswith(_FAILED)
        kinds = [_STATUS_KIND[m.group(1) or m.group(2)] for m in _STATUS.finditer(output)
                 if (m.group(1) or m.group(2)) in _STATUS_KIND] if failed else []
        # The API named by the last call in the traceback's source lines (the docs notes need it).
        calls = _CALL.findall(output) if failed else []
        app, api = calls[-1] if calls else ("", "")
        error, timed_out = None, failed and "timed out" in output
        if failed:
            last = output.strip().splitlines()[-1]
            error = ("TimeoutError" if timed_out else "SyntaxError" if "Syntax error" in output
                     else "ApiError" if kinds else last.split(":")[0][:40])
        completed = "complete_task" in code and self.worker.request("completed")["completed"]
        self._completed = self._completed or completed
        return Cell("" if failed else output, error=error, traceback=output[len(_FAILED):].lstrip() if failed else None,
                    api_errors=[{"kind": k, "app": app, "api": api} for k in kinds], timed_out=timed_out,
                    completed=completed)

    def changes(self) -> list[str]:
        return ["(the real AppWorld backend does not list changes; check them with the apps' APIs)"]

    def evaluate(self):
        """AppWorld's evaluator in a fresh worker, on the state the episode's worker saved after its
        last cell: code the episode ran in its own worker cannot reach its score."""
        self.worker.close()
        scorer = self._start_worker()
        try:
            report = scorer.request("score", task_id=self.task.task_id, experiment=self.owner.experiment)
        finally:
            scorer.close()
        tests = [TaskTest(name, True) for name in report["passes"]]
        tests += [TaskTest(name, False) for name in report["failures"]]
        return tests, ({"answer": None, "status": "success"} if self._completed else None)

    def app_signatures(self, app: str) -> str | None:
        try:
            apis = self.worker.request("api_descriptions", app=app)["apis"]
        except WorkerError:
            return None
        return "\n".join(f"apis.{app}.{a['name']}  # {a.get('description', '')}" for a in apis)

    def api_doc(self, app: str, api: str) -> dict | None:
        try:
            return self.worker.request("api_doc", app=app, api=api)["doc"]
        except WorkerError:
            return None

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
        if self.user is not None:
            self.user.kill_all()
            self.user.release()
            self.user = None
        shutil.rmtree(self.dir, ignore_errors=True)

