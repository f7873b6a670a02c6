"""The local runtime gives each episode a private tree at the base commit that cannot reach the fixed
history, runs hostile commands inside walls (network, writes, time, output, processes), confines the
host-side file operations to the tree, and reports the agent's diff, new files included."""
import dataclasses
import os
import pathlib
import shutil
import subprocess
import tempfile
import threading
import time
import uuid

import pytest

from harness_envs import sandbox
from harness_envs.swegym import local_runtime
from harness_envs.swegym.runtime import WorkspaceError, files_of_tests
from tests.harness_envs.swegym.toy_repo import make_toy

needs_bwrap = pytest.mark.skipif(sandbox.isolation() != "bwrap",
                                 reason="NOT EXERCISED: bubblewrap (bwrap) is not installed or does not run here")
needs_own_uids = pytest.mark.skipif(os.geteuid() != 0 or sandbox.isolation() != "bwrap",
                                    reason="NOT EXERCISED: commands run as a leased uid only when the tests run as "
                                           "root with bubblewrap")
LIMITS = sandbox.Limits(wall_s=20, cpu_s=60, memory_mb=4096, file_mb=8, open_files=256, output_chars=5000)


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return make_toy(tmp_path_factory.mktemp("toy"))


@pytest.fixture(scope="module")
def runtime(toy):
    return local_runtime.LocalRuntime(toy.repos_dir, toy.venvs_dir, LIMITS)


@pytest.fixture
def ws(toy, runtime):
    with runtime.workspace(toy.instance) as workspace:
        yield workspace


def _host_processes(marker: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if marker in line and "ps -eo" not in line]


def _processes_of(uid: int) -> int:
    """How many processes of the machine have real uid `uid` (what RLIMIT_NPROC counts, less threads)."""
    count = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status", "rb") as f:
                count += next(int(line.split()[1]) for line in f if line.startswith(b"Uid:")) == uid
        except (OSError, StopIteration):
            pass  # gone meanwhile
    return count


# ---------------------------------------------------------------------------------------- the tree

def test_the_tree_holds_the_base_commit_alone(toy, ws):
    assert ws.root.endswith("/calc") and ws.read_file("calc/ops.py").count("return a + b") == 2
    log = ws.run("git log --all --format=%H; git tag; git remote; git stash list; git status --short")
    assert log.returncode == 0 and log.output.split() == [toy.instance.base_commit]  # no tag, remote or change
    assert set(os.listdir(os.path.join(ws.root, ".git"))) <= {"HEAD", "config", "index", "logs", "objects", "refs",
                                                              "shallow"}  # no FETCH_HEAD naming the source
    for sha in (toy.fixed_commit, toy.secret_commit):
        assert ws.run(f"git cat-file -e {sha}").returncode != 0
    assert str(toy.repos_dir) not in ws.run("cat .git/config .git/logs/HEAD").output


@needs_bwrap
@pytest.mark.parametrize("where", ["/tmp", "/var/tmp"])
def test_the_source_repository_the_project_and_other_episodes_are_hidden(where):
    """Under /tmp the private /tmp covers them all; elsewhere (/var/tmp) the runtime's `hide` must."""
    base = pathlib.Path(tempfile.mkdtemp(prefix="hsjax-test-", dir=where))
    try:
        toy = make_toy(base)
        runtime = local_runtime.LocalRuntime(toy.repos_dir, toy.venvs_dir, LIMITS, tmp_root=str(base))
        with runtime.workspace(toy.instance) as ws, runtime.workspace(toy.instance) as other:
            fetch = ws.run(f"git fetch --depth 1 file://{toy.repos_dir}/acme__calc.git {toy.fixed_commit}")
            assert fetch.returncode != 0 and ws.run(f"git cat-file -e {toy.fixed_commit}").returncode != 0
            assert ws.run(f"ls -A {toy.repos_dir} {base}/src 2>/dev/null").output == ""
            shown = ws.run(f"ls -A {local_runtime.PROJECT_ROOT}").output.split()
            assert set(shown) <= {".venv"}  # the venv alone is shown
            assert ws.run(f"ls -A {other.root}").returncode != 0 and os.path.isdir(os.path.join(other.root, "calc"))
    finally:
        shutil.rmtree(base)


