"""The learnable testbed: synthetic DBBench-protocol tasks, a scripted expert, a tiny policy.

`get_config(arg)`: `arg` is a comma-separated list of variants applied in order to `base_config()`
(`VARIANTS`). Later arms (`policy_only`, `harness_s`, ...) extend the same base.

Copy base of the names regime (`:copy_base,names`, the copy warm-up alone; W/hf, W/copy_warmup.json):

    python run.py --config experiments/testbed.py:copy_base,names --workdir W_copy

SFT warm start (writes W/metrics.jsonl, W/hf, W/checkpoints, W/eval/sft.json; docs/testbed.md):

    python run.py --config experiments/testbed.py:sft --workdir /tmp/hsjax/sft
    # a quick check (seconds of training, small eval)
    python run.py --config experiments/testbed.py:sft,smoke --workdir /tmp/hsjax/sft_smoke

Regime (`config.regime`, docs/testbed.md): families A are imitated in the base protocol under the
base harness; families B in `regime.b_style`: `schema_recovery` (default; misname a column, recover
after schema_reminder's reminder, give up after a bare error — a share imitated under base),
`format_slip` (`:format_slip`, accepted by lenient_parse) or `premature_answer` (`:premature`,
verify_answer). The other types get no SFT data.

The shipped warm start `assets/testbed_warmstart` is
    python run.py --config experiments/testbed.py:sft --config.sft.steps=1600 --config.sft.num_tasks=2000 \
        --config.optim.warmup_steps=50 --config.eval.sampled=False --workdir W_sft
(2,861 s on the shared 2-core CPU; training domains, greedy: base 24% vs schema_reminder 29%,
families B 0% under base and 0/20/20/10% under schema_reminder; held-out 0% everywhere).

Training arms (`TRAIN_ARMS`, mode train; modifiers `smoke`, `gpu`): one command per arm,
    python run.py --config experiments/testbed.py:harness_s --config.model.hf_dir=assets/testbed_warmstart \
        --config.seed=0 --workdir W/harness_s/seed0
or arms x seeds with experiments/testbed_sweep.py; tables, plots and the behaviour analysis with
`python -m studies.testbed.report --root W --out DIR`; results in docs/results.md. `:demo` is README's
main job (studies/testbed/demo.py).
"""
from __future__ import annotations

import ml_collections

from hsjax.infra import experiments

common = experiments.load("common")

FAMILIES_A = ("other", "counting", "ranking", "aggregation-SUM", "aggregation-MAX", "INSERT")
FAMILIES_B = ("comparison", "aggregation-MIN", "aggregation-AVG", "UPDATE")
HARNESSES = ("base", "lenient_parse", "schema_reminder", "verify_answer", "paged_results",
             "normalize_answer", "more_rounds")


