"""One process against two, side by side: the same training run (the testbed's Harness-S arm on the
shipped warm start) with one process over N CPU devices and with two processes over N/2 devices
each, coordinated on 127.0.0.1 (the layout of a two-host run, rehearsed on one machine).

    python perf/multihost_bench.py                 # 4 devices, 3 steps, G = 8
    python perf/multihost_bench.py --steps 5 --groups 16 --devices 8

Prints seconds per step (rollouts, update, whole step, the compile step left out), the parameters'
largest difference between the two runs, and whether their metrics agree. On one machine the two
processes share its cores, so the ratio shows the cost of the coordination (exchanging
trajectories, router decisions by process 0, collectives through gloo), not a speed-up.
"""
from __future__ import annotations

import argparse
import logging
import os
import pathlib
import socket
import subprocess
import sys
import tempfile

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hsjax.infra import checkpoint as ckpt_lib  # noqa: E402
from hsjax.infra.metrics import read_metrics  # noqa: E402


def command(workdir, args, extra):
    return [sys.executable, str(REPO / "run.py"), "--config", str(REPO / "experiments/testbed.py") + ":harness_s,smoke",
            "--config.model.hf_dir=assets/testbed_warmstart", "--config.router.local_voters=('rule',)",
            f"--config.rollout.groups={args.groups}", "--config.rollout.max_new_tokens=48",
            f"--config.total_steps={args.steps}", "--config.eval.every=0", f"--workdir={workdir}", *extra]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_one(workdir, args):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    subprocess.run(command(workdir, args, [f"--config.distributed.num_cpu_devices={args.devices}"]), env=env,
                   cwd=REPO, check=True, capture_output=True)


def run_two(workdir, args):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    port = free_port()
    procs = [subprocess.Popen(command(workdir, args, [
        "--config.distributed.enabled=True", f"--config.distributed.coordinator_address=127.0.0.1:{port}",
        "--config.distributed.num_processes=2", f"--config.distributed.process_id={i}",
        f"--config.distributed.num_cpu_devices={args.devices // 2}"]), env=env, cwd=REPO,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(2)]
    for p in procs:
        if p.wait() != 0:
            raise SystemExit(f"a process of the two-process run failed: see {workdir}/log*.txt")


def timings(workdir):
    rows = read_metrics(workdir)[1:]  # the first step compiles
    return {k: float(np.mean([r[k] for r in rows])) for k in ("time/rollout", "time/update", "time/step")}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--devices", type=int, default=4, help="CPU devices in all (even)")
    args = parser.parse_args()
    logging.getLogger("absl").setLevel(logging.ERROR)  # orbax's notes on read-only checkpoint readers
    with tempfile.TemporaryDirectory() as tmp:
        one, two = pathlib.Path(tmp, "one"), pathlib.Path(tmp, "two")
        run_one(one, args)
        run_two(two, args)
        t1, t2 = timings(one), timings(two)
        a = ckpt_lib.load_params(one / "checkpoints")
        b = ckpt_lib.load_params(two / "checkpoints")
        import jax
        diff = max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
                   for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
        rows_one, rows_two = read_metrics(one), read_metrics(two)
        same_rollouts = all(r1[k] == r2[k] for r1, r2 in zip(rows_one, rows_two)
                            for k in ("reward/mean", "rollouts/total", "rescue/groups_rolled", "tokens/generated"))
    print(f"\n`python perf/multihost_bench.py --steps {args.steps} --groups {args.groups} "
          f"--devices {args.devices}` (mean of steps 2..{args.steps})\n")
    print("| layout | rollout s/step | update s/step | s/step |")
    print("|---|---|---|---|")
    print(f"| 1 process x {args.devices} devices | {t1['time/rollout']:.2f} | {t1['time/update']:.2f} | {t1['time/step']:.2f} |")
    print(f"| 2 processes x {args.devices // 2} devices | {t2['time/rollout']:.2f} | {t2['time/update']:.2f} | {t2['time/step']:.2f} |")
    print(f"| two / one | {t2['time/rollout'] / t1['time/rollout']:.2f} | {t2['time/update'] / t1['time/update']:.2f} | "
          f"{t2['time/step'] / t1['time/step']:.2f} |")
    print(f"\nrollouts, rewards and rescues identical: {same_rollouts}; largest parameter difference: {diff:.2e}")


if __name__ == "__main__":
    main()