def test_the_agent_commits_and_diff_reports_every_change(toy, ws):
    ws.write_file("calc/ops.py", ws.read_file("calc/ops.py").replace("return a + b\n\n\ndef mul",
                                                                      "return a - b\n\n\ndef mul"))
    ws.write_file("calc/extra/notes.py", "X = 1\n")  # parent directories made
    assert ws.run("git commit -qam 'fix sub' && git rm -q setup.cfg && echo 'y = 2' > new_file.py").returncode == 0
    diff = ws.diff()
    assert "-    return a + b\n+    return a - b" in diff
    for header in ("b/calc/extra/notes.py", "b/new_file.py", "deleted file mode 100644"):
        assert header in diff
    assert ".git" not in diff.replace("diff --git", "")
    # The diff is what a fresh checkout needs: it applies there.
    with ws.runtime.workspace(toy.instance) as fresh:
        assert fresh.run("git apply -v", stdin=diff).returncode == 0
        assert fresh.exists("new_file.py") == "file" and fresh.exists("setup.cfg") is None


def test_a_hostile_git_config_does_not_change_the_diff(ws):
    ws.write_file("a.py", "a = 1\n")
    ws.run("git config color.ui always && git config diff.noprefix true && git config diff.external false")
    assert ws.diff().startswith("diff --git a/a.py b/a.py\nnew file mode 100644\n")


def test_commands_see_the_venv_and_the_tree_and_no_host_variable(toy, ws, monkeypatch):
    monkeypatch.setenv("HSJAX_HOST_SECRET", "s3cret")
    result = ws.run("env; python -c 'import calc, sys; print(calc.__file__, sys.prefix)'; "
                    "python -m pytest -q -p no:cacheprovider tests/test_ops.py 2>&1 | tail -1")
    assert "s3cret" not in result.output and "PYTHONDONTWRITEBYTECODE=1" in result.output
    assert f"{ws.root}/calc/__init__.py {os.path.realpath(toy.venvs_dir / 'acme__calc')}" in result.output
    assert "3 passed, 1 xfailed" in result.output
    src = dataclasses.replace(toy.instance, extra={"pythonpath": "src"})
    with ws.runtime.workspace(src) as other:
        assert other.run("echo $PYTHONPATH").output.strip() == f"{other.root}/src"
    with pytest.raises(WorkspaceError, match="relative"):
        ws.runtime.workspace(dataclasses.replace(toy.instance, extra={"pythonpath": "../x"}))


# ---------------------------------------------------------------------------------------- hostile commands

@needs_bwrap
def test_no_network(ws):
    probe = ws.run("python -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=3)\"; "
                   "curl -sS -m 3 http://example.com || echo curl failed")
    assert "Network is unreachable" in probe.output or "Errno" in probe.output
    assert "<html" not in probe.output


@needs_bwrap
def test_writes_outside_the_tree_stay_out_of_the_host(toy, ws):
    name = f"hsjax-escape-{uuid.uuid4().hex}"
    result = ws.run(f"echo x > /tmp/{name} && cat /tmp/{name}; echo y > {toy.repos_dir}/{name}; "
                    f"echo z > {local_runtime.PROJECT_ROOT}/{name}; echo w > /etc/{name}; touch ../{name}")
    beside = os.path.join(os.path.dirname(ws.root), name)
    assert "x" in result.output and "Read-only file system" in result.output
    for path in (f"/tmp/{name}", toy.repos_dir / name, local_runtime.PROJECT_ROOT / name, f"/etc/{name}", beside):
        assert not os.path.exists(path), path
    assert ws.run(f"cat /tmp/{name}").output == "x\n"  # the private /tmp lasts the episode
    assert sorted(os.listdir(toy.repos_dir)) == ["acme__calc.git"]


def test_output_is_bounded_and_sleep_is_killed_at_the_wall(ws):
    loud = ws.run("yes hello | head -c 10000000")
    assert len(loud.output) == LIMITS.output_chars and loud.dropped == 10_000_000 - LIMITS.output_chars
    t0 = time.monotonic()
    slow = ws.run("sleep 1000", timeout_s=1.0)
    assert slow.timed_out and slow.returncode is None and time.monotonic() - t0 < 10
    assert ws.run("echo alive").output == "alive\n"


@needs_bwrap
def test_no_process_outlives_its_command(ws):
    """The wall clock, then the PID namespace's teardown (all that contains a fork bomb of a root
    command, `uids=None`): a bounded tree of 127 subshells, one setsid'd, and one that closed its
    output, so that nothing is left to signal the end."""
    marker = f"{1000 + uuid.uuid4().int % 1000}.{os.getpid()}"
    tree = (f"b() {{ if [ $1 -lt 6 ]; then b $(($1+1)) & b $(($1+1)) & fi; sleep {marker}; }}; "
            f"(setsid sleep {marker} &); b 0 & exec >&- 2>&-; sleep {marker}")
    result = ws.run(tree, timeout_s=3.0)
    assert result.timed_out
    time.sleep(0.5)
    assert _host_processes(f"sleep {marker}") == []


