"""Range checks of config values, run once by `run.py` before any mode starts.

A value out of range does not fail loudly where it is used: a NaN learning rate trains to NaN
weights with loss 0, `limit=-3` evaluates all but the last three tasks, `checkpoint.every=0`
divides by zero many steps in, a `name` holding `../` writes outside the workdir. So every such
value is checked here, in one table, and the run ends before it starts with one line naming the
key, the value and what is allowed (`UserError`, exit status 2).

`CHECKS` is that table: (key pattern, test, what is allowed). A pattern is a dotted key or an
`fnmatch` pattern over dotted keys (`*.timeout` is every block's timeout); a row applies only to
the keys the config has, so one table serves every mode. Tuples are checked element by element.
"""
from __future__ import annotations

import fnmatch
import math
from typing import Callable, Iterator

from ml_collections import ConfigDict

from hsjax.infra import tracking
from hsjax.infra.errors import UserError
from hsjax.models import lora


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def finite_positive(value) -> bool:
    return _number(value) and math.isfinite(value) and value > 0


def at_least(low: float) -> Callable[[object], bool]:
    return lambda value: _number(value) and math.isfinite(value) and value >= low


def within(low: float, high: float) -> Callable[[object], bool]:
    return lambda value: _number(value) and low <= value <= high  # NaN fails both comparisons


def file_name_part(value) -> bool:
    """A string that names a file inside its folder: not empty, no path separator, no `..`, no NUL."""
    return (isinstance(value, str) and value != "" and "/" not in value and "\\" not in value
            and ".." not in value and "\0" not in value)


POSITIVE = (finite_positive, "a finite number > 0")
COUNT = (at_least(1), "an integer >= 1")
NON_NEGATIVE = (at_least(0), "a finite number >= 0")
TASK_LIMIT = (at_least(0), "an integer >= 0 (0: every task of the split)")
SHARE = (within(0.0, 1.0), "a number in [0, 1]")
def count_or_zero(value) -> bool:
    """An int >= 0, not a bool (a float count of samples or of a rank means nothing)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


SAMPLES = (count_or_zero, "an integer >= 0 (0: no sampled episodes)")
LORA_TARGETS = tuple(lora.INPUT_AXES)  # the projections an adapter can sit on
NAME = (file_name_part, "a plain file name: not empty, without '/', '\\', '..' or NUL")

# (key pattern, test, what is allowed). Only keys with a plain meaning are here; a key whose 0 or
# negative value means something (mesh sizes, process_id=-1 = detect) is left to its reader.
CHECKS: tuple[tuple[str, Callable[[object], bool], str], ...] = (
    # optimisation: a non-finite or non-positive step size silently trains to garbage
    ("*learning_rate", *POSITIVE), ("*_lr", *POSITIVE),
    ("optim.weight_decay", *NON_NEGATIVE), ("optim.max_grad_norm", *NON_NEGATIVE),
    ("optim.warmup_steps", *NON_NEGATIVE), ("optim.schedule_steps", *NON_NEGATIVE),
    ("lora.rank", count_or_zero, "an integer >= 0 (0: no LoRA, every weight trains)"), ("lora.alpha", *POSITIVE),
    ("lora.targets", lambda v: v in LORA_TARGETS, f"one of {LORA_TARGETS}"),
    ("loss.beta", *NON_NEGATIVE),  # the KL term's weight; 0: no reference is held
    ("loss.kl_estimator", lambda v: v in ("k1", "k2", "k3"), "one of 'k1', 'k2', 'k3' (docs/training.md, KL)"),
    # how much work: a step count or batch of zero divides by zero or does nothing
    ("total_steps", *NON_NEGATIVE),  # 0: only score the starting policy (testbed's names_warmstart)
    ("checkpoint.every", *COUNT), ("checkpoint.keep", *COUNT),
    ("rollout.n", *COUNT), ("rollout.groups", *COUNT), ("batch.micro_batches", *COUNT),
    ("model.memory_budget", *NON_NEGATIVE),  # GiB; 0: the device's own memory (models/memory_plan.py)
    ("runner.batch_size", *COUNT), ("*.env_workers", *COUNT), ("*batch_size", *COUNT),
    ("rescue.k", *COUNT), ("rescue.m", *COUNT), ("dapo.max_draws", *COUNT),
    ("log.print_every", *COUNT), ("log.every", *COUNT), ("sft.save_every", *COUNT), ("sft.steps", *COUNT),
    ("*max_new_tokens", *COUNT), ("serve.max_batch", *COUNT), ("*.max_reply_bytes", *COUNT),
    ("eval.every", *NON_NEGATIVE), ("log.episodes_every", *NON_NEGATIVE), ("router.reanchor_every", *NON_NEGATIVE),
    ("log.table_rows", *NON_NEGATIVE), ("log.table_chars", *NON_NEGATIVE),
    ("log.wandb", lambda v: v in tracking.WANDB_MODES, "one of 'off', 'offline', 'online' (docs/training.md, Tracking)"),
    # the router's choices (docs/harness_s.md, "Router"); a typo would otherwise fail only at the first rescue
    ("router.selection", lambda v: v in ("ucb", "thompson"), "one of 'ucb', 'thompson'"),
    ("router.tie_break", lambda v: v in ("shuffle", "name"), "one of 'shuffle', 'name'"),
    ("router.validity", lambda v: v in ("off", "replay"), "one of 'off', 'replay'"),
    ("router.validity_weight", *NON_NEGATIVE),
    ("router.validity_floor", lambda v: 0 <= v <= 0.5, "in [0, 0.5] (0 = off; docs/harness_s.md, \"Router\")"),
    # how many tasks: Python slicing makes a negative limit "all but the last n", silently
    ("limit", *TASK_LIMIT), ("*.limit", *TASK_LIMIT), ("*.profile_limit", *TASK_LIMIT),
    ("runner.max_context_tokens", *NON_NEGATIVE), ("runner.max_context_chars", *NON_NEGATIVE),
    ("runner.max_record_chars", *NON_NEGATIVE),
    # probabilities and shares
    ("*.noise.*", *SHARE), ("router.explore", *SHARE), ("router.decay", *SHARE), ("router.profile_weight", *SHARE),
    ("max_policy_error_share", *SHARE), ("*top_p", within(1e-9, 1.0), "a number in (0, 1]"),
    # sampling
    ("*temperature", at_least(0), "a finite number >= 0 (0 or greedy: the most likely token)"),
    ("*top_k", *NON_NEGATIVE),
    ("num_samples", *SAMPLES), ("eval.num_samples", *SAMPLES),  # sampled evaluation: pass@k, mean@k
    # patience: a zero or negative timeout fails every request at once
    ("*.timeout", *POSITIVE), ("*timeout_s", *POSITIVE), ("*.time_budget_s", *POSITIVE), ("*.wall_s", *POSITIVE),
    ("*.cpu_s", *POSITIVE), ("*.max_retries", *NON_NEGATIVE), ("*.env_retries", *NON_NEGATIVE),
    ("*.backoff", *NON_NEGATIVE), ("*.max_backoff", *NON_NEGATIVE), ("*.max_consecutive_failures", *NON_NEGATIVE),
    # names that become file names under the workdir (eval/<name>.json, eval/<split>_step<N>.json)
    ("name", *NAME), ("eval.split", *NAME), ("eval.extra_splits", *NAME),
)


def leaves(config: ConfigDict, prefix: str = "") -> Iterator[tuple[str, object]]:
    """(dotted key, value) of every leaf of `config`."""
    for key in config.keys():
        value = config[key]
        if isinstance(value, ConfigDict):
            yield from leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def violations(config: ConfigDict) -> list[str]:
    """One phrase per out-of-range value, in the config's key order; [] when every value is allowed."""
    found = []
    for key, value in leaves(config):
        for pattern, test, allowed in CHECKS:
            if not fnmatch.fnmatchcase(key, pattern):
                continue
            items = value if isinstance(value, (tuple, list)) else (value,)
            if not all(test(item) for item in items):
                found.append(f"--config.{key}={value!r} is out of range: allowed {allowed}")
            break  # the first matching row decides, so a specific row can precede a pattern
    return found


