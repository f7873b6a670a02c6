"""Wall time per training step, synchronous against one step off (`rollout.staleness` 0 / 1), with the
rollouts in process (`rollout.backend=jax`) and from the project's own server in a process of its own
(`rollout.backend=http_tokens` against `run.py --config experiments/serve.py`, weights pushed each step).

Every arm is one `run.py` training run of the testbed arm `names_tables_first` from the v3 warm start
(`--steps` steps, no evaluation), run one after the other on the same machine; the table gives the median
over the steps after the first (which compiles) of each step's `time/step` and of its parts as
`metrics.jsonl` logs them: `time/rollout` (the collect of the batch the step trained on, wherever it
ran), `time/update` and `time/rollout_wait` (how long the loop waited for a batch collected ahead).
The ratio column is each arm's step time over its synchronous peer's.

    python perf/async_rollout_bench.py                 # 6 steps per arm, about 10 minutes on 2 cores
    python perf/async_rollout_bench.py --steps 4 --groups 4
"""
import argparse
import json
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

REPO = pathlib.Path(__file__).resolve().parents[1]
WARM_START = "assets/testbed_names_v3_warmstart"
PARTS = ("time/step", "time/rollout", "time/update", "time/rollout_wait")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(root: pathlib.Path):
    port = free_port()
    log = open(root / "serve.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "run.py", "--config", "experiments/serve.py", f"--config.serve.hf_dir={WARM_START}",
         "--config.serve.model_name=policy", f"--config.serve.port={port}", "--config.serve.log_level=warning",
         f"--config.serve.weights_root={root}", "--config.serve.max_batch=64", "--workdir", str(root / "serve")],
        cwd=REPO, env={**os.environ, "JAX_PLATFORMS": "cpu"}, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert proc.poll() is None, (root / "serve.log").read_text()[-2000:]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return proc, f"http://127.0.0.1:{port}/v1"
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("serve did not come up in 300 s")


def train(workdir: pathlib.Path, args, staleness: int, url: str | None):
    flags = [f"--config.total_steps={args.steps}", "--config.eval.every=0", "--config.eval.at_start=False",
             f"--config.rollout.groups={args.groups}", f"--config.rollout.max_new_tokens={args.max_new_tokens}",
             f"--config.rollout.staleness={staleness}", f"--config.checkpoint.every={args.steps}",
             "--config.log.progress=False"]
    if url:
        flags += ["--config.rollout.backend=http_tokens", f"--config.rollout.http.base_urls=('{url}',)",
                  "--config.rollout.http.model=policy",
                  f"--config.rollout.http.weights_dir={workdir.parent / ('weights_' + workdir.name)}"]
    command = [sys.executable, "run.py", "--config", "experiments/testbed.py:names_tables_first,v3", *flags,
               "--workdir", str(workdir)]
    subprocess.run(command, cwd=REPO, env={**os.environ, "JAX_PLATFORMS": "cpu"}, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return {part: statistics.median(r.get(part, 0.0) for r in rows[1:]) for part in PARTS}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=64)
    args = p.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        for staleness in (0, 1):
            results[("jax", staleness)] = train(root / f"jax_{staleness}", args, staleness, None)
        server, url = start_server(root)
        try:
            for staleness in (0, 1):
                results[("http_tokens", staleness)] = train(root / f"http_{staleness}", args, staleness, url)
        finally:
            server.terminate()
            server.wait(30)
    print(f"command: python perf/async_rollout_bench.py --steps {args.steps} --groups {args.groups} "
          f"--max-new-tokens {args.max_new_tokens}")
    print("| backend | staleness | s/step | rollout s | update s | wait s | step ratio vs staleness 0 |")
    print("|---|---|---|---|---|---|---|")
    for (backend, staleness), r in results.items():
        ratio = r["time/step"] / results[(backend, 0)]["time/step"]
        print(f"| {backend} | {staleness} | {r['time/step']:.2f} | {r['time/rollout']:.2f} | {r['time/update']:.2f} "
              f"| {r['time/rollout_wait']:.2f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
