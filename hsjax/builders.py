"""What a training run works on, built from its config: tasks, harnesses, model, policy, rescuer.

Kept apart from `train.py` so the loop reads as the algorithm, and so evaluation and analysis
scripts build exactly the same objects from the same config.
"""
import dataclasses
import json
from typing import Any, Callable

import jax
import numpy as np

from harness_envs import harness as hz
from harness_envs.dbbench import data as db_data
from harness_envs.dbbench import evaluator as db_evaluator
from harness_envs.dbbench import harness as db_harness
from harness_envs.dbbench.env import DBBenchEpisode
from hsjax.harness_s import rescue as rescue_lib
from hsjax.infra.metrics import to_python


class TaskStream:
    """An endless, reproducible stream of training tasks: a fresh permutation per epoch.

    Its whole state is the position, so checkpointing it makes resumed runs draw the same tasks.
    """

    def __init__(self, tasks, seed: int):
        if not tasks:
            raise ValueError("the training split has no tasks")
        self.tasks, self.seed, self.position = list(tasks), seed, 0

    def _order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.tasks))

    def next(self, count: int) -> list:
        out = []
        for _ in range(count):
            epoch, offset = divmod(self.position, len(self.tasks))
            out.append(self.tasks[self._order(epoch)[offset]])
            self.position += 1
        return out

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = int(state["position"])


@dataclasses.dataclass
class Workload:
    """A benchmark's tasks and harnesses, and how to make an episode of a task under a harness."""

    train_tasks: list
    eval_tasks: list
    base: hz.HarnessSpec
    siblings: list
    make_episode: Callable[..., Any]
    summarize: Callable[[list], dict]
    initial_messages: Callable[[Any, hz.HarnessSpec], list]
    tokenizer: Any = None
    # More evaluation sets, {split name: tasks} (`config.eval.extra_splits`), scored like eval_tasks.
    extra_eval_tasks: dict = dataclasses.field(default_factory=dict)

    def set_tokenizer(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._tasks = {t.task_id: t for t in self.train_tasks + self.eval_tasks}
        for tasks in self.extra_eval_tasks.values():
            self._tasks.update((t.task_id, t) for t in tasks)

    @property
    def pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else self.tokenizer.eos_token_id)

    def rerender_in_base(self, traj):
        """The rescue trajectory with its sibling instruction prefix replaced by the base harness's.

        The policy's actions and the observations it saw stay token-for-token; only the initial
        context (instruction, acknowledgement, question) is the base harness's, so the update can
        train those actions "as if" produced under the base harness (`rescue_context='base'`).
        Returns None when that is not well defined (several segments: the harness rewrote history).
        """
        from hsjax.rollout.policy import render_prompt
        from hsjax.rollout.engine import Segment

        if len(traj.segments) != 1 or not traj.turns:
            return None
        task = self._tasks[traj.result["task_id"]]
        base_prompt = np.asarray(render_prompt(self.tokenizer, self.initial_messages(task, self.base)),
                                 np.int32)
        seg, cut = traj.segments[0], int(traj.turns[0]["prompt_tokens"])
        rest = slice(cut, None)
        rerendered = Segment(
            tokens=np.concatenate([base_prompt, seg.tokens[rest]]).astype(np.int32),
            loss_mask=np.concatenate([np.zeros(len(base_prompt), seg.loss_mask.dtype), seg.loss_mask[rest]]),
            logprobs=np.concatenate([np.zeros(len(base_prompt), np.float32), seg.logprobs[rest]]))
        return dataclasses.replace(traj, segments=[rerendered])


def _db_protocol(config, load_split, eval_load_split=None) -> Workload:
    """A workload on the DBBench protocol (episodes, harnesses, evaluator) over `load_split` tasks."""
    from hsjax.modes.evaluate import build_backend, resolve_path

    backend = build_backend(config.backend)
    pool = hz.load_pool(resolve_path(config.pool)) if config.pool else {"base": hz.BASE}
    siblings = [pool[name] for name in pool if name != "base"]
    if config.rescue.kind == "hint":
        # Guide-GRPO's rescuer: one hint-augmented copy of the base harness, not the pool.
        siblings = [pool["base"].with_knobs(name="hint", direction="hint", hint=config.rescue.hint)]

    def split(name, limit, load=load_split):
        tasks = load(name)
        return tasks[:limit] if limit else tasks

    def make_episode(task, spec, sample_index=0):
        return DBBenchEpisode(task, spec, backend, sample_index=sample_index)

    return Workload(
        train_tasks=split(config.data.train_split, config.data.get("limit", 0)),
        eval_tasks=split(config.eval.split, config.eval.limit, eval_load_split or load_split),
        extra_eval_tasks={name: split(name, config.eval.limit, eval_load_split or load_split)
                          for name in config.eval.get("extra_splits", ()) if name != config.eval.split},
        base=pool["base"], siblings=siblings, make_episode=make_episode,
        summarize=db_evaluator.summarize,
        initial_messages=lambda task, spec: db_harness.initial_messages(
            spec, task.question, task.add_description))