def base_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.mode = "sft"
    c.seed = 0
    c.benchmark = common.benchmark("synth")
    c.pool = common.DEFAULT_POOL

    c.data = ml_collections.ConfigDict()
    c.data.train_split = "synth_train"
    c.data.num_train_tasks = 2000
    c.data.task_seed = 0  # which tasks; the split's domains and templates are fixed

    c.model = ml_collections.ConfigDict()
    c.model.preset = "tiny"
    c.model.tokenizer = "tiny"  # tiny (the shipped warm starts) | tiny_qwen2 (AutoTokenizer-exact; new runs)
    # Preset fields changed with dataclasses.replace; 0 keeps the preset's value.
    c.model.overrides = ml_collections.ConfigDict(
        {"hidden_size": 0, "intermediate_size": 0, "num_layers": 0, "num_heads": 0, "num_kv_heads": 0,
         "head_dim": 0})

    c.regime = ml_collections.ConfigDict()
    c.regime.kind = "types"  # types: the first regime (families A/B); names: testbed v2 (`:names`)
    c.regime.families_a = FAMILIES_A
    c.regime.families_b = FAMILIES_B
    # schema_recovery (docs/testbed.md, "The warm-start regime"): families B misname a column first
    # and recover only when the error ends with the schema (schema_reminder); a share of them is
    # imitated under the base harness giving up. The successful trajectory is valid under base
    # move for move, so rescue can transfer. format_slip / premature_answer: the earlier regimes,
    # whose rescued trajectories are the slip itself (docs/results.md, the pilot).
    c.regime.b_style = "schema_recovery"  # schema_recovery | format_slip | premature_answer
    c.regime.b_base_share = 0.5
    c.regime.slip_variant = "upper_fence"  # upper_fence | no_action_line | inline_fence

    c.sft = ml_collections.ConfigDict()
    c.sft.num_tasks = 1500  # the first tasks of the train split become expert episodes
    # A model directory (save_pretrained) SFT starts from instead of random weights: a copy base
    # (`:copy_base`, studies/testbed/copy_base.py) for the names regime; "" = random weights.
    c.sft.init_from = ""
    # The copy_base mode only: a model directory whose copy warm-up it continues; "" = random weights.
    c.sft.copy_base_from = ""
    c.sft.steps = 300
    c.sft.batch_size = 16
    c.sft.max_len = 1024
    c.sft.env_workers = 4
    c.sft.save_every = 100  # steps between resumable checkpoints (a warm start takes over an hour on CPU)
    # Steps of the copy warm-up before SFT (studies/testbed/copy_warmup.py: a short list of
    # random syllable words repeated to the end of the row, the loss on the repeats) and its
    # learning rate; 0 steps = none, as every shipped warm start.
    c.sft.copy_warmup_steps = 0
    c.sft.copy_warmup_lr = 1e-3
    # Steps after those that alternate repeat rows with gap rows (copy_warmup.gap_row: filler, a
    # list, filler, the list again, within `copy_far_tokens`); with them, replay draws gap rows too.
    c.sft.copy_far_steps = 0
    c.sft.copy_far_tokens = 384
    # One step on copy rows (the same optimizer) after every N-th SFT step; 0 = never.
    c.sft.copy_replay_every = 0
    # What surrounds the copy rows' lists (copy_warmup.STYLES): "plain" filler words and ", " (v10),
    # or "context": prose leads and gaps, varied separators (v11). The warm-up's and replay's rows.
    c.sft.copy_style = "plain"
    # Rows each cell of the warm-up's copy tables (copy_warmup.gap_tables) averages: 16 keep a
    # cell's standard error near 0.1 nat; smoke runs, which read no table, use 2.
    c.sft.copy_table_rows = 16

    c.optim = ml_collections.ConfigDict()
    c.optim.learning_rate = 3e-3
    c.optim.warmup_steps = 20
    c.optim.end_lr_ratio = 0.05
    c.optim.weight_decay = 0.01
    c.optim.max_grad_norm = 1.0

    c.eval = ml_collections.ConfigDict()
    c.eval.split = "synth_heldout"
    c.eval.num_tasks = 400
    c.eval.per_type = 5  # tasks per family, per split
    c.eval.harnesses = HARNESSES  # or "all"
    c.eval.sampled = True  # also at temperature 1
    c.eval.max_new_tokens = 96
    c.eval.batch_size = 128
    c.eval.prompt_step = 128  # prompt length bucket of the sampler

    c.log = ml_collections.ConfigDict()
    c.log.every = 10
    c.log.tensorboard = False
    return c


def _sft(c: ml_collections.ConfigDict) -> None:
    c.mode = "sft"


def _copy_base(c: ml_collections.ConfigDict) -> None:
    """The copy warm-up alone, saved as W/hf for `sft.init_from` (with `:names`: the names regime's)."""
    c.mode = "copy_base"


def _premature(c: ml_collections.ConfigDict) -> None:
    c.regime.b_style = "premature_answer"


def _format_slip(c: ml_collections.ConfigDict) -> None:
    c.regime.b_style = "format_slip"


NAMES_POOL = "harness_envs/pools/testbed_names.json"
# The names regime's copy base: the copy warm-up alone (docs/testbed.md, "Copy base"), made by
#     python run.py --config experiments/testbed.py:copy_base,names --workdir W   (then W/hf)
# which continues COPY_BASE_V10 on context rows (v11). V10 itself (plain rows from random weights):
#     ... :copy_base,names --config.sft.copy_base_from= --config.sft.copy_style=plain \
#         --config.sft.copy_warmup_steps=1900 --config.sft.copy_far_steps=300
COPY_BASE_V10 = "assets/testbed_copy_base"
COPY_BASE = "assets/testbed_copy_base_v11"
NAMES_HARNESSES = ("base", "tables_first", "schema_reminder")
# The names regime's splits (harness_envs/synth/names.py): SFT, the gates and the arms' GRPO draw
# training tasks from NAMES_TRAIN_SPLIT (task seeds 0, 2 and 1), held-out ones from NAMES_HELDOUT_SPLIT.
NAMES_TRAIN_SPLIT = "shared_leads_train"
NAMES_HELDOUT_SPLIT = "distinct_heldout"


