"""hsjax entry point: one config file, one mode.

        python run.py --config experiments/dbbench.py:eval --workdir /tmp/hsjax/eval
        python run.py --config experiments/dbbench.py:smoke --config.total_steps=4 --workdir /tmp/hsjax/smoke

`--config path.py[:arg]` names an experiment file whose `get_config(arg)` returns a locked
`ml_collections.ConfigDict`; `--config.key=value` overrides a field (a typo is an error, and so is
an override of a key that the chosen kind of its block never reads). `config.mode` picks the module
whose `main(config, workdir)` runs. The console shows progress and results; every log record goes
to `<workdir>/log.txt` (`--verbose` shows INFO records on the console too).

Mistakes of the user's (an unknown or misspelt key, a value out of range (`hsjax.infra.config_checks`,
checked before anything runs), an unknown experiment variant, a workdir that cannot be written, a
missing or garbage model directory, checkpoint, pool or task file: `hsjax.infra.errors.UserError`; an
environment that refuses to start, e.g. no isolation for agent code: `harness_envs.errors.SetupRefused`) end
the run with one line naming the thing and the fix, and exit status 2; `--verbose` adds the traceback.
"""
import importlib
import os
import sys
import tempfile

# transformers (imported for tokenizers only) prints "PyTorch was not found. Models won't be
# available ..." on every start without torch: advice about models hsjax never loads through it.
# Its real warnings still reach the console.
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from hsjax.infra import config_checks, console, distributed  # noqa: E402
from hsjax.infra.errors import ONE_LINE_ERRORS  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment file, e.g. experiments/dbbench.py:eval.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and outputs.")
_VERBOSE = flags.DEFINE_bool("verbose", False, "Also show INFO log records on the console.")

# One module per mode, each with `main(config, workdir)` and optionally `unread(config)`.
MODES = {
    "train": "hsjax.modes.train",
    "eval": "hsjax.modes.evaluate",
    "evolve": "hsjax.modes.evolve",
    "rank1": "hsjax.modes.rank1",
    "serve": "hsjax.modes.serve",
    "export": "hsjax.modes.export",
    "sft": "hsjax.studies.testbed.warmstart",
    "copy_base": "hsjax.studies.testbed.copy_base",
    "probe": "hsjax.studies.testbed.probe",
    "testbed_demo": "hsjax.studies.testbed.demo",
    "testbed_gates": "hsjax.studies.testbed.gates",
}


def unread_overrides(overrides, unread: dict[str, str]) -> list[str]:
    """The command-line overrides that set a key (or a key under one) the run never reads."""
    return [f"--config.{key} is set, but {unread[u]}" for key in overrides for u in unread
            if key == u or key.startswith(u + ".")]


def fail(message: str):
    """Ends the run before it starts, with one line that says what is wrong and how to fix it."""
    print(f"run.py: {message}", file=sys.stderr)
    sys.exit(2)


def parse_flags(argv):
    """absl's flag parsing, with a bad `--config` or override as one line instead of a traceback
    (ml_collections raises KeyError/AttributeError for an unknown key, with a did-you-mean hint)."""
    try:
        return flags.FLAGS(argv)
    except (flags.Error, KeyError, AttributeError, TypeError, ValueError) as e:
        if "--verbose" in argv:
            raise
        refused = get_config_error(e)
        if refused is not None:
            fail(f"--config {config_argument(argv)}: {refused} (run with --verbose for the traceback)")
        message = e
        while isinstance(message, BaseException):  # KeyError(message), AttributeError(KeyError(message))
            message = message.args[0] if message.args else type(message).__name__
        detail = " ".join(str(message).split())
        fail(f"{detail} (in the command-line flags: a --config.<key> that the experiment's config does not "
             "have, or a value of the wrong type)")


def get_config_error(error: BaseException) -> str | None:
    """The message of what an experiment file's `get_config(arg)` raised (e.g. an unknown variant,
    naming the variants that exist), or None if `error` is not that. ml_collections re-raises it as
    "Error whilst parsing config file" with the whole traceback flattened into the message; the
    original is the first exception of the chain."""
    if "Error whilst parsing config file" not in str(error):
        return None
    while (error.__cause__ or error.__context__) is not None:
        error = error.__cause__ or error.__context__
    return " ".join(str(error).split()) or type(error).__name__


def config_argument(argv) -> str:
    """The value given to `--config` (as `--config X` or `--config=X`), for messages."""
    for i, arg in enumerate(argv):
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
    return "?"


def check_writable(workdir: str):
    """Makes `workdir` and checks a file can be written there, before any work that would be lost."""
    try:
        os.makedirs(workdir, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=workdir, prefix=".write_check"):
            pass
    except OSError as e:
        fail(f"--workdir {workdir!r} is not writable ({e.strerror or e}); choose a directory you can write to")


def main(argv):
    if len(argv) > 1:
        fail(f"unexpected arguments: {argv[1:]}")
    try:
        config = _CONFIG.value
        mode = config.get("mode") if config is not None else None
    except OSError as e:  # the experiment file is missing or raised while loading
        fail(" ".join(str(e).split()) + " (check the path given to --config, and run the file with python to see "
                                       "its error)")
    if config is None:
        fail("--config is required, e.g. --config experiments/dbbench.py:eval")
    if mode not in MODES:
        fail(f"config.mode={mode!r} is not one of {sorted(MODES)}")
    workdir = _WORKDIR.value
    if not workdir:
        fail("--workdir is required: it receives config.json, metrics and outputs")
    try:
        config_checks.check(config)
    except ONE_LINE_ERRORS as e:
        fail(str(e))
    module = importlib.import_module(MODES[mode])
    if hasattr(module, "unread"):
        errors = unread_overrides(config_flags.get_override_values(flags.FLAGS["config"]), module.unread(config))
        if errors:
            fail("; ".join(errors) + ". Drop the override, or choose the kind that reads it.")
    if "distributed" in config:  # before anything touches a device
        distributed.initialize(config.distributed)
    check_writable(workdir)
    log_path = console.setup_logging(workdir, verbose=_VERBOSE.value,
                                     process_index=distributed.process_index())
    console.route_native_stdout(log_path)
    distributed.log_topology()
    console.say(f"{mode}: {config_flags.get_config_filename(flags.FLAGS['config'])} -> {workdir} (log: {log_path})")
    try:
        module.main(config, workdir)
    except ONE_LINE_ERRORS as e:
        if _VERBOSE.value:
            raise
        fail(f"{e} (run with --verbose for the traceback)")


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