@needs_own_uids
def test_commands_run_as_a_uid_of_the_workspace_that_cannot_regain_root(toy, runtime, ws):
    uid = ws.user.uid
    assert uid in sandbox.SANDBOX_UIDS and runtime.limits.nproc == local_runtime.SANDBOX_NPROC
    who = ws.run("id -u; id -g; id -G; ulimit -u; grep -E '^(CapPrm|CapEff|NoNewPrivs)' /proc/self/status; "
                 "python -c 'import os; os.setuid(0)' 2>&1 | tail -1; touch $VIRTUAL_ENV/planted 2>&1")
    assert who.output.splitlines()[:4] == [str(uid)] * 3 + [str(local_runtime.SANDBOX_NPROC)]
    for line in ("CapPrm:\t0000000000000000", "CapEff:\t0000000000000000", "NoNewPrivs:\t1", "PermissionError"):
        assert line in who.output
    assert "Read-only file system" in who.output and not os.path.exists(os.path.join(ws._venv, "planted"))
    # What the host writes, the agent can edit, and what the agent writes, the host reads and diffs.
    ws.write_file("newpkg/deep/mod.py", "A = 1\n")
    edit = ws.run("echo 'B = 2' >> newpkg/deep/mod.py && echo 'C = 3' > newpkg/deep/other.py && mkdir -p calc/new "
                  "&& echo x > calc/new/f.txt && chmod 600 calc/new/f.txt && stat -c %u newpkg newpkg/deep/mod.py")
    assert edit.returncode == 0 and edit.output.split() == [str(uid)] * 2, edit.output
    assert ws.read_file("newpkg/deep/mod.py") == "A = 1\nB = 2\n" and ws.read_file("calc/new/f.txt") == "x\n"
    for header in ("b/newpkg/deep/mod.py", "b/newpkg/deep/other.py", "b/calc/new/f.txt"):
        assert header in ws.diff()
    owners = {os.lstat(os.path.join(d, n)).st_uid for d, dirs, files in os.walk(ws.root) for n in dirs + files}
    assert owners == {uid}
    # Each workspace has its own uid, held until it closes.
    with runtime.workspace(toy.instance) as other:
        lease = other.user
        assert lease.uid != uid and other.run("id -u").output.strip() == str(lease.uid)
        with pytest.raises(RuntimeError, match="leased"):
            sandbox.SandboxUser.lease(range(lease.uid, lease.uid + 1))
    assert other.user is None and lease._lock_fd is None  # released (another process may lease it now)
    # uids=None keeps the old way: commands as this process's uid, no process limit added.
    legacy = local_runtime.LocalRuntime(toy.repos_dir, toy.venvs_dir, LIMITS, uids=None)
    assert legacy.limits.nproc is None
    with legacy.workspace(toy.instance) as mine:
        assert mine.user is None and mine.run("id -u").output.strip() == "0"