def _names(c: ml_collections.ConfigDict) -> None:
    """Testbed v2 (docs/testbed.md, "Testbed v2"): per-task names, half of the tasks hide the table
    name, the names pool. The SFT mix plants SHOW TABLES rarely under base and often under
    tables_first (`studies.testbed.sft_data.names_plan`); the gates check what came out."""
    c.benchmark = common.benchmark("synth_names")
    c.pool = NAMES_POOL
    # Coined names, no syllable shared by two names of a task, three wordings a family and lead-ins
    # shared across families (harness_envs/synth/names.py): what a warm start needs to pass G1. The
    # splits without one of these stay, so the runs that failed on them can be reproduced
    # (docs/results.md, "the copy warm-up's rows").
    c.data.train_split = NAMES_TRAIN_SPLIT
    c.data.task_seed = 0  # GRPO draws from task seed 1, evaluation from seeds 2 (train) and 0 (held-out)
    c.regime = ml_collections.ConfigDict({
        "kind": "names",
        "visible_hint_share": 0.25,
        "hidden_shares": (0.4, 0.4, 0.2),  # base, tables_first, schema_reminder
        "show_rate_base": 0.08,
        "show_rate_hint": 0.75,
    })
    # One pass over fresh tasks (steps x batch = 48,000 tasks, none repeated): a warm start trained
    # for epochs memorises its tasks' names instead of copying them (docs/results.md).
    # The tokenizer spells every name one way wherever it stands, one token a syllable, so copying
    # a name from the prompt or a SHOW TABLES result into SQL is 2-3 tokens copied as they are.
    # 1,500 steps (about 85 minutes on two idle CPU cores) so one SFT finishes within a working session;
    # from the copy base every token but the names' costs under 0.2 nats by step 300.
    c.model.tokenizer = "tiny_words"
    c.sft.num_tasks = 48000
    c.data.num_train_tasks = 48600  # 600 more: the SFT eval's unseen training-domain tasks
    c.sft.steps = 1500
    c.sft.batch_size = 32
    c.sft.max_len = 640  # a few hidden-name episodes with a long table exceed 512
    # SFT alone never learns to copy a name (docs/results.md). The copy warm-up (`:copy_base,names`,
    # these settings) runs once and ships as COPY_BASE, which SFT starts from: COPY_BASE_V10's lookup
    # on plain rows, continued on context rows so that it also works after a task prompt. A name
    # stands up to ~560 tokens before the SQL that copies it (prefix 209 + a reply of up to 352),
    # hence the gap rows' reach.
    c.sft.init_from = COPY_BASE
    c.sft.copy_base_from = COPY_BASE_V10
    c.sft.copy_style = "context"
    c.sft.copy_warmup_steps = 400
    c.sft.copy_far_steps = 200
    c.sft.copy_far_tokens = 560
    # SFT at 3e-3 erases the warm-up's copy within 300 steps (docs/results.md): replay it, and
    # train at the warm-up's rate.
    c.sft.copy_replay_every = 2
    c.optim.learning_rate = 1e-3
    c.optim.warmup_steps = 50
    c.eval.split = NAMES_HELDOUT_SPLIT
    c.eval.num_tasks = 600
    c.eval.per_type = 10
    c.eval.harnesses = NAMES_HARNESSES
    c.eval.sampled = False  # the gates (`:gates`) measure at the trainer's temperature


def gates_config() -> ml_collections.ConfigDict:
    """The warm-start gates of testbed v2 (studies/testbed/gates.py), at temperature 1."""
    c = ml_collections.ConfigDict()
    c.mode = "testbed_gates"
    c.seed = 0
    c.benchmark = common.benchmark("synth_names")
    c.pool = NAMES_POOL
    # checkpoint: a training workdir, to measure a trained policy (its latest checkpoint) the same way
    c.model = ml_collections.ConfigDict({"hf_dir": "assets/testbed_names_warmstart", "checkpoint": ""})
    c.gates = ml_collections.ConfigDict()
    c.gates.tasks_per_cell = 100
    c.gates.heldout_split = NAMES_HELDOUT_SPLIT
    c.gates.heldout_seed = 0
    c.gates.train_split = NAMES_TRAIN_SPLIT
    c.gates.train_seed = 2  # SFT used seed 0, GRPO seed 1
    c.gates.temperature = 1.0
    c.gates.max_new_tokens = 64
    c.gates.batch_size = 256
    # G3's bands (fractions) for the hidden names under base: opening with SHOW TABLES, and success.
    c.gates.g3_opens = (0.04, 0.12)
    c.gates.g3_success = (0.02, 0.08)
    c.gates.regime = "names"  # the lookup regime (studies/testbed/lookup.py): names | apis
    return c


def demo_config() -> ml_collections.ConfigDict:
    """README's main job (studies/testbed/demo.py): the shipped warm start, scored, then trained by
    Harness-S and by plain GRPO, each scored again under the base harness."""
    c = ml_collections.ConfigDict()
    c.mode = "testbed_demo"
    c.seed = 0
    c.model = ml_collections.ConfigDict({"hf_dir": "assets/testbed_warmstart"})
    c.demo = ml_collections.ConfigDict()
    c.demo.arms = ("harness_s", "policy_only")
    c.demo.total_steps = 5  # with the evaluations, 8-9.5 minutes on the 2-core CPU
    c.demo.eval_limit = 30
    c.demo.groups = 0  # tasks a training step; 0 = the arms' own (8). Fewer: a quicker, noisier look
    # Micro-batches of the update: 16 (4 rows each) instead of the arms' 8 keep the demo's peak
    # memory under 2 GB for 5% more update time; 0 = the arms' own (docs/performance.md, "Memory").
    c.demo.micro_batches = 16
    return c


