"""Export mode: a checkpoint as a Hugging Face model directory that standard loaders read unchanged.

    python run.py --config experiments/export.py --config.export.checkpoint=W_train --workdir W_export

`export.checkpoint` is a training workdir (or its `checkpoints/` directory: the latest checkpoint,
or `export.step`), in the model config and tokenizer the run used
(`hsjax.infra.model_loading.load_model`; `export.hf_dir` names them instead, for a workdir without a
run config), or an HF directory (re-exported, e.g. to change the dtype). Writes `export.out_dir`
(default `<workdir>/hf`) with `hsjax.models.save_pretrained`: config.json and generation_config.json with bos/eos/pad ids,
model.safetensors in `export.dtype` (default: the params' own), the tokenizer files; every file
mode 0644 under the usual umask.

Then checks what a user of the directory gets: the weights read back equal the checkpoint's (in the
exported dtype), and `transformers.AutoTokenizer` on the directory gives the project's ids on a
rendered conversation and the tokenizer corpus (for the `tiny` tokenizer beside a qwen2 model
that takes the auto_map `write_hf_tokenizer` adds: docs/models.md, "Tokenizers and
AutoTokenizer"); a warning says so when it does not. Results go to `<workdir>/export.json`.
"""
from __future__ import annotations

import json
import logging
import pathlib

import jax
import numpy as np

from hsjax.infra import console, model_loading
from hsjax.infra.errors import UserError
from hsjax.models import load_pretrained, save_pretrained
from hsjax.models.tokenizer import CORPUS_PATH

log = logging.getLogger(__name__)

DTYPES = ("", "float32", "bfloat16")
PROBE_MESSAGES = [{"role": "system", "content": "You are a SQL agent."},
                  {"role": "user", "content": "How many orders did customer 1042 place in 2023? Table: orders."},
                  {"role": "assistant", "content": "Action: Operation\n```sql\nSELECT COUNT(*) FROM orders "
                                                   "WHERE customer_id = 1042 AND year = 2023;\n```"}]


def probe_texts(tokenizer) -> list[str]:
    """What the AutoTokenizer check encodes: a rendered conversation and the tokenizer corpus."""
    rendered = tokenizer.apply_chat_template(PROBE_MESSAGES, tokenize=False, add_generation_prompt=True)
    return [rendered, *CORPUS_PATH.read_text(encoding="utf-8").splitlines()[:2000]]


def auto_tokenizer_check(out_dir: pathlib.Path, tokenizer) -> dict:
    """{class, same_ids, differing, checked}: `AutoTokenizer.from_pretrained(out_dir)` vs the project's
    tokenizer on `probe_texts`."""
    import transformers

    auto = transformers.AutoTokenizer.from_pretrained(str(out_dir), local_files_only=True)
    texts = probe_texts(tokenizer)
    differing = [t for t in texts if auto.encode(t, add_special_tokens=False)
                 != tokenizer.encode(t, add_special_tokens=False)]
    return {"class": type(auto).__name__, "transformers": transformers.__version__, "checked": len(texts),
            "differing": len(differing), "same_ids": not differing,
            "first_difference": differing[0][:200] if differing else None}


def main(config, workdir: str) -> dict:
    e = config.export
    if not e.checkpoint:
        raise UserError("export needs --config.export.checkpoint=<training workdir, its checkpoints/ directory, "
                        "or an HF directory>")
    if e.dtype not in DTYPES:
        raise UserError(f"export.dtype={e.dtype!r} is not one of {DTYPES[1:]} (or empty: the params' own)")
    if int(e.step) < 0:
        raise UserError(f"export.step={e.step} must be >= 0 (0: the latest checkpoint)")
    out = pathlib.Path(e.out_dir) if e.out_dir else pathlib.Path(workdir) / "hf"
    if out.exists() and any(out.iterdir()):
        raise UserError(f"{out} exists and is not empty; choose another export.out_dir (or --workdir), or remove it")
    cfg, params, tokenizer, source = model_loading.load_model(e.checkpoint, e.hf_dir, int(e.step) or None)
    dtype = e.dtype or cfg.param_dtype
    save_pretrained(params, cfg, tokenizer, out, dtype=dtype)

    # What a user of the directory gets: the same weights, and the tokenizer AutoTokenizer builds.
    _, loaded, _ = load_pretrained(out, param_dtype=dtype)
    for (key, a), b in zip(jax.tree_util.tree_leaves_with_path(loaded), jax.tree.leaves(params)):
        a, b = np.asarray(a), np.asarray(jax.device_get(b)).astype(np.asarray(a).dtype)
        if not np.array_equal(a.astype(np.float32), b.astype(np.float32)):
            raise RuntimeError(f"{out}: {jax.tree_util.keystr(key)} read back differs from the checkpoint's; this "
                               "is a bug in hsjax.models.hf (params_to_hf / params_from_hf)")
    auto = auto_tokenizer_check(out, tokenizer)
    step = int(e.step) or max(model_loading.checkpoint_steps(e.checkpoint), default=None)
    result = {"checkpoint": str(e.checkpoint), "step": step, "model_from": source or "preset",
              "out_dir": str(out), "dtype": str(dtype), "family": cfg.family, "params": cfg.num_params,
              "auto_tokenizer": auto}
    (pathlib.Path(workdir) / "export.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    at = f" step {step}" if step is not None else ""
    console.say(f"exported {e.checkpoint}{at} -> {out} ({cfg.family}, {cfg.num_params / 1e6:.2f}M params, {dtype})")
    if auto["same_ids"]:
        console.say(f"AutoTokenizer ({auto['class']}, transformers {auto['transformers']}) gives the project's ids "
                    f"on all {auto['checked']} probe texts")
    else:
        log.warning("AutoTokenizer (%s, transformers %s) gives other ids than the project's tokenizer on %d of %d "
                    "probe texts. Load the tokenizer with transformers.PreTrainedTokenizerFast.from_pretrained(%r), "
                    "or send token ids (policy.kind=http_tokens; vLLM's /v1/completions with a token-id prompt) "
                    "(docs/models.md, 'Tokenizers and AutoTokenizer')", auto["class"], auto["transformers"],
                    auto["differing"], auto["checked"], str(out))
    return result
