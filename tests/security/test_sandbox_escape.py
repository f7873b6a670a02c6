"""Red team: agent code escaping the sandbox (issue 36, item 1).

Each attack is the one shown on d648ba9 (root, bubblewrap installed), run as a real REPL cell (or
SWE-Gym command) under every isolation mode this machine has. A REPL runs inside a sacrificial
helper process (`HELPER`), never in the test runner: on the old code a cell killed its parent.
The cells print `ESCAPE <what>` when an attack works; the helper prints what it saw of itself
(alive, daemons left, disk used) after the cell and after `close()`.
"""
import json
import os
import pathlib
import random
import shutil
import subprocess
import sys
import tempfile

import pytest

from harness_envs import sandbox
from harness_envs import sandbox_command

REPO = pathlib.Path(__file__).resolve().parents[2]
SECRET = "sk-hsjax-planted-%08d" % random.randrange(10 ** 8)


def _mode_works(mode: str) -> bool:
    try:
        return sandbox.isolation(mode) == mode
    except Exception:
        return False


MODES = [pytest.param(m, marks=pytest.mark.skipif(not _mode_works(m), reason=f"{m} isolation does not run here"))
         for m in ("bwrap", "unshare", "none")]

# The parent of the REPL: runs one cell, then reports on itself. argv: mode, cell, marker.
HELPER = r'''
import json, os, sys, time
from harness_envs import sandbox
mode, code, marker = sys.argv[1], sys.argv[2], sys.argv[3]
box = sandbox.PythonSandbox(sandbox.Limits(wall_s=20.0), isolation_mode=mode, hide=(os.getcwd(),))
cell = box.run(code)
used = 0
for d, _, files in os.walk(box.workdir):
    used += sum(os.lstat(os.path.join(d, f)).st_blocks * 512 for f in files)
print("CELL " + json.dumps({"output": cell.output, "error": cell.error, "traceback": cell.traceback,
                            "used_mb": used / (1 << 20)}), flush=True)
box.close()
time.sleep(0.5)
alive = []
for pid in os.listdir("/proc"):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if marker.encode() in f.read() and int(pid) != os.getpid():
                alive.append(int(pid))
    except (OSError, ValueError):
        pass
for pid in alive:
    os.kill(pid, 9)
print("PARENT-ALIVE " + json.dumps({"daemons": len(alive)}), flush=True)
'''

# Loads `_posixsubprocess` under another name (two ways) and defines `run(cmd)` with it: the
# process-creation back door of d648ba9. On the fixed code both loads are refused.
PRELUDE = r'''
import os, sys
def _load_alias():
    import importlib.machinery, importlib.util, glob
    path = glob.glob(os.path.join(os.path.dirname(os.__file__), 'lib-dynload', '_posixsubprocess*.so'))[0]
    loader = importlib.machinery.ExtensionFileLoader('x._posixsubprocess', path)
    spec = importlib.util.spec_from_file_location('x._posixsubprocess', path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module
def _load_by_loader_class():
    import glob
    ext = next(m for m in list(sys.modules.values())
               if type(getattr(m, '__loader__', None)).__name__ == 'ExtensionFileLoader')
    path = glob.glob(os.path.join(os.path.dirname(ext.__spec__.origin), '_posixsubprocess*.so'))[0]
    loader = type(ext.__loader__)('y._posixsubprocess', path)
    spec = type(ext.__spec__)('y._posixsubprocess', loader, origin=path)
    module = loader.create_module(spec)
    loader.exec_module(module)
    return module
_psp = None
for _way in (_load_alias, _load_by_loader_class):
    try:
        _psp = _way()
        break
    except BaseException as e:
        print('refused:', type(e).__name__, str(e)[:120])
def run(cmd):
    r, w = os.pipe()
    er, ew = os.pipe()
    argv = [b'/bin/sh', b'-c', cmd.encode()]
    for tail in ([False, False, -1, None, None, None, -1, None], [False, False, -1, None, None, None, -1, None, False],
                 [False, False, -1, None, None, None, None]):
        try:
            pid = _psp.fork_exec(argv, [b'/bin/sh'], True, (ew,), None, None, -1, -1, -1, w, -1, w,
                                 er, ew, *tail)
            break
        except TypeError:
            continue
    os.close(w)
    os.close(ew)
    out = b''
    while True:
        chunk = os.read(r, 65536)
        if not chunk:
            break
        out += chunk
    os.close(r)
    os.close(er)
    os.waitpid(pid, 0)
    return out.decode(errors='replace')
'''


