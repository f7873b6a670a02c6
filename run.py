"""hsjax entry point: one config file, one mode.

        python run.py --config experiments/dbbench.py:eval --workdir /tmp/hsjax/eval
        python run.py --config experiments/dbbench.py:smoke --config.total_steps=4 --workdir /tmp/hsjax/smoke

`--config path.py[:arg]` names an experiment file whose `get_config(arg)` returns a locked
`ml_collections.ConfigDict`; `--config.key=value` overrides a field (a typo is an error).
`config.mode` picks the module whose `main(config, workdir)` runs.
"""
import importlib
import os

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment file, e.g. experiments/dbbench.py:eval.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and outputs.")

MODES = {
    "train": "hsjax.modes.train",
    "eval": "hsjax.modes.evaluate",
    "sft": "hsjax.studies.testbed.warmstart",
    "evolve": "hsjax.harness_s.evolve",
    "serve": "hsjax.llm.server",
    "probe": "hsjax.studies.testbed.probe",
    "testbed_demo": "hsjax.studies.testbed.demo",
}


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    config = _CONFIG.value
    if config is None:
        raise app.UsageError("--config is required, e.g. --config experiments/dbbench.py:eval")
    mode = config.get("mode")
    if mode not in MODES:
        raise app.UsageError(f"config.mode={mode!r} is not one of {sorted(MODES)}")
    workdir = _WORKDIR.value
    if not workdir:
        raise app.UsageError("--workdir is required: it receives config.json, metrics and outputs.")
    os.makedirs(workdir, exist_ok=True)
    logging.info("mode=%s workdir=%s", mode, workdir)
    module = importlib.import_module(MODES[mode])
    module.main(config, workdir)


if __name__ == "__main__":
    app.run(main)