@needs_own_uids
def test_a_fork_bomb_meets_the_process_limit_of_its_uid(toy):
    """A real bomb, bounded by RLIMIT_NPROC on the workspace's uid: the processes of that uid never
    pass the limit, another workspace works on meanwhile, and nothing of the uid survives. (A
    background sleep keeps the command, and so the bomb, going until the wall clock.)"""
    nproc = 64
    capped = local_runtime.LocalRuntime(toy.repos_dir, toy.venvs_dir, dataclasses.replace(LIMITS, nproc=nproc, wall_s=4))
    with capped.workspace(toy.instance) as ws, capped.workspace(toy.instance) as other:
        uid = ws.user.uid
        # The drop first, with a harmless command: a bomb that ran as root would meet no limit at all.
        assert ws.run("id -u; ulimit -u").output.split() == [str(uid), str(nproc)]
        result, peak = {}, [0]
        bomber = threading.Thread(target=lambda: result.update(bomb=ws.run("sleep 60 & :(){ :|:& };:; wait")))

        def watch():
            while bomber.is_alive():
                peak[0] = max(peak[0], _processes_of(uid))
                time.sleep(0.01)

        watcher = threading.Thread(target=watch)
        bomber.start()
        watcher.start()
        time.sleep(1.5)
        meanwhile = other.run("for i in $(seq 20); do /bin/true; done; echo ok")
        bomber.join()
        watcher.join()
        bomb = result["bomb"]
        assert "Resource temporarily unavailable" in bomb.output and bomb.timed_out  # the sleep kept it going
        assert nproc // 2 <= peak[0] <= nproc, f"peak {peak[0]}"  # a real bomb, and the limit held it (64 seen)
        assert meanwhile.output == "ok\n"  # the other workspace's uid has its own budget
        deadline = time.monotonic() + 5  # the PID namespace's teardown: killed at once, reaped within moments
        while _processes_of(uid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _processes_of(uid) == 0  # nothing survives the command
        assert ws.run("echo alive").output == "alive\n"


# ---------------------------------------------------------------------------------------- host-side files

def test_file_operations_are_confined_to_the_tree(toy, ws, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("outside\n")
    os.symlink("/etc/passwd", os.path.join(ws.root, "passwd"))
    os.symlink(str(tmp_path), os.path.join(ws.root, "outdir"))
    for path in ("passwd", "outdir/secret.txt", "../../x", str(secret), "/etc/hostname", str(toy.repos_dir)):
        with pytest.raises(WorkspaceError, match="outside the work tree"):
            ws.read_file(path)
    for path in ("passwd", "outdir/new.txt", "../escape.txt"):
        with pytest.raises(WorkspaceError, match="outside the work tree"):
            ws.write_file(path, "pwned\n")
    assert secret.read_text() == "outside\n" and not (tmp_path / "new.txt").exists()
    with pytest.raises(WorkspaceError, match="outside"):
        ws.exists("/etc")
    ws.write_file(os.path.join(ws.root, "abs.txt"), "ok\n")  # an absolute path inside the tree is fine
    assert ws.read_file("abs.txt") == "ok\n" and ws.exists("calc") == "dir" and ws.exists("missing") is None


def test_reads_refuse_what_is_not_a_small_text_file(ws):
    ws.run("printf 'a\\0b' > bin.dat; printf '\\xff\\xfe' > latin.txt; mkfifo pipe; head -c 2000000 /dev/zero "
           "| tr '\\0' a > big.txt")
    for path, why in (("bin.dat", "binary"), ("latin.txt", "not UTF-8"), ("pipe", "not a regular file"),
                      ("big.txt", "more than"), ("calc", "a directory"), ("nope.py", "no such file")):
        with pytest.raises(WorkspaceError, match=why):
            ws.read_file(path)
    with pytest.raises(WorkspaceError, match="file limit"):
        ws.write_file("huge.txt", "x" * (LIMITS.file_mb * (1 << 20) + 1))


def test_close_deletes_the_tree_and_is_idempotent(toy, runtime):
    ws = runtime.workspace(toy.instance)
    ws.run("mkdir -p locked/deep && touch locked/deep/f && chmod 000 locked/deep locked")
    directory = os.path.dirname(ws.root)
    ws.close()
    ws.close()
    assert not os.path.exists(directory)
    with pytest.raises(WorkspaceError, match="closed"):
        ws.run("true")


# ---------------------------------------------------------------------------------------- set-up errors

def test_missing_repository_venv_or_commit_are_clear_errors(toy, runtime, tmp_path):
    with pytest.raises(WorkspaceError, match="no repository for acme/other"):
        runtime.workspace(dataclasses.replace(toy.instance, repo="acme/other"))
    with pytest.raises(WorkspaceError, match="no virtual environment"):
        local_runtime.LocalRuntime(toy.repos_dir, tmp_path).workspace(toy.instance)
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(WorkspaceError, match="is not in"):
        local_runtime.LocalRuntime(toy.repos_dir, toy.venvs_dir, tmp_root=str(work)).workspace(
            dataclasses.replace(toy.instance, base_commit="0" * 40))
    assert os.listdir(work) == []  # the half-made workspace is gone
    planted = tmp_path / "planted"
    with pytest.raises(WorkspaceError, match="not a commit id"):  # git would run the "upload pack"
        runtime.workspace(dataclasses.replace(toy.instance, base_commit=f"--upload-pack=touch {planted};true"))
    assert not planted.exists()


def test_the_test_command_runs_the_files_of_the_ids(toy, runtime):
    ids = ("tests/a.py::T::test_x[p q]", "tests/b.py::test_y", "tests/a.py::test_z")
    assert files_of_tests(ids) == ["tests/a.py", "tests/b.py"]
    assert runtime.test_command(toy.instance, ids) == (
        "python -m pytest -rA -p no:cacheprovider -W ignore::DeprecationWarning tests/a.py tests/b.py")
    custom = dataclasses.replace(toy.instance, extra={"test_cmd": "pytest -n0 -rA"})
    assert runtime.test_command(custom, ("t/it's.py::x",)) == "pytest -n0 -rA 't/it'\"'\"'s.py'"
    with pytest.raises(ValueError, match="no pytest file"):
        files_of_tests(("test_x (module.Class)",))
    with pytest.raises(ValueError, match="no test ids"):
        runtime.test_command(toy.instance, ())
