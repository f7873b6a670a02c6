"""The copy base (`config.mode = 'copy_base'`): the copy warm-up alone, saved as the model directory
the names regime's SFT starts from (`sft.init_from`).

    python run.py --config experiments/testbed.py:copy_base,names --workdir W

A real policy comes to RL pretrained; the testbed's tiny one starts from random weights, and the
copy warm-up (`copy_warmup`) stands in for the part of pretraining the names regime needs: copying
a word from anywhere in the context. It knows nothing of SQL, harnesses or the tasks, takes about
an hour on two CPU cores, and is the same for every SFT mix, so it runs once, apart from SFT, and a
passing one ships (`assets/`); every SFT of the regime starts from it instead of repeating it.

  model     the preset (with the config's overrides) from random weights, `model.tokenizer`; or
            the model directory `sft.copy_base_from` (an earlier copy base the warm-up continues);
  loop      `sft.copy_warmup_steps` + `sft.copy_far_steps` steps of `copy_warmup.warm_up` on
            rows of `sft.copy_style`;
            `metrics.jsonl` rows of the two row kinds' losses; an orbax checkpoint of params and
            optimizer state every `sft.save_every` steps: the same command resumes exactly (each
            step's rows are drawn from the seed and the step alone);
  save      `W/hf` (`save_pretrained`; `sft.init_from=W/hf` starts an SFT from it) and
            `W/copy_warmup.json`: the losses and the three tables (`copy_warmup.gap_tables`): first
            copy at the row's start and 150 tokens in, and among held-out prose. All low means the
            policy looks words up wherever they stand.
"""
from __future__ import annotations

import os

from hsjax.infra import checkpoint as ckpt_lib
from hsjax.infra import console
from hsjax.infra import metrics as metrics_lib
from hsjax.infra import tracking
from hsjax.infra.errors import UserError
from hsjax.models import save_pretrained
from hsjax.models.tokenizer import tiny_tokenizer
from studies.testbed import copy_warmup
from studies.testbed.warmstart import build_model


TABLE_EVERY = 100  # steps between the gap tables a run prints: a few seconds each on two CPU cores


def unread(config) -> dict[str, str]:
    """{key: why} for the blocks and keys of the testbed config the warm-up never reads."""
    why = "copy_base runs the copy warm-up only"
    keys = ["benchmark", "pool", "data", "regime", "optim", "eval", "sft.init_from", "sft.num_tasks", "sft.steps",
            "sft.max_len", "sft.env_workers", "sft.copy_replay_every"]
    out = {key: why for key in keys if key.split(".")[0] in config}
    if config.sft.copy_base_from:
        out.update({key: "sft.copy_base_from is set: the model's shape is the directory's"
                    for key in ("model.overrides", "model.preset")})
    if not config.sft.copy_far_steps:
        out["sft.copy_far_tokens"] = "sft.copy_far_steps=0: no gap copy rows"
    return out


def main(config, workdir: str) -> dict:
    sft = config.sft
    total = sft.copy_warmup_steps + sft.copy_far_steps
    if total <= 0:
        raise UserError("copy_base runs the copy warm-up: set sft.copy_warmup_steps or sft.copy_far_steps")
    tokenizer = tiny_tokenizer(config.model.tokenizer)
    # From a model directory, the warm-up continues an earlier copy base (v11 continued v10 on
    # context rows: docs/results.md); else from random weights.
    cfg, params = build_model(config, tokenizer, key="copy_base_from")
    opt_state = copy_warmup.warmup_optimizer(sft.copy_warmup_lr, total).init(params)

    checkpointer = ckpt_lib.Checkpointer(workdir, keep=1)
    writer = tracking.metric_writer(workdir, tensorboard=config.log.tensorboard)
    start = 0
    restored = checkpointer.restore_latest({"params": params, "opt_state": opt_state})
    if restored is not None:
        start, params, opt_state = restored.step, restored.state["params"], restored.state["opt_state"]
        console.say(f"resumed from step {start}")
    writer.truncate_after(start)

    pending = {}  # a step's report lines, one per row kind, become one metrics row

    def on_report(kind, step, steps, loss):
        pending[f"loss/copy_{kind}"] = loss
        console.say(f"copy warm-up {step}/{steps} | {kind} rows | loss {loss:.3g}")

    def on_tables(done, tables):
        pending.update({f"copy/{name}/{gap}": nats for name, table in tables.items() for gap, nats in table.items()})
        for line in copy_warmup.gap_lines(tables):
            console.say(f"step {done}: {line}")

    def on_step(done, p, o):
        if pending:
            writer.write(done, pending)
            pending.clear()
        if done % sft.save_every == 0 or done == total:
            checkpointer.save(done, {"params": p, "opt_state": o})

    params, report = copy_warmup.warm_up(
        cfg, params, tokenizer, steps=sft.copy_warmup_steps, batch_size=sft.batch_size,
        learning_rate=sft.copy_warmup_lr, seed=config.seed, far_steps=sft.copy_far_steps,
        far_tokens=sft.copy_far_tokens if sft.copy_far_steps else 0, report_every=config.log.every,
        on_report=on_report, start=start, opt_state=opt_state, on_step=on_step, table_every=TABLE_EVERY,
        on_tables=on_tables, table_rows=sft.copy_table_rows, style=sft.copy_style)
    report.update(copy_warmup.gap_tables(cfg, params, tokenizer, sft.copy_table_rows))
    checkpointer.close()
    writer.close()
    hf_dir = os.path.join(workdir, "hf")
    save_pretrained(params, cfg, tokenizer, hf_dir)
    metrics_lib.write_json(os.path.join(workdir, "copy_warmup.json"), report)
    for line in copy_warmup.gap_lines(report):
        console.say(line)
    console.say(f"wrote {hf_dir} (SFT from it: --config.sft.init_from={hf_dir})")
    return report