def _smoke(c: ml_collections.ConfigDict) -> None:
    """Seconds: a few steps, a small eval."""
    c.data.num_train_tasks = 60
    c.sft.num_tasks = 40
    c.sft.steps = 4
    c.sft.batch_size = 4
    c.sft.copy_warmup_steps = min(c.sft.copy_warmup_steps, 2)
    c.sft.copy_far_steps = min(c.sft.copy_far_steps, 2)
    c.sft.copy_table_rows = 2
    c.optim.warmup_steps = 1
    c.eval.num_tasks = 20
    c.eval.per_type = 1
    c.eval.harnesses = ("base", "docs_first") if c.regime.kind == "apis" else ("base", "lenient_parse")
    c.eval.sampled = False
    c.eval.max_new_tokens = 16
    c.log.every = 1


def _gpu(c: ml_collections.ConfigDict) -> None:
    """The device machine: the same tiny policy trained to convergence, a larger evaluation."""
    c.sft.steps = 3000
    c.sft.batch_size = 64
    c.optim.warmup_steps = 100
    c.eval.per_type = 10
    c.eval.batch_size = 512


VARIANTS = {
    "sft": _sft,
    "copy_base": _copy_base,
    "names": _names,
    "gpu": _gpu,
    "premature": _premature,
    "format_slip": _format_slip,
    "smoke": _smoke,
}


# ------------------------------------------------------------------------------------------------
# Training arms (config.mode = 'train'): GRPO from the SFT warm start on the synthetic tasks, held-out
# success measured under the base harness. One command per arm, e.g.
#
#     python run.py --config experiments/testbed.py:harness_s --config.model.hf_dir=W_sft/hf --workdir W
#
# They reuse the training blocks of experiments/dbbench.py; `model.hf_dir` must name the warm start.


TESTBED_HINT = ("If a statement fails with an unknown column, read the column names in the table "
                "description, correct the statement and run it again.")


def _train_base(arm: str) -> ml_collections.ConfigDict:
    c = experiments.get_config("dbbench", arm)
    c.benchmark.name = "synth"
    c.data.train_split = "synth_train"
    c.data.limit = 0
    c.data.task_seed = 0  # the SFT warm start's tasks (base_config's data.task_seed)
    # Held-out tasks (other domains and wordings) are the headline; unseen tasks of the training
    # domains (task seed 1) show the training families. Both under the base harness, greedy.
    c.eval.split = "synth_heldout"
    c.eval.extra_splits = ("synth_train",)
    c.eval.task_seed = 1
    c.eval.limit = 60  # 6 per family
    c.eval.every = 5
    c.eval.at_start = False  # the warm start is scored once (`warmstart` arm), not by every arm
    c.eval.max_new_tokens = 64
    # 10 steps x 32 base rollouts: about 5 minutes for policy_only on the 2-core CPU (26 s a step:
    # rollouts 9 s, update 17 s over rows of ~1,000 tokens, most of them the shared instruction).
    c.total_steps = 10
    c.rollout.groups = 8
    c.rollout.n = 4
    c.rollout.max_new_tokens = 64  # expert replies are 20-40 tokens
    c.rollout.max_context_tokens = 2048
    c.rescue.k = 2
    c.rescue.m = 2
    c.rescue.hint = TESTBED_HINT
    c.dapo.max_draws = 3
    # A sibling that repairs a failure reliably makes every rescue slot succeed: under the plain
    # masking rule that group has zero variance and no gradient (docs/training.md, rescue_baseline).
    c.loss.rescue_baseline = "with_base"
    c.optim.learning_rate = 3e-4
    c.optim.warmup_steps = 2
    c.batch.T_buckets = (512, 1024, 2048)
    # Rescue rows of up to 2,048 tokens: one update of 64 such rows peaks at 4.7 GB (2.4 GB with
    # model.remat=True; docs/performance.md, "Memory"). 8 keeps the arms' step as docs/results.md
    # measured it.
    c.batch.micro_batches = 8
    c.checkpoint.every = 5
    c.checkpoint.keep = 4
    c.log.tensorboard = False
    c.log.progress = False
    c.log.episodes_every = 1  # every step's rollouts, for the behaviour analysis
    return c


def _harness_s_arm(k=2, voters=("rule", "policy"), reanchor_every=5):
    def arm(_):
        c = _train_base("harness_s")
        c.rescue.k = k
        c.router.local_voters = voters
        c.router.reanchor_every = reanchor_every
        return c
    return arm


