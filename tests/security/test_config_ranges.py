"""Red-team tests of configuration (issue 36, item 4b): a value out of range ends a real `run.py`
before anything runs, with one line naming the key, the value and what is allowed (exit status 2),
and a bad experiment variant is one short line naming the variants that exist. On d648ba9 a NaN
learning rate trained to NaN weights with rc 0, `limit=-3` evaluated 57 of 60 tasks, `name=../..`
wrote outside the workdir, `checkpoint.every=0` and `rollout.n=0` ended in tracebacks, and a bad
variant printed a 1,023-character line with a flattened traceback (docs/reliability.md)."""
import subprocess
import sys

import pytest

from tests.modes.test_run_errors import ENV, REPO

DBBENCH = f"{REPO}/experiments/dbbench.py"
# One step, so that on d648ba9 (no checks) the training cases fail by what they did, in seconds.
SHORT_TRAIN = ("--config.total_steps=1", "--config.optim.warmup_steps=0", "--config.eval.every=0",
               "--config.log.episodes_every=0")

# case -> (variant, overrides, what the one line must say)
CASES = {
    "nan learning rate": ("smoke", ("--config.optim.learning_rate=nan", *SHORT_TRAIN),
                          "--config.optim.learning_rate=nan is out of range: allowed a finite number > 0"),
    "negative learning rate": ("smoke", ("--config.optim.learning_rate=-0.001", *SHORT_TRAIN),
                               "--config.optim.learning_rate=-0.001 is out of range"),
    "checkpoint every 0": ("smoke", ("--config.checkpoint.every=0", *SHORT_TRAIN),
                           "--config.checkpoint.every=0 is out of range: allowed an integer >= 1"),
    "rollout.n 0": ("smoke", ("--config.rollout.n=0", *SHORT_TRAIN),
                    "--config.rollout.n=0 is out of range: allowed an integer >= 1"),
    "negative limit": ("eval", ("--config.limit=-3",),
                       "--config.limit=-3 is out of range: allowed an integer >= 0 (0: every task of the split)"),
    "name is a path": ("eval", ("--config.name=../../outside/x",),
                       "--config.name='../../outside/x' is out of range: allowed a plain file name"),
}


def run_py(tmp_path, variant, *overrides):
    cmd = [sys.executable, str(REPO / "run.py"), "--config", f"{DBBENCH}:{variant}", *overrides,
           f"--workdir={tmp_path / 'a' / 'w'}"]
    return subprocess.run(cmd, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=240)


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_out_of_range_value_ends_the_run_before_it_starts(tmp_path, case):
    variant, overrides, expected = CASES[case]
    proc = run_py(tmp_path, variant, *overrides)
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-1500:], proc.stderr[-1500:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("run.py: ") and expected in lines[0], proc.stderr[-1500:]
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (tmp_path / "a").exists()  # nothing ran: no workdir, and nothing outside it
    assert not list(tmp_path.rglob("*.json"))


def test_every_bad_value_is_named_in_the_one_line(tmp_path):
    proc = run_py(tmp_path, "smoke", "--config.optim.learning_rate=inf", "--config.rollout.n=0",
                  "--config.rollout.temperature=-1.0", "--config.data.limit=-1")
    (line,) = proc.stderr.strip().splitlines()
    for key in ("optim.learning_rate=inf", "rollout.n=0", "rollout.temperature=-1.0", "data.limit=-1"):
        assert f"--config.{key} is out of range" in line, line
    assert proc.returncode == 2


def test_a_bad_variant_is_one_short_line_naming_the_variants(tmp_path):
    proc = run_py(tmp_path, "nonsense")
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "Traceback" not in line and "File " not in line and len(line) < 300, line
    assert line.startswith(f"run.py: --config {DBBENCH}:nonsense: ") and "['nonsense']" in line, line
    for variant in ("eval", "demo", "smoke", "harness_s"):
        assert f"'{variant}'" in line, line
