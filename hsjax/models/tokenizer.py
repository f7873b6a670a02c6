"""Tokenizers: a tiny byte-level BPE trained offline on a shipped corpus, and local HF loading.

The tiny tokenizer stands in for a real checkpoint's tokenizer in tests and CPU smoke runs. It
uses the same conventions as Qwen2 (ChatML turns, `<|endoftext|>` as document eos and pad,
`<|im_end|>` ending chat turns), so code written against it runs unchanged on a real model.

Training 512 merges on the shipped corpus takes a few tens of milliseconds, so the result is not
cached on disk: every call rebuilds it, which keeps it deterministic and free of stale caches.
"""

from __future__ import annotations

import json
import os
import pathlib

import tokenizers
import transformers
from tokenizers import decoders, models, pre_tokenizers, trainers

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)

# ChatML, as in Qwen2 but without the default system message.
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)

CORPUS_PATH = pathlib.Path(__file__).resolve().parent.parent / "assets" / "tokenizer_corpus.txt"

# The byte alphabet plus the special tokens must fit.
_MIN_VOCAB = 256 + len(SPECIAL_TOKENS)


def _train_bpe(corpus_path: pathlib.Path, vocab_size: int) -> tokenizers.Tokenizer:
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    with open(corpus_path, encoding="utf-8") as f:
        lines = f.read().splitlines(keepends=True)
    tok.train_from_iterator(lines, trainer=trainer, length=len(lines))
    return tok


def build_tiny_tokenizer(
    out_dir: str | os.PathLike | None = None,
    vocab_size: int = 512,
    corpus_path: str | os.PathLike | None = None,
) -> transformers.PreTrainedTokenizerFast:
    """Trains the tiny byte-level BPE tokenizer; with `out_dir`, saves it in HF format there.

    The same corpus and vocab_size always give the same vocabulary and merges.
    """
    if vocab_size < _MIN_VOCAB:
        raise ValueError(
            f"vocab_size={vocab_size} is too small for a byte-level tokenizer: it needs at least "
            f"{_MIN_VOCAB} (256 bytes + {len(SPECIAL_TOKENS)} special tokens).")
    corpus = pathlib.Path(corpus_path) if corpus_path is not None else CORPUS_PATH
    if not corpus.is_file():
        raise FileNotFoundError(
            f"Tokenizer corpus {corpus} not found; it ships as hsjax/assets/tokenizer_corpus.txt.")
    hf_tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=_train_bpe(corpus, vocab_size),
        eos_token=ENDOFTEXT,
        pad_token=ENDOFTEXT,
        unk_token=None,
        bos_token=None,
        additional_special_tokens=[IM_START, IM_END],
        chat_template=CHATML_TEMPLATE,
        model_max_length=1 << 20,
        clean_up_tokenization_spaces=False,
    )
    if out_dir is not None:
        save_tokenizer(hf_tok, out_dir)
    return hf_tok


def save_tokenizer(tokenizer: transformers.PreTrainedTokenizerFast, out_dir: str | os.PathLike):
    """Saves `tokenizer.json`, `tokenizer_config.json` (with `chat_template`) and
    `special_tokens_map.json`, the files older and newer HF loaders both read."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # Keep the template inside tokenizer_config.json rather than a separate chat_template.jinja.
    tokenizer.save_pretrained(str(out), save_jinja_files=False)
    special_map = {"eos_token": tokenizer.eos_token, "pad_token": tokenizer.pad_token}
    extra = [t for t in SPECIAL_TOKENS if t in tokenizer.get_vocab() and t != tokenizer.eos_token]
    if extra:
        special_map["additional_special_tokens"] = extra
    with open(out / "special_tokens_map.json", "w", encoding="utf-8") as f:
        json.dump(special_map, f, indent=2)


def load_tokenizer(hf_dir: str | os.PathLike) -> transformers.PreTrainedTokenizerFast:
    """Loads a tokenizer from a local HF directory, never touching the network."""
    path = pathlib.Path(hf_dir)
    if not (path / "tokenizer.json").is_file():
        raise FileNotFoundError(
            f"{path / 'tokenizer.json'} not found: point to a local HF model or tokenizer directory "
            "(build one with hsjax.models.tokenizer.build_tiny_tokenizer(out_dir)).")
    # Not AutoTokenizer: beside a qwen2 config.json it builds a Qwen2Tokenizer whose own
    # pre-tokenizer changes the ids of any other vocabulary; tokenizer.json alone is the truth.
    return transformers.PreTrainedTokenizerFast.from_pretrained(str(path), local_files_only=True)


def eos_ids(tokenizer) -> list[int]:
    """Token ids that end a generation: the tokenizer's eos, then `<|im_end|>` and `<|endoftext|>`
    when the vocabulary has them (a Qwen2 chat model may emit either)."""
    ids = []
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    vocab = tokenizer.get_vocab()
    for tok in (IM_END, ENDOFTEXT):
        if tok in vocab and vocab[tok] not in ids:
            ids.append(int(vocab[tok]))
    if not ids:
        raise ValueError(
            "Tokenizer has neither an eos_token nor <|im_end|>/<|endoftext|>; set eos_token on it.")
    return ids


def chat_token_ids(tokenizer, messages: list[dict], add_generation_prompt: bool = False) -> list[int]:
    """The ChatML-rendered ids of `messages` as a plain list (no BatchEncoding wrapper)."""
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    return tokenizer.encode(text, add_special_tokens=False)