def _random_arm(_):
    c = _train_base("train")
    c.rescue.kind = "random"
    return c


def _warmstart(_):
    """Scores the warm start once (step 0) under the base harness on the arms' evaluation sets."""
    c = _train_base("policy_only")
    c.total_steps = 0
    c.optim.schedule_steps = 10  # an optimizer is still built; its schedule is never used
    c.eval.at_start = True
    return c


# ------------------------------------------------------------------------------------------------
# Testbed v2 arms (docs/testbed.md, "Testbed v2"; pre-registered rules in docs/results.md): GRPO
# from the names warm start on tasks of a seed SFT never used; the primary measure is held-out
# hidden-name success under the base harness at T = 1 (`eval/distinct_heldout/base/hidden/success`).

NAMES_WARMSTART = "assets/testbed_names_warmstart"


def _names_train_base(arm: str) -> ml_collections.ConfigDict:
    c = _train_base(arm)
    c.benchmark.name = "synth_names"
    c.pool = NAMES_POOL
    c.model.hf_dir = NAMES_WARMSTART
    c.data.train_split = NAMES_TRAIN_SPLIT
    c.data.task_seed = 1  # SFT imitated seed 0
    c.eval.split = NAMES_HELDOUT_SPLIT
    # Held-out tasks only: the training-words split doubled the evaluation (6 of an arm's 20
    # minutes); the warm start's score on it is in docs/results.md.
    c.eval.extra_splits = ()
    c.eval.task_seed = 2
    c.eval.limit = 600  # 300 hidden-name tasks
    c.eval.greedy = False  # at the trainer's temperature: a shift from 5% to 30% shows before it is the argmax
    c.eval.temperature = 1.0
    # Steps and learning rate from the one-seed pilot (docs/results.md, "the learning-rate pilot"):
    # 1e-3 collapsed the policy; at 3e-4 an arm's 20 steps, rollouts, update and the final
    # evaluation fit the 20-minute budget.
    c.total_steps = 20
    c.eval.every = 20
    c.rollout.max_context_tokens = 1024
    c.batch.T_buckets = (256, 512, 1024)
    # Multi-turn rows past 512 tokens would pad every row to 1,024: rows are grouped by length.
    c.batch.micro_batches = 4
    c.batch.group_by_length = True
    c.optim.learning_rate = 3e-4
    c.checkpoint.keep = 100  # every checkpoint: the mechanism curves are measured on them afterwards
    return c


def _names_arm(base_arm: str, *, kind: str | None = None, siblings=(), k: int = 0, m: int = 0,
               context: str = "as_generated", is_weight: str = "capped", n: int = 0, router: dict | None = None,
               rescue_advantage: str = "estimator"):
    def arm(_):
        c = _names_train_base(base_arm)
        if kind is not None:
            c.rescue.kind = kind
            c.rescue.siblings = tuple(siblings)
        if k:
            c.rescue.k, c.rescue.m = k, m
        if base_arm == "harness_s":
            c.router.local_voters = ()  # on profiles: the tiny policy as a voter cannot rank harnesses
            c.router.update(router or {})
        c.loss.rescue_context = context
        c.loss.is_weight = is_weight
        c.loss.rescue_advantage = rescue_advantage
        if n:
            c.rollout.n = n
        return c
    return arm


NAMES_ARMS = {
    # tier 1
    "names_policy_only": _names_arm("policy_only"),
    "names_policy_only_n6": _names_arm("policy_only", n=6),  # about Harness-S's executor rollouts
    "names_harness_s": _names_arm("harness_s"),
    "names_harness_s_base": _names_arm("harness_s", context="base", is_weight="one"),
    "names_tables_first": _names_arm("train", kind="fixed", siblings=("tables_first",), k=1, m=4),
    "names_tables_first_base": _names_arm("train", kind="fixed", siblings=("tables_first",), k=1, m=4,
                                          context="base", is_weight="one"),  # the positive control
    "names_schema_reminder": _names_arm("train", kind="fixed", siblings=("schema_reminder",), k=1, m=4),
    "names_base_reroll": _names_arm("train", kind="fixed", siblings=("base_copy",), k=1, m=4),
    # tier 2
    "names_dapo": _names_arm("dapo"),
    "names_random": _names_arm("train", kind="random"),
    "names_tables_first_base_is": _names_arm("train", kind="fixed", siblings=("tables_first",), k=1, m=4,
                                             context="base"),
    # issue 40's router (docs/harness_s.md, "Router"): Thompson draws instead of alphabetical cold-start
    # ties, rescues replayed under the base harness so observation-leaking siblings (schema_reminder)
    # are down-weighted, and the rule voter reading the profile cards beside the profiles.
    "names_harness_s_router": _names_arm("harness_s", router={"selection": "thompson", "validity": "replay",
                                                              "local_voters": ("rule",)}),
    # The same with a validity floor (docs/harness_s.md, "A validity floor"): a sibling whose checked
    # rescues are mostly invalid base trajectories is not chosen at all. v4's claim-(a) treatment,
    # by the rule recorded before its v3 seeds 0 and 2 were read (docs/results.md).
    "names_harness_s_floor": _names_arm("harness_s", router={"selection": "thompson", "validity": "replay",
                                                             "validity_floor": 0.5, "local_voters": ("rule",)}),
    # Claim (b)'s distillation baseline (docs/results.md, "Two claims"): the positive control's
    # rollouts, but its successful hinted rescues trained as SFT in the base context (weight 1, the
    # failed ones dropped) instead of by their group's GRPO advantage.
    "names_sft_hinted": _names_arm("train", kind="fixed", siblings=("tables_first",), k=1, m=4,
                                   context="base", is_weight="one", rescue_advantage="sft"),
}


