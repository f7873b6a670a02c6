"""Converts a GGUF checkpoint into a local Hugging Face directory that hsjax and transformers read.

    python scripts/gguf_to_hf.py GGUF_FILE OUT_DIR

transformers parses the GGUF (architecture, tokenizer, chat template) and dequantises its weights
to float32; this writes them back as `model.safetensors` + `config.json` + tokenizer files +
`generation_config.json` (eos and pad ids, so `generate` stops at the end of a chat turn).
Used by scripts/fetch_smollm2.sh; needs `gguf` and `accelerate` (requirements-test.txt).
"""
from __future__ import annotations

import json
import pathlib
import shutil
import sys


def convert(gguf_path: pathlib.Path, out: pathlib.Path) -> None:
    import torch
    import transformers

    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    if not tokenizer.chat_template:
        raise ValueError(f"{gguf_path} has no chat template in its metadata (tokenizer.chat_template).")
    quantised = transformers.AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.float32
    )
    # A GGUF-loaded model refuses save_pretrained (it keeps its quantisation config); its weights are
    # already dequantised, so they move into a plain model of the same config.
    config = quantised.config
    del config.quantization_config
    config.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else config.eos_token_id
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(quantised.state_dict(), strict=False)
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"Weights from {gguf_path} do not fit the model: missing {missing}, "
                         f"unexpected {unexpected}.")
    model.tie_weights()
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    )
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    with open(tmp / "source.json", "w", encoding="utf-8") as f:
        json.dump({"gguf_file": name, "dequantised_to": "float32"}, f, indent=2)
    for f in tmp.iterdir():  # safetensors alone would leave the weights 0600
        f.chmod(0o644)
    tmp.rename(out)  # only a complete directory gets the final name


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__.split("\n\n")[1].strip())
    convert(pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]))
