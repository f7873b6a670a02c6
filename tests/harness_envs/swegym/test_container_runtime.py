"""The container runtime, against a fake `docker` on PATH that runs every argv the runtime builds (run,
exec with -w/-i, rm) on the host, in a directory standing for the container. What this cannot show:
real images, conda activation, and what --network/--memory/--pids-limit do (only that they are
passed); container_runtime's docstring says so too."""
import dataclasses
import json
import os
import sys
import time
import uuid

import pytest

from harness_envs import sandbox
from harness_envs.swegym import container_runtime
from harness_envs.swegym import scoring
from harness_envs.swegym.runtime import WorkspaceError
from tests.harness_envs.swegym.toy_repo import git, make_toy

FAKE_DOCKER = '''#!{python}
"""A fake docker CLI: `run -d ... IMAGE sleep infinity` copies images/<IMAGE> to $FAKE_DOCKER_ROOT,
`exec [-i] -w DIR ID ARGV...` runs ARGV there (stdin only with -i, as docker), `rm -f ID` deletes it."""
import json, os, shutil, signal, sys, uuid
state = os.environ["FAKE_DOCKER_STATE"]
with open(os.path.join(state, "calls.jsonl"), "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
command, args = sys.argv[1], sys.argv[2:]
if command == "run":
    if args[0] != "-d" or args[-2:] != ["sleep", "infinity"] or "--network" not in args:
        sys.exit("fake docker: unexpected run " + " ".join(args))
    image = os.path.join(state, "images", args[-3].replace("/", "_").replace(":", "_"))
    if not os.path.isdir(image):
        sys.exit("Unable to find image '%s' locally" % args[-3])
    root = os.environ["FAKE_DOCKER_ROOT"]
    shutil.copytree(image, root, symlinks=True)
    container = uuid.uuid4().hex
    with open(os.path.join(state, container), "w") as f:
        f.write(root)
    print(container)
elif command == "exec":
    i, workdir, interactive = 0, None, False
    while args[i].startswith("-"):
        if args[i] == "-w":
            workdir, i = args[i + 1], i + 2
        elif args[i] == "-i":
            interactive, i = True, i + 1
        else:
            sys.exit("fake docker: unknown exec option " + args[i])
    if not os.path.exists(os.path.join(state, args[i])):
        sys.exit("Error: No such container: " + args[i])
    if not interactive:
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.chdir(workdir)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # a container's process starts with the defaults
    os.execvp(args[i + 1], args[i + 1:])
elif command == "rm":
    if args[0] != "-f":
        sys.exit("fake docker: rm without -f")
    with open(os.path.join(state, args[1])) as f:
        shutil.rmtree(f.read())
    os.remove(os.path.join(state, args[1]))
    print(args[1])
else:
    sys.exit("fake docker: unknown command " + command)
'''
FAST_PYTEST = "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest -rA -p no:cacheprovider"
LIMITS = sandbox.Limits(wall_s=30, memory_mb=2048, nproc=64, output_chars=5000)


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return make_toy(tmp_path_factory.mktemp("toy"))


@pytest.fixture
def docker(toy, tmp_path, monkeypatch):
    """(runtime, state dir, container root): the fake CLI on PATH, the toy's image (a full clone at
    the base commit, as SWE-bench builds /testbed)."""
    bin_dir, state, root = tmp_path / "bin", tmp_path / "state", tmp_path / "testbed"
    bin_dir.mkdir()
    (state / "images").mkdir(parents=True)
    (bin_dir / "docker").write_text(FAKE_DOCKER.replace("{python}", sys.executable))
    (bin_dir / "docker").chmod(0o755)
    image = state / "images" / container_runtime.image_name(toy.instance).replace("/", "_")
    git(tmp_path, "clone", "-q", str(toy.repos_dir / "acme__calc.git"), str(image))
    git(image, "checkout", "-q", toy.instance.base_commit)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("FAKE_DOCKER_STATE", str(state))
    monkeypatch.setenv("FAKE_DOCKER_ROOT", str(root))
    venv_bin = os.path.join(os.path.realpath(toy.venvs_dir / "acme__calc"), "bin")
    runtime = container_runtime.ContainerRuntime("docker", workdir=str(root), limits=LIMITS,
                                  activate=f"export PATH={venv_bin}:$PATH HSJAX_ACTIVATED=yes")
    return runtime, state, root


def _calls(state) -> list[list[str]]:
    return [json.loads(line) for line in (state / "calls.jsonl").read_text().splitlines()]


def test_image_names_follow_swe_gym():
    toy_like = type("I", (), {"instance_id": "getmoto__moto-5752", "extra": {}})()
    assert container_runtime.image_name(toy_like) == "xingyaoww/sweb.eval.x86_64.getmoto_s_moto-5752"
    toy_like.extra = {"image_name": "my/registry:tag"}
    assert container_runtime.image_name(toy_like) == "my/registry:tag"
    with pytest.raises(WorkspaceError, match="not found on PATH"):
        container_runtime.ContainerRuntime(cli="no-such-container-cli")


