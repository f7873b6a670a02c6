"""What a run prints and what goes to <workdir>/log.txt."""
import logging
import subprocess
import sys

from hsjax.infra import console


def test_info_goes_to_the_log_file_and_warnings_also_to_the_console(tmp_path, capsys):
    path = console.setup_logging(str(tmp_path))
    try:
        logging.getLogger("orbax.chatty").info("saving step 3")
        logging.getLogger("hsjax.x").warning("voter dropped")
        logging.getLogger("absl").warning('Item "host" was found in the checkpoint, but could not be restored.')
        console.say("step 1/2 | reward 0.5")
        for handler in logging.getLogger().handlers:
            handler.flush()
        captured = capsys.readouterr()
        text = (tmp_path / "log.txt").read_text()
        assert path == str(tmp_path / "log.txt")
        assert "saving step 3" in text and "voter dropped" in text
        assert "saving step 3" not in captured.err and "voter dropped" in captured.err
        # orbax's warning on every params-only restore: in the log, not on the console
        assert 'Item "host"' in text and 'Item "host"' not in captured.err
        assert "step 1/2 | reward 0.5" in captured.out
        console.setup_logging(str(tmp_path / "v"), verbose=True)  # handlers are replaced, not stacked
        logging.getLogger("orbax.chatty").info("now shown")
        assert "now shown" in capsys.readouterr().err
        assert len([h for h in logging.getLogger().handlers if getattr(h, "_hsjax_handler", False)]) == 2
    finally:
        for handler in list(logging.getLogger().handlers):
            if getattr(handler, "_hsjax_handler", False):
                logging.getLogger().removeHandler(handler)
                handler.close()


def test_step_line_shows_the_metrics_present():
    line = console.step_line(3, 10, {"reward/mean": 0.25, "rollouts/total": 96, "eval/x/base/success": 0.5},
                             {"reward": "reward/mean", "rollouts": "rollouts/total", "loss": "loss/pg", "x": "eval/x/base/success"})
    assert line == "step 3/10 | reward 0.25 | rollouts 96 | x 0.5"


def test_native_writes_to_descriptor_1_go_to_the_log_and_console_lines_to_the_console(tmp_path):
    """What gloo does (a write to descriptor 1 from native code) lands in log.txt, not on the
    console; console.say still reaches the console. In a child: the descriptors change for good."""
    script = (
        "import os, sys\n"
        "from hsjax.infra import console\n"
        f"path = console.setup_logging({str(tmp_path)!r})\n"
        "console.route_native_stdout(path)\n"
        "os.write(1, b'[Gloo] Rank 0 is connected to 1 peer ranks\\n')\n"
        "console.say('step 1/2 | reward 0.5')\n"
        "print('a result table')\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "step 1/2 | reward 0.5\na result table\n"
    assert "[Gloo] Rank 0 is connected" in (tmp_path / "log.txt").read_text()
