"""hsjax entry point: one config file, one mode.

        python run.py --config experiments/dbbench.py:eval --workdir /tmp/hsjax/eval
        python run.py --config experiments/dbbench.py:smoke --config.total_steps=4 --workdir /tmp/hsjax/smoke

`--config path.py[:arg]` names an experiment file whose `get_config(arg)` returns a locked
`ml_collections.ConfigDict`; `--config.key=value` overrides a field (a typo is an error, and so is
an override of a key that the chosen kind of its block never reads). `config.mode` picks the module
whose `main(config, workdir)` runs. The console shows progress and results; every log record goes
to `<workdir>/log.txt` (`--verbose` shows INFO records on the console too).

Modes: `MODES` below holds the library's own (train, eval, evolve, rank1, serve, export, in
`hsjax/modes/`). A study registers its modes in its package (`studies/<study>/__init__.py`'s
`MODES`, joined in `studies.MODES`), and run.py looks a mode up in both tables; the library never
imports a study. `--help` lists the modes, the experiment files and their variants;
`--print-config` prints the resolved config of a command (JSON, as the workdir's config.json) and
exits without running anything or needing a workdir.

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
import textwrap

# transformers (imported for tokenizers only) prints "PyTorch was not found. Models won't be
# available ..." on every start without torch: advice about models hsjax never loads through it.
# Its real warnings still reach the console.
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from hsjax.infra import config_checks, console, distributed  # noqa: E402
from hsjax.infra import experiments  # noqa: E402
from hsjax.infra.errors import ONE_LINE_ERRORS  # noqa: E402
from studies import MODES as STUDY_MODES  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment file, e.g. experiments/dbbench.py:eval.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and outputs.")
_VERBOSE = flags.DEFINE_bool("verbose", False, "Also show INFO log records on the console.")
_PRINT_CONFIG = flags.DEFINE_bool(
    "print-config", False, "Print the resolved config (JSON, as the workdir's config.json) and exit without running.")

HELP_FLAGS = ("--help", "-h", "-?", "--helpshort")

# The library's modes: one module per mode, each with `main(config, workdir)` and optionally
# `unread(config)`. A study adds its own modes in its package (`studies.MODES`, the registration
# hook); run.py is the one place that sees both tables, and the library never imports a study.
MODES = {
    "train": "hsjax.modes.train",
    "eval": "hsjax.modes.evaluate",
    "evolve": "hsjax.modes.evolve",
    "rank1": "hsjax.modes.rank1",
    "serve": "hsjax.modes.serve",
    "export": "hsjax.modes.export",
}


def all_modes() -> dict[str, str]:
    """The library's modes and every study's, mode -> module; a study may not take a library mode's name."""
    taken = sorted(MODES.keys() & STUDY_MODES.keys())
    if taken:
        raise RuntimeError(f"studies.MODES redefines the library's modes {taken}; give the study's modes their own names")
    return {**MODES, **STUDY_MODES}


def unread_overrides(overrides, unread: dict[str, str]) -> list[str]:
    """The command-line overrides that set a key (or a key under one) the run never reads."""
    return [f"--config.{key} is set, but {unread[u]}" for key in overrides for u in unread
            if key == u or key.startswith(u + ".")]


def fail(message: str):
    """Ends the run before it starts, with one line that says what is wrong and how to fix it."""
    print(f"run.py: {message}", file=sys.stderr)
    sys.exit(2)


def help_text() -> str:
    """`run.py --help`: the module docstring, the modes, the experiment files with their variants, the flags."""
    modes = all_modes()
    lines = [__doc__.strip(), "", "Modes (config.mode -> module; the study modes come from studies.MODES):"]
    lines += [f"  {mode:<14} {module}" for mode, module in modes.items()]
    lines += ["", "Experiment files (--config experiments/<file>.py:<variant>[,<variant>...]; each docstring holds its "
                  "commands):"]
    for name in experiments.files():
        alone, modifiers = experiments.variants(experiments.load(name))
        listed = ", ".join(alone) if alone else "no variant table (see the file's docstring)"
        lines += textwrap.wrap(listed, 110, initial_indent=f"  experiments/{name}.py: ", subsequent_indent=" " * 6)
        if modifiers:
            lines.append(f"      modifiers of a training arm: {', '.join(modifiers)}")
    lines += ["", "Flags:",
              "  --config FILE.py[:VARIANTS]  the experiment (required); --config.<key>=<value> overrides one field",
              "  --workdir DIR                where outputs go (required to run)",
              "  --print-config               print the resolved config of the command and exit; nothing runs",
              "  --verbose                    INFO records on the console; tracebacks for one-line errors",
              "  --helpfull                   absl's list of every flag"]
    return "\n".join(lines)


def parse_flags(argv):
    """absl's flag parsing, with a bad `--config` or override as one line instead of a traceback
    (ml_collections raises KeyError/AttributeError for an unknown key, with a did-you-mean hint).
    `--help` prints `help_text()` (absl's own lists only the flags)."""
    if any(arg in HELP_FLAGS for arg in argv[1:]):
        print(help_text())
        sys.exit(0)
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
    modes = all_modes()
    if mode not in modes:
        fail(f"config.mode={mode!r} is not one of {sorted(modes)}")
    if _PRINT_CONFIG.value:
        print(config.to_json_best_effort(indent=2, sort_keys=True))
        return
    workdir = _WORKDIR.value
    if not workdir:
        fail("--workdir is required: it receives config.json, metrics and outputs")
    try:
        config_checks.check(config)
    except ONE_LINE_ERRORS as e:
        fail(str(e))
    module = importlib.import_module(modes[mode])
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
