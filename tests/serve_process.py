"""`run.py --config experiments/serve.py:tiny` in a process of its own on a free port of 127.0.0.1,
for the tests that need the real mode: its command line, its config.json, its own RSS."""
import contextlib
import os
import pathlib
import socket
import subprocess
import sys
import time

import httpx

REPO = pathlib.Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def tiny_server(workdir: pathlib.Path, *flags: str, startup_s: float = 180.0):
    """Yields the server's `Popen` (with `.port`) once /health answers; its output goes to
    `<workdir>.log`. Stopped with SIGTERM (then SIGKILL) on exit."""
    port = free_port()
    log = pathlib.Path(f"{workdir}.log")
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "run.py", "--config", "experiments/serve.py:tiny", f"--config.serve.port={port}",
             "--config.serve.log_level=warning", *flags, "--workdir", str(workdir)],
            cwd=REPO, env={**os.environ, "JAX_PLATFORMS": "cpu"}, stdout=out, stderr=subprocess.STDOUT)
    proc.port = port
    try:
        deadline = time.monotonic() + startup_s
        while True:
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, f"serve did not come up within {startup_s} s"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