def relation_violations(config: ConfigDict) -> list[str]:
    """Values each within range that do not fit together: the warm-up must end inside the schedule
    (`optim.schedule_steps`, or `total_steps` when 0), else building the optimizer fails with a
    traceback after the model has loaded."""
    if "optim" not in config or "warmup_steps" not in config.optim or "total_steps" not in config:
        return []
    warmup = config.optim.warmup_steps
    span = config.optim.get("schedule_steps", 0) or config.total_steps
    if not (_number(warmup) and _number(span)) or warmup < span:
        return []
    return [f"--config.optim.warmup_steps={warmup!r} must be less than the schedule's {span!r} steps "
            "(optim.schedule_steps, or total_steps when that is 0): lower the warm-up or lengthen the schedule"]


def sampled_eval_violations(config: ConfigDict) -> list[str]:
    """Sampled evaluation (`num_samples` of eval mode, `eval.num_samples` of training) draws at the
    sampling block's temperature: at 0 its k samples would be k copies of one greedy episode."""
    found = []
    for key, block in (("num_samples", "sampling"), ("eval.num_samples", "eval")):
        head, _, leaf = key.rpartition(".")
        holder = config.get(head) if head else config
        sampling = config.get(block)
        if not isinstance(holder, ConfigDict) or leaf not in holder or not isinstance(sampling, ConfigDict):
            continue
        k, temperature = holder[leaf], sampling.get("temperature", 1.0)
        if _number(k) and k > 0 and _number(temperature) and temperature <= 0:
            found.append(f"--config.{key}={k!r} draws {k} samples a task at {block}.temperature={temperature!r}, "
                         f"which makes them copies of one greedy episode: set {block}.temperature > 0 or {key}=0")
    return found


def check(config: ConfigDict) -> None:
    """Raises one `UserError` naming every out-of-range value of `config`, and how to fix it."""
    found = violations(config)
    found += relation_violations(config) + sampled_eval_violations(config) if not found else []
    found += tracking.missing_packages(config) if not found else []
    if found:
        raise UserError("; ".join(found) + ". Fix the value on the command line or in the experiment file")