def _names_warmstart(_):
    """Scores the names warm start once (step 0), like `warmstart`."""
    c = _names_train_base("policy_only")
    c.total_steps = 0
    c.optim.schedule_steps = 10
    c.eval.at_start = True
    return c


TRAIN_ARMS = {
    "warmstart": _warmstart,
    "policy_only": lambda _: _train_base("policy_only"),
    "dapo": lambda _: _train_base("dapo"),
    "hint": lambda _: _train_base("hint"),
    "harness_s": _harness_s_arm(),
    "harness_s_k1": _harness_s_arm(k=1),
    "harness_s_k3": _harness_s_arm(k=3),
    "harness_s_profiles_only": _harness_s_arm(voters=()),
    "harness_s_no_reanchor": _harness_s_arm(reanchor_every=0),
    "random_routing": _random_arm,
    "names_warmstart": _names_warmstart,
    **NAMES_ARMS,
}


def _arm_smoke(c: ml_collections.ConfigDict) -> None:
    """Seconds per arm: the plumbing of an arm on a few tasks (tests, the notebook's CI run)."""
    c.total_steps = 3
    c.optim.warmup_steps = 1
    c.rollout.groups = 2
    c.rollout.n = 2
    c.rollout.max_new_tokens = 16
    c.rescue.m = 1
    c.eval.limit = 4
    c.eval.every = 1
    c.eval.max_new_tokens = 16
    c.checkpoint.every = 1
    c.batch.micro_batches = 1


def _arm_gpu(c: ml_collections.ConfigDict) -> None:
    """The device machine: more steps, bigger groups, a larger evaluation (the warm start is the
    `:sft,gpu` output; docs/results.md, "Not done")."""
    c.total_steps = 100
    c.rollout.groups = 32
    c.rollout.n = 8
    c.eval.limit = 400
    c.eval.every = 10
    c.checkpoint.every = 25
    c.batch.micro_batches = 1
    c.model.dtype = "bfloat16"
    c.model.attention_impl = "cudnn"


# Testbed v3 (docs/results.md, "Testbed v3"): v2's arms from a warm start whose base harness never
# finds a hidden table itself (v2's SFT continued with `regime.show_rate_base = 0`), gated with a
# G3 of its own on 300 tasks a cell.
NAMES_V3_WARMSTART = "assets/testbed_names_v3_warmstart"


def _arm_v3(c: ml_collections.ConfigDict) -> None:
    if c.benchmark.name != "synth_names":
        raise ValueError("the v3 modifier applies to the names_* arms only")
    c.model.hf_dir = NAMES_V3_WARMSTART


def gates_v3_config() -> ml_collections.ConfigDict:
    c = gates_config()
    c.model.hf_dir = NAMES_V3_WARMSTART
    c.gates.tasks_per_cell = 300
    c.gates.g3_opens = (0.0, 0.01)
    c.gates.g3_success = (0.0, 0.0034)  # at most 1 of 300
    return c


# Testbed v4 (docs/testbed.md, "Testbed v4's tasks"; pre-registered in docs/results.md): held-out
# trigger wording and 2-3 tables a database. Its warm starts continue the v3 warm start by SFT on
# v4's tasks at three planted base rates (`sft,names,v4 --config.regime.show_rate_base=R`); they are
# not built yet, so the v4 arms and gates take the warm start from the command line (the sweep's
# --warm, gates' --config.model.hf_dir).
V4_TRAIN_SPLIT, V4_HELDOUT_SPLIT = "v4_train", "v4_heldout"


def _v4_splits(c: ml_collections.ConfigDict) -> None:
    c.data.train_split = V4_TRAIN_SPLIT
    c.eval.split = V4_HELDOUT_SPLIT


def _arm_v4(c: ml_collections.ConfigDict) -> None:
    if c.benchmark.name != "synth_names":
        raise ValueError("the v4 modifier applies to the names_* arms only")
    _v4_splits(c)
    # The endpoint is read at fixed rollout budgets from the checkpoints (studies.testbed.budget_curve):
    # one a step (the sweep's --drop-checkpoints deletes them once measured).
    c.checkpoint.every = 1