def test_a_container_workspace_runs_edits_and_diffs(toy, docker):
    runtime, state, root = docker
    ws = runtime.workspace(toy.instance)
    run = _calls(state)[0]
    assert run[:2] == ["run", "-d"] and run[-3:] == [container_runtime.image_name(toy.instance), "sleep", "infinity"]
    for flag, value in (("--network", "none"), ("--memory", "2048m"), ("--memory-swap", "2048m"),
                        ("--pids-limit", "64")):
        assert run[run.index(flag) + 1] == value
    assert ws.root == str(root) and ws.container
    result = ws.run("echo $HSJAX_ACTIVATED; pwd; git rev-parse HEAD; python -c 'import calc; print(calc.__file__)'")
    assert result.output.split() == ["yes", str(root), toy.instance.base_commit, f"{root}/calc/__init__.py"]
    exec_call = _calls(state)[-1]
    assert exec_call[:4] == ["exec", "-w", str(root), ws.container] and exec_call[4:7] == ["timeout", "-k", "5"]

    ws.write_file("calc/ops.py", ws.read_file("calc/ops.py").replace("return a + b\n\n\ndef mul",
                                                                      "return a - b\n\n\ndef mul"))
    ws.write_file(f"{root}/pkg/new.py", "N = 'é'\n")
    assert "-i" in _calls(state)[-1]  # the text went on stdin
    assert ws.read_file("pkg/new.py") == "N = 'é'\n" and ws.exists("pkg") == "dir" and ws.exists("x") is None
    assert ws.run("python -m pytest -q -p no:cacheprovider tests/test_ops.py | tail -1").output.startswith(
        "3 passed, 1 xfailed")
    diff = ws.diff()
    assert "+    return a - b" in diff and "b/pkg/new.py" in diff and "new file mode" in diff
    container = ws.container
    ws.close()
    ws.close()
    assert _calls(state)[-1] == ["rm", "-f", container] and not root.exists()
    assert sum(call[0] == "rm" for call in _calls(state)) == 1
    with pytest.raises(WorkspaceError, match="removed"):
        ws.run("true")


def test_file_operations_are_confined_inside_the_container(toy, docker, tmp_path):
    runtime, state, root = docker
    with runtime.workspace(toy.instance) as ws:
        ws.run(f"ln -s /etc/passwd passwd; ln -s {tmp_path} out; printf 'a\\0b' > bin.dat; mkdir d; "
               "head -c 2000000 /dev/zero | tr '\\0' a > big.txt")
        for path, why in (("passwd", "outside"), ("out/state/calls.jsonl", "outside"), ("../x", "outside"),
                          ("/etc/hostname", "outside"), ("bin.dat", "binary"), ("d", "a directory"),
                          ("missing.py", "does not exist"), ("big.txt", "larger than")):
            with pytest.raises(WorkspaceError, match=why):
                ws.read_file(path)
        for path in ("passwd", "out/planted.txt", "../planted.txt"):
            with pytest.raises(WorkspaceError, match="outside"):
                ws.write_file(path, "pwned\n")
        assert not (tmp_path / "planted.txt").exists() and "pwned" not in open("/etc/passwd").read()


def test_a_command_past_its_limit_is_ended_inside_the_container(toy, docker):
    runtime, _, _ = docker
    marker = f"{100 + uuid.uuid4().int % 100}.{os.getpid()}"
    with runtime.workspace(toy.instance) as ws:
        t0 = time.monotonic()
        slow = ws.run(f"sleep {marker} & sleep {marker}", timeout_s=1)
        assert slow.timed_out and slow.returncode is None and time.monotonic() - t0 < 10
        time.sleep(0.3)
        assert f"sleep {marker}" not in os.popen("ps -eo args").read()
        loud = ws.run("yes | head -c 100000")
        assert len(loud.output) == LIMITS.output_chars and loud.dropped == 100000 - LIMITS.output_chars


def test_scoring_runs_through_the_container_runtime(toy, docker):
    runtime, state, _ = docker
    instance = dataclasses.replace(toy.instance, extra={"test_cmd": FAST_PYTEST})
    gold = scoring.evaluate(instance, toy.gold_patch, runtime)
    assert (gold.resolved, gold.apply_method, gold.f2p_passed, gold.p2p_passed) == (True, "git", 2, 4)
    empty = scoring.evaluate(instance, "", runtime)
    assert (empty.resolved, empty.failure) == (False, "empty_patch")
    assert sum(call[0] == "run" for call in _calls(state)) == sum(call[0] == "rm" for call in _calls(state)) == 2


def test_an_image_that_cannot_start_is_a_clear_error(toy, docker):
    runtime, _, _ = docker
    missing = dataclasses.replace(toy.instance, extra={"image_name": "nope/missing"})
    with pytest.raises(WorkspaceError, match="cannot start a container of nope/missing: Unable to find image"):
        runtime.workspace(missing)
