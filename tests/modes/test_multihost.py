"""Multi-process training on 127.0.0.1: two processes (two CPU devices each) train as one process
with four devices does, and a run stopped by a SIGTERM to one of them resumes exactly.

The run is the testbed's Harness-S arm on the shipped warm start (rewards vary, rescue happens,
router decisions are made by process 0 with the rule voter), a few groups, two steps, evaluated at
the second, which the resumed run makes: an evaluation at step 1 too would cost the killed run a
compile and 8 episodes more (the reference run 8 episodes) and check nothing that one does not.
"""
import pathlib
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from hsjax.infra import distributed
from hsjax.infra.metrics import read_metrics
from tests.modes.test_train import NONDETERMINISTIC, REPO, env, final_params

ARGS = ["--config", str(REPO / "experiments/testbed.py") + ":harness_s,smoke",
        "--config.model.hf_dir=assets/testbed_warmstart", "--config.router.local_voters=('rule',)",
        "--config.rollout.groups=4", "--config.rollout.max_new_tokens=48", "--config.total_steps=2",
        "--config.eval.limit=4", "--config.eval.every=2"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(workdir, *extra):
    return [sys.executable, str(REPO / "run.py"), *ARGS, f"--workdir={workdir}", *extra]


def launch_two(workdir, port, *extra):
    procs = []
    for i in range(2):
        flags = [*extra, "--config.distributed.enabled=True", f"--config.distributed.coordinator_address=127.0.0.1:{port}",
                 "--config.distributed.num_processes=2", f"--config.distributed.process_id={i}",
                 "--config.distributed.num_cpu_devices=2"]
        procs.append(subprocess.Popen(command(workdir, *flags), env=env(), cwd=REPO, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    return procs


def finish(procs):
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=900)
        assert p.returncode == 0, err[-4000:]
        outs.append(out)
    return outs


def assert_same_rows(a, b):
    """Equal step by step; floats to the last digits the reduction order across processes moves.
    The sampler-vs-trainer log-prob gaps are themselves float32 rounding (a few ulps of log-probs
    near 10 nats, ~1e-6 each), so they agree only to that scale."""
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b):
        keys = {k for k in ra if not k.startswith(NONDETERMINISTIC)}
        assert keys == {k for k in rb if not k.startswith(NONDETERMINISTIC)}
        for k in sorted(keys):
            if isinstance(ra[k], float) and not isinstance(ra[k], bool):
                atol = 1e-5 if k.startswith("logprob_gap/") else 1e-6
                np.testing.assert_allclose(rb[k], ra[k], rtol=1e-4, atol=atol, err_msg=f"step {ra['step']} {k}")
            else:
                assert rb[k] == ra[k], (ra["step"], k)


def test_two_processes_train_as_one_and_resume_after_a_sigterm_to_one(tmp_path):
    one = tmp_path / "one"
    proc = subprocess.run(command(one, "--config.distributed.num_cpu_devices=4"), env=env(), cwd=REPO,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = read_metrics(one)
    assert rows[-1]["rollouts/rescue_total"] > 0 and any(r["reward/mean"] > 0 for r in rows)

    # A scheduler's SIGTERM reaches process 1 alone, during step 1. Both processes agree at the step
    # boundary to stop, save step 1 together (checkpoint.every is 2) and exit with status 143; then
    # the same command on both resumes.
    two, every = tmp_path / "two", "--config.checkpoint.every=2"
    procs = launch_two(two, free_port(), every)
    started = two / "log.process1.txt"  # "train tasks" is logged after the SIGTERM handler is in place
    deadline = time.monotonic() + 900
    while not (started.exists() and "train tasks" in started.read_text()):
        assert all(p.poll() is None for p in procs), "a process ended before its loop began"
        assert time.monotonic() < deadline, "no training loop within 15 minutes"
        time.sleep(0.05)
    procs[1].send_signal(signal.SIGTERM)
    outs = [p.communicate(timeout=900) for p in procs]
    assert [p.returncode for p in procs] == [143, 143], outs[1][1][-4000:]
    assert "SIGTERM: saved step 1" in outs[0][0]
    assert [r["step"] for r in read_metrics(two)] == [1]
    assert sorted(int(d.name) for d in (two / "checkpoints").iterdir() if d.name.isdigit()) == [1]
    first, second = finish(launch_two(two, free_port(), every))

    assert "resumed from step 1" in first and "step 2/2" in first
    # The console is process 0's; process 1 logs to its own file. gloo, the CPU collectives'
    # library, prints a connection line per peer straight to file descriptor 1, from several
    # threads, lines interleaved mid-line: run.py points that descriptor at the log file.
    assert second == ""
    assert "[Gloo]" not in first and "[Gloo]" in (two / "log.txt").read_text()
    assert "[Gloo]" in (two / "log.process1.txt").read_text()
    assert_same_rows(rows, read_metrics(two))
    a, b = final_params(one), final_params(two)
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_allclose(b[name], a[name], atol=1e-5, err_msg=name)
    decisions = [pathlib.Path(w, "router_decisions.jsonl").read_text().count("\n") for w in (one, two)]
    assert decisions[0] == decisions[1] > 0


@pytest.mark.parametrize("n,count", [(0, 2), (1, 2), (7, 2), (8, 3), (5, 8)])
def test_process_slices_cover_the_jobs_in_order(n, count):
    slices = [distributed.process_slice(n, i, count) for i in range(count)]
    assert [j for s in slices for j in range(n)[s]] == list(range(n))
    sizes = [len(range(n)[s]) for s in slices]
    assert max(sizes) - min(sizes) <= 1


def test_single_process_helpers_are_the_identity():
    assert distributed.gather_shares([1, 2]) == [1, 2]
    assert distributed.allgather_objects({"a": 1}) == [{"a": 1}]
    assert distributed.from_main(lambda: "x") == "x"
    assert distributed.is_main() and distributed.process_index() == 0