def _sft_v4(c: ml_collections.ConfigDict) -> None:
    if c.benchmark.name != "synth_names":
        _names(c)  # v4 is a names regime: `v4` alone is `names,v4`
    _v4_splits(c)
    # v3's recipe: its warm start continued for 300 steps at peak lr 2e-4 on 9,600 fresh tasks
    # (min: `smoke` shrinks them in either order).
    c.sft.init_from = NAMES_V3_WARMSTART
    c.sft.steps = min(c.sft.steps, 300)
    c.sft.num_tasks = min(c.sft.num_tasks, 9600)
    c.data.num_train_tasks = min(c.data.num_train_tasks, 10200)
    c.optim.learning_rate = 2e-4
    c.optim.warmup_steps = min(c.optim.warmup_steps, 20)
    c.regime.show_rate_base = 0.0  # r0; the dose-response warm starts plant 0.01 and 0.05
    c.sft.max_len = 960  # SHOW TABLES + up to three DESCRIBEs: expert streams reach 929 tokens


def gates_v4_config() -> ml_collections.ConfigDict:
    """v4's gates: v3's on v4's splits; G3's bands as v3's (r0), overridden for r1 and r2."""
    c = gates_v3_config()
    c.model.hf_dir = ""  # no v4 warm start ships yet: --config.model.hf_dir=W_sft/hf
    c.gates.heldout_split = V4_HELDOUT_SPLIT
    c.gates.train_split = V4_TRAIN_SPLIT
    return c


VARIANTS["v4"] = _sft_v4  # after `names`: sft,names,v4


# The API regime (docs/testbed.md, "The API regime"; issue 40's second regime): AppWorld's protocol in
# the offline world, each task with an app of its own whose API name half of the tasks withhold;
# docs_first (a hint) asks to list the app's APIs first, api_list shows them after a failed guess.
APIS_POOL = "harness_envs/pools/testbed_apis.json"
APIS_TRAIN_SPLIT, APIS_HELDOUT_SPLIT = "apis_train", "apis_heldout"


def _apis_benchmark() -> ml_collections.ConfigDict:
    b = experiments.load("appworld").benchmark()
    b.name = "synth_apis"
    return b


def _sft_apis(c: ml_collections.ConfigDict) -> None:
    """The API regime's warm start: the v3 names warm start, which copies coined names token for
    token (the skill a hidden API's name needs), continued by SFT on this regime's expert episodes,
    never looking an API up under base (`regime.show_rate_base = 0`, as v3)."""
    _names(c)  # the names regime's tokenizer, copy replay and evaluation settings
    c.benchmark = _apis_benchmark()
    c.pool = APIS_POOL
    c.data.train_split = APIS_TRAIN_SPLIT
    c.eval.split = APIS_HELDOUT_SPLIT
    c.regime.kind = "apis"
    c.regime.show_rate_base = 0.0
    c.sft.init_from = NAMES_V3_WARMSTART
    # A new protocol (Python cells, not SQL lines): the names SFT rate with copy replay, 400 steps of
    # 32 fresh tasks (min: `smoke` shrinks them in either order). Streams reach ~800 tokens (the
    # api_list recovery: a traceback, then the app's signatures).
    c.sft.steps = min(c.sft.steps, 400)
    c.sft.num_tasks = min(c.sft.num_tasks, 12800)
    c.data.num_train_tasks = min(c.data.num_train_tasks, 13400)
    c.optim.warmup_steps = min(c.optim.warmup_steps, 20)
    c.sft.max_len = 960
    c.eval.harnesses = ("base", "docs_first", "api_list")
    c.eval.per_type = 0  # one task type: the gates (`gates,apis`) measure the warm start


def gates_apis_config() -> ml_collections.ConfigDict:
    """The API regime's gates: v3's (G3: never opens with the API list, succeeds in at most 1 of 300)
    with docs_first for tables_first and api_list for schema_reminder; the warm start from the
    command line (--config.model.hf_dir=W_sft/hf)."""
    c = gates_v3_config()
    c.benchmark = _apis_benchmark()
    c.pool = APIS_POOL
    c.model.hf_dir = ""
    c.gates.regime = "apis"
    c.gates.heldout_split = APIS_HELDOUT_SPLIT
    c.gates.train_split = APIS_TRAIN_SPLIT
    c.gates.max_new_tokens = 96  # a guessed call in a fence is ~50 tokens
    return c


VARIANTS["apis"] = _sft_apis  # sft,apis
# The names arms' parts in the API regime (studies/testbed/lookup.py).
APIS_SIBLINGS = {"tables_first": "docs_first", "schema_reminder": "api_list"}