def _dbbench(config) -> Workload:
    return _db_protocol(config, db_data.load_split)


def _synth(config) -> Workload:
    """The testbed's generated tasks (`harness_envs/synth`), same protocol and evaluator."""
    from harness_envs.synth import tasks as synth_tasks

    # Task seeds pick which tasks of a split (its domains and wordings are fixed): evaluating with
    # another seed than training gives unseen tasks of the training domains.
    train_seed, eval_seed = config.data.get("task_seed", 0), config.eval.get("task_seed", 0)
    return _db_protocol(config, lambda name: synth_tasks.load_split(name, seed=train_seed),
                        lambda name: synth_tasks.load_split(name, seed=eval_seed))


WORKLOADS = {"dbbench": _dbbench, "synth": _synth}


def make_workload(config) -> Workload:
    if config.benchmark not in WORKLOADS:
        raise ValueError(f"config.benchmark={config.benchmark!r} is not one of {sorted(WORKLOADS)}")
    return WORKLOADS[config.benchmark](config)


def make_model(config):
    """(model config, params, tokenizer) from `config.model.hf_dir`, or a preset with random weights."""
    import dataclasses as dc

    from hsjax import models
    from hsjax.models import presets
    from hsjax.models.tokenizer import build_tiny_tokenizer

    runtime = {k: config.model[k] for k in ("dtype", "param_dtype", "remat", "attention_impl")
               if k in config.model}
    if config.model.hf_dir:
        cfg, params, tokenizer = models.load_pretrained(config.model.hf_dir)
        return dc.replace(cfg, **runtime), params, tokenizer
    tokenizer = build_tiny_tokenizer()
    cfg = dc.replace(presets.get_preset(config.model.preset), vocab_size=len(tokenizer), **runtime)
    params = models.init_params(cfg, jax.random.PRNGKey(config.seed))
    return cfg, params, tokenizer


def make_policy(config, cfg, params, tokenizer):
    from hsjax.rollout.policy import JaxPolicy

    return JaxPolicy(cfg, params, tokenizer, seed=config.seed)


def make_rescuer(config, workload: Workload, extra_voters=()) -> rescue_lib.Rescuer:
    kind = config.rescue.kind
    if kind == "harness_s":
        from hsjax.harness_s.router.router import build_rescuer

        return build_rescuer(config, workload.siblings, extra_voters=extra_voters)
    if kind == "hint":
        return rescue_lib.FixedSiblings(workload.siblings)
    return rescue_lib.make_rescuer(kind, workload.siblings, config.rescue.k, seed=config.seed,
                                   names=list(config.rescue.siblings))


class _NoVoters:
    specs = ()

    def close(self) -> None:
        pass


def start_local_voters(config, workdir: str):
    """Starts the voter servers a Harness-S run asks for (`config.router.local_voters`)."""
    kinds = config.get("router", {}).get("local_voters", ()) if config.rescue.kind == "harness_s" else ()
    if not kinds:
        return _NoVoters()
    from hsjax.harness_s.router.local_voters import start_local_voters as start

    return start(kinds, workdir=workdir, policy_hf_dir=config.model.hf_dir or None, seed=config.seed,
                 timeout_s=config.router.get("local_timeout_s", 30.0))


def episode_record(traj) -> dict:
    """A JSON-ready record of a finished episode (the task object itself is left out)."""
    record = {k: v for k, v in traj.result.items() if k != "task"}
    record.update(num_generated_tokens=traj.num_generated_tokens, abort_reason=traj.abort_reason,
                  replies=[turn["text"] for turn in traj.turns])
    return to_python(record)


def append_jsonl(path: str, rows) -> None:
    rows = list(rows)
    if not rows:
        return
    with open(path, "a") as f:
        for row in rows:
            f.write(json.dumps(to_python(row), sort_keys=True) + "\n")
