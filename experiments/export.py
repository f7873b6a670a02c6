"""Export a checkpoint as a Hugging Face model directory (mode `export`, hsjax/modes/export.py).

    # the latest checkpoint of a training (or SFT) workdir, in the model and tokenizer the run used
    python run.py --config experiments/export.py --config.export.checkpoint=/tmp/hsjax/train --workdir /tmp/hsjax/export
    # a given step, in bfloat16, to a chosen directory
    python run.py --config experiments/export.py --config.export.checkpoint=/tmp/hsjax/train \
        --config.export.step=400 --config.export.dtype=bfloat16 --config.export.out_dir=/ckpt/policy-400 \
        --workdir /tmp/hsjax/export400

Then `transformers.AutoModelForCausalLM.from_pretrained(out)`, `vllm serve out`, or
`--config.model.hf_dir=out` / `--config.serve.checkpoint=out` load it (docs/models.md).

Seen (a 2-step `experiments/dbbench.py:smoke` workdir, tiny preset, shared 2-core CPU under load): 9 s
for the command; `<workdir>/export.json` says AutoTokenizer gives the project's ids on all 605 probe
texts (`TokenizersBackend` through the auto_map; 78 of them differed before it, under `Qwen2Tokenizer`).
"""
from __future__ import annotations

import ml_collections


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    if arg:
        raise ValueError(f"experiments/export.py takes no variant, got {arg!r}")
    c = ml_collections.ConfigDict()
    c.mode = "export"
    c.seed = 0
    c.export = ml_collections.ConfigDict()
    c.export.checkpoint = ""  # a training workdir, its checkpoints/ directory, or an HF directory (required)
    c.export.step = 0  # the checkpoint step of a workdir; 0 = the latest
    # the HF directory of the model config and tokenizer of a workdir's params; empty = the run's own
    # (its config.json model block)
    c.export.hf_dir = ""
    c.export.dtype = ""  # float32 | bfloat16; empty = the params' own (the run's model.param_dtype)
    c.export.out_dir = ""  # empty = <workdir>/hf; must not exist or be empty
    return c