def _arm_apis(c: ml_collections.ConfigDict) -> None:
    """A names_* arm in the API regime: its benchmark, pool, splits and siblings; the warm start from
    the command line (the sweep's --warm; none ships), a checkpoint a step for the budget curve."""
    if c.benchmark.name != "synth_names":
        raise ValueError("the apis modifier applies to the names_* arms only")
    c.benchmark = _apis_benchmark()
    c.pool = APIS_POOL
    c.model.hf_dir = ""
    c.data.train_split, c.eval.split = APIS_TRAIN_SPLIT, APIS_HELDOUT_SPLIT
    c.rescue.siblings = tuple(APIS_SIBLINGS.get(s, s) for s in c.rescue.siblings)
    c.rollout.max_new_tokens = c.eval.max_new_tokens = 96  # a guessed call in a fence is ~57 tokens
    c.checkpoint.every = 1

ARM_MODIFIERS = {"smoke": _arm_smoke, "gpu": _arm_gpu, "v3": _arm_v3, "v4": _arm_v4, "apis": _arm_apis}


def names_rank1_config(smoke: bool = False) -> ml_collections.ConfigDict:
    """Rank-1 on the names regime (mode rank1, hsjax/harness_s/rank1.py): per held-out task the
    router picks one harness of the names pool, beside the base harness at equal executor rollouts
    (2 a task: a base probe, then the router's choice given the probe's failure mode).

    The policy is the v3 warm start; `--config.policy.checkpoint=W_run` plays a trained run's last
    checkpoint and `--config.rank1.profiles=W_run/profiles.json` reuses that run's trained router
    (rescue rates by task type and base failure mode, re-anchored during training). Without
    profiles they are fitted on `rank1.profile_limit` training-words tasks, every harness once.
    Both splits are read at task seed 0: the gates' held-out tasks, SFT's training tasks."""
    c = experiments.load("evolve").rank1_config()
    c.name = "names_rank1"
    c.benchmark = common.benchmark("synth_names")
    c.policy = common.policy("jax")
    c.policy.hf_dir = NAMES_V3_WARMSTART
    c.policy.checkpoint = NAMES_V3_WARMSTART
    c.sampling = common.sampling(greedy=False, temperature=1.0, max_new_tokens=64)  # the trainer's T
    c.runner = common.runner(batch_size=256, max_context_tokens=1024)
    c.rank1.pool = NAMES_POOL
    c.rank1.split = NAMES_HELDOUT_SPLIT
    c.rank1.limit = 150  # 72 hidden-name tasks; 600 episodes, about 5 minutes on the 2-core CPU
    c.rank1.profile_split = NAMES_TRAIN_SPLIT
    c.rank1.profile_limit = 60  # x 8 harnesses: 480 episodes
    c.rank1.rollouts = 2
    c.rank1.probe = "base"
    if smoke:
        c.rank1.limit, c.rank1.profile_limit = 8, 2  # tasks 0-5 show the table name, 6-7 hide it
    return c


# Variants that build a config of their own, before the tables below are read (`gates,v3` and
# `names_rank1,smoke` combine); listed for `run.py --help`.
STANDALONE_VARIANTS = ("demo", "gates", "names_rank1")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variants = common.variants(arg)
    if variants == ["demo"]:
        return demo_config()
    if variants == ["gates"]:
        return gates_config()
    if sorted(variants) == ["gates", "v3"]:
        return gates_v3_config()
    if sorted(variants) == ["gates", "v4"]:
        return gates_v4_config()
    if sorted(variants) == ["apis", "gates"]:
        return gates_apis_config()
    if variants and variants[0] == "names_rank1":
        if set(variants[1:]) - {"smoke"}:
            raise ValueError(f"names_rank1 combines with 'smoke' only, got {variants[1:]}")
        return names_rank1_config(smoke="smoke" in variants)
    arms = [v for v in variants if v in TRAIN_ARMS]
    if len(arms) > 1:
        raise ValueError(f"name one training arm, got {arms}")
    if arms:
        c = TRAIN_ARMS[arms[0]](None)
        for variant in variants:
            if variant in ARM_MODIFIERS:
                ARM_MODIFIERS[variant](c)
            elif variant not in TRAIN_ARMS:
                raise ValueError(f"{variant!r} does not combine with the training arm {arms[0]!r}; "
                                 f"modifiers: {sorted(ARM_MODIFIERS)}")
        if arms[0] in ("warmstart", "names_warmstart"):
            c.total_steps = 0  # modifiers size the training arms; the warm start is only scored
        return c
    c = base_config()
    for variant in variants:
        if variant not in VARIANTS:
            raise ValueError(f"unknown experiments/testbed.py variant {variant!r}; known: {sorted(VARIANTS)}")
        VARIANTS[variant](c)
    return c
