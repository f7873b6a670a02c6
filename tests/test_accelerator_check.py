"""`perf/accelerator_check.sh --dry-run`: issue 37's accelerator script runs end to end on the
CPU at tiny shapes (the update, the sampler, the PyTorch peer and the table), so the next session
with a GPU runs a script that is known to work."""
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_the_accelerator_check_runs_on_the_cpu_in_its_dry_run(tmp_path):
    proc = subprocess.run(["bash", "perf/accelerator_check.sh", "--dry-run"], cwd=REPO,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "OUT": str(tmp_path),
                               "PYTHON": sys.executable},
                          capture_output=True, text=True, timeout=1500)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-2000:]
    assert not list(tmp_path.glob("*.failed")), out[-3000:]
    for row in ("hsjax update, xla attention, 4 micro-batches", "hsjax update, xla attention, 1 micro-batch",
                "PyTorch peer (torch", "sampler (tiny"):
        assert row in out, out[-3000:]
    assert out.count("x |") == 3  # the hsjax / peer ratio of each update row and the peer's 1.00x
