"""The testbed probe: the three pool properties and Rank-1 inference with the learned policy.

`get_config(arg)`: `arg` is a comma-separated list of variants (`VARIANTS`) applied in order.

    # the warm start and two checkpoints of a training arm (experiments/testbed.py)
    python run.py --config experiments/testbed_probe.py --config.model.hf_dir=W_sft/hf \
        --config.probe.checkpoints=hf,W_run:5,W_run:15 --workdir W_probe
    # plumbing check in seconds
    python run.py --config experiments/testbed_probe.py:smoke --config.model.hf_dir=W_sft/hf \
        --config.probe.checkpoints=hf,W_run:3 --workdir W_probe_smoke

`probe.checkpoints`: comma-separated specs, `hf` (the params in model.hf_dir) or `<train workdir>:<step>`
(that run's orbax checkpoint, loaded into the model and tokenizer of model.hf_dir). The first and the
last spec are compared for nonstationarity. Outputs and the measured numbers: docs/testbed.md,
"Probe: Rank-1 and the three properties with the learned policy".

Result seen (defaults, checkpoints=hf,<policy_only run>:40 from the CPU format_slip warm start, shared
2-core CPU): 341 s; base 15% at both; pool union 18% / 22% of the 51 failures vs best single sibling
(lenient_parse) 10% / 12% and a base re-roll 6%; Rank-1 at step 40 on synth_train:1 20% vs base 12%
(B=1), 30% vs 27% (base probe, B=2); 0% vs 0% on synth_heldout:1.
"""
from __future__ import annotations

import ml_collections

from hsjax.infra import experiments

common = experiments.load("common")


def base_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.mode = "probe"
    c.seed = 0
    c.benchmark = common.benchmark("synth")
    c.pool = common.DEFAULT_POOL

    c.model = ml_collections.ConfigDict()
    c.model.hf_dir = ""  # the warm start: W_sft/hf or the sft workdir W_sft itself (experiments/testbed.py:sft); required

    c.probe = ml_collections.ConfigDict()
    c.probe.checkpoints = "hf"  # comma-separated: hf | <train workdir>:<step>
    c.probe.temperature = 1.0
    c.probe.max_new_tokens = 64  # expert replies are 20-40 tokens
    # 1-2: base rollouts on unseen tasks of the training domains, every failure re-run under every
    # sibling and under the base (the control), `tries` times.
    c.probe.split = "synth_train"
    c.probe.task_seed = 1
    c.probe.num_tasks = 60
    c.probe.samples = 1
    c.probe.tries = 1
    # 3: Rank-1 vs base at equal rollouts on held-out tasks and on the stage-1 tasks, with
    # profiles fitted on a disjoint profiling set (another task seed).
    c.probe.rank1_checkpoints = "last"  # last | first_last | all | none
    c.probe.rank1_sets = ("synth_heldout:1", "synth_train:1")  # split:task seed
    c.probe.rank1_tasks = 60
    c.probe.rank1_arms = ("none:1", "base:2")  # router probe:rollouts per task (rank1.run_rank1)
    c.probe.profile_split = "synth_train"
    c.probe.profile_task_seed = 2
    c.probe.profile_tasks = 40  # 4 per family; x 8 rollouts (a base probe + every harness)
    # Rollout engine.
    c.probe.batch_size = 256  # episodes per rollout.collect call (512: ~13 GB peak on the CPU)
    c.probe.env_workers = 4
    c.probe.max_context_tokens = 2048
    c.probe.prompt_step = 128  # prompt length bucket of the sampler
    return c


def _smoke(c: ml_collections.ConfigDict) -> None:
    """Seconds: a handful of tasks, short replies (tests)."""
    c.probe.num_tasks = 4
    c.probe.rank1_tasks = 3
    c.probe.profile_tasks = 3
    c.probe.max_new_tokens = 16


VARIANTS = {"smoke": _smoke}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = base_config()
    for variant in [a.strip() for a in (arg or "").split(",") if a.strip()]:
        if variant not in VARIANTS:
            raise ValueError(f"unknown experiments/testbed_probe.py variant {variant!r}; known: {sorted(VARIANTS)}")
        VARIANTS[variant](c)
    return c