def attack(mode: str, cell: str, *, marker: str = "no-such-marker", env_extra: dict | None = None) -> tuple[dict, str]:
    """Runs PRELUDE + `cell` in a REPL of a fresh helper process; (the cell's report, all stdout)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HSJAX_SANDBOX_SECRET": SECRET, **(env_extra or {})}
    proc = subprocess.run([sys.executable, "-c", HELPER, mode, PRELUDE + cell, marker], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    report = {}
    for line in proc.stdout.splitlines():
        if line.startswith("CELL "):
            report = json.loads(line[5:])
        if line.startswith("PARENT-ALIVE "):
            report["parent_alive"] = True
            report.update(json.loads(line[len("PARENT-ALIVE "):]))
    return report, proc.stdout + proc.stderr


def no_escape(report: dict, everything: str) -> None:
    text = f"{report.get('output')}\n{report.get('traceback')}"
    assert report.get("parent_alive"), f"the REPL's parent died: {everything[-1500:]}"
    assert "ESCAPE" not in text, text


@pytest.mark.parametrize("mode", MODES)
def test_an_aliased_extension_module_gives_no_process(mode):
    report, everything = attack(mode, "if _psp is not None:\n    print('ESCAPE loaded', run('id -u'))\n")
    no_escape(report, everything)
    assert report["output"].count("refused:") == 2, report


@pytest.mark.parametrize("mode", MODES)
def test_host_files_cannot_be_written(mode):
    outside = tempfile.mkdtemp(prefix="hsjax-outside-", dir="/var/tmp")
    os.chmod(outside, 0o755)
    try:
        cell = f'''
target = {outside!r}
try:
    fd = os.open(target, os.O_RDONLY)
    os.write(os.open('pwned', os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), b'x')
    print('ESCAPE dir_fd write')
except OSError as e:
    print('dir_fd:', e)
if _psp is not None:
    print(run(f'mount -o remount,bind,rw / 2>&1; mount -o remount,rw / 2>&1; echo y > {{target}}/pwned2 && echo ESCAPE remount'))
'''
        report, everything = attack(mode, cell)
        no_escape(report, everything)
        assert os.listdir(outside) == [], os.listdir(outside)
    finally:
        shutil.rmtree(outside)


@pytest.mark.parametrize("mode", MODES)
def test_the_parent_cannot_be_killed(mode):
    cell = '''
ppid = os.getppid()
try:
    import _signal
    _signal.pidfd_send_signal(os.pidfd_open(ppid), 9)
    print('ESCAPE pidfd kill sent')
except BaseException as e:
    print('pidfd:', type(e).__name__, e)
if _psp is not None:
    print(run(f'kill -9 {ppid} && echo ESCAPE kill'))
'''
    report, everything = attack(mode, cell)
    no_escape(report, everything)


@pytest.mark.parametrize("mode", MODES)
def test_the_parent_memory_and_environment_are_out_of_reach(mode):
    """Opening /proc/<ppid>/mem read-write takes the same permission as a ptrace attach."""
    cell = '''
ppid = os.getppid()
try:
    proc = os.open('/proc', os.O_RDONLY)
    os.open(f'{ppid}/mem', os.O_RDWR, dir_fd=proc)
    print('ESCAPE parent memory opened read-write')
except OSError as e:
    print('mem:', e)
try:
    if os.environ['HSJAX_SANDBOX_SECRET'.lower().upper()].startswith('sk-'):
        print('ESCAPE inherited environment')
except KeyError:
    pass
for path in (f'/proc/{ppid}/environ', '/proc/self/environ'):
    try:
        if b'sk-hsjax-planted' in open(path, 'rb').read():
            print('ESCAPE', path)
    except OSError as e:
        print(path, e)
'''
    report, everything = attack(mode, cell)
    no_escape(report, everything)
    assert SECRET not in everything


@pytest.mark.parametrize("mode", MODES)
def test_etc_shadow_is_unreadable(mode):
    cell = '''
try:
    print('ESCAPE shadow', len(open('/etc/shadow').read()))
except OSError as e:
    print('shadow:', e)
'''
    report, everything = attack(mode, cell)
    no_escape(report, everything)


@pytest.mark.parametrize("mode", MODES)
def test_no_daemon_survives_the_episode(mode):
    marker = "313.%06d" % random.randrange(10 ** 6)
    cell = f'''
if _psp is not None:
    run('setsid sleep {marker} </dev/null >/dev/null 2>&1 &')
try:
    os.fork()
except BaseException as e:
    print('fork:', e)
'''
    report, everything = attack(mode, cell, marker=marker)
    no_escape(report, everything)
    assert report["daemons"] == 0, everything[-1500:]


@pytest.mark.parametrize("mode", MODES)
def test_the_episode_directory_has_a_disk_quota(mode):
    """112 MB written in 8 MB files (under the 16 MB file limit) against the default quota of 64 MB."""
    cell = '''
written = 0
try:
    for i in range(14):
        with open(f'blob{i}', 'wb') as f:
            f.write(b'x' * (8 << 20))
        written += 8
except OSError as e:
    print('write:', e)
print('written', written)
'''
    report, everything = attack(mode, cell)
    no_escape(report, everything)
    assert report["used_mb"] <= 65 and f"written {14 * 8}" not in report["output"], report


def test_swegym_commands_see_no_gold_patch_outside_their_allow_list(tmp_path_factory):
    if not _mode_works("bwrap"):
        pytest.skip("bubblewrap does not run here: SWE-Gym's mount allow-list needs it")
    from harness_envs.swegym import local_runtime
    from tests.harness_envs.swegym.toy_repo import make_toy
    toy = make_toy(tmp_path_factory.mktemp("toy"))
    gold = tempfile.mkdtemp(prefix="hsjax-other-checkout-", dir="/var/tmp")
    os.chmod(gold, 0o755)
    pathlib.Path(gold, "gold.patch").write_text("GOLD-PATCH-CONTENT\n")
    os.chmod(os.path.join(gold, "gold.patch"), 0o644)
    try:
        runtime = local_runtime.LocalRuntime(toy.repos_dir, toy.venvs_dir, isolation_mode="bwrap")
        with runtime.workspace(toy.instance) as ws:
            result = ws.run(f"cat {gold}/gold.patch; cat /etc/shadow; ls /work /home /opt /srv 2>&1 | head -5; "
                            "python -c 'import sys; print(sys.version_info[0])'")
        assert "GOLD-PATCH-CONTENT" not in result.output and "root:" not in result.output, result.output
        assert result.output.strip().endswith("3"), result.output  # the venv's python still runs
    finally:
        shutil.rmtree(gold)


def test_commands_get_no_host_environment_by_default(tmp_path, monkeypatch):
    monkeypatch.setenv("HSJAX_SANDBOX_SECRET", SECRET)
    result = sandbox_command.run_command("env; cat /proc/self/environ", str(tmp_path), isolation_mode="none")
    assert SECRET not in result.output and "PATH=" in result.output, result.output


def test_no_safe_isolation_refuses_agent_code_unless_none_is_asked_for(monkeypatch):
    """No bubblewrap and no network namespace: `auto` is one line naming the fix, `none` runs."""
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    with pytest.raises(ValueError, match="install bubblewrap"):
        sandbox.isolation("auto")
    assert sandbox.isolation("none") == "none"
