"""Tokenizers: a tiny byte-level BPE trained offline on a shipped corpus, and local HF loading.

The tiny tokenizer stands in for a real checkpoint's tokenizer in tests and CPU smoke runs. It
uses the same conventions as Qwen2 (ChatML turns, `<|endoftext|>` as document eos and pad,
`<|im_end|>` ending chat turns), so code written against it runs unchanged on a real model.

Training 512 merges on the shipped corpus takes a few tens of milliseconds, so the result is not
cached on disk: every call rebuilds it, which keeps it deterministic and free of stale caches.

Three tiny tokenizers (`TINY_TOKENIZERS`, chosen by `model.tokenizer` in the configs):

* `tiny` (the default; every shipped warm start was trained on its ids): GPT-2's byte-level
  pre-tokenizer. transformers 5's `AutoTokenizer` on a qwen2 model directory builds a
  `Qwen2Tokenizer`, which rebuilds the pipeline with Qwen2's normalizer and pre-tokenizer and so
  gives other ids (Qwen2 splits digits one by one and a space off a digit: 35% of the shipped warm
  start's SFT streams change). `write_hf_tokenizer` therefore writes, beside such a model, an
  `auto_map` entry and a ten-line `tokenization_hsjax.py` that keep AutoTokenizer on
  tokenizer.json: the ids are the project's under transformers 5 (with or without
  trust_remote_code) and 4.
* `tiny_qwen2` (opt-in, for new runs): the same corpus and vocabulary size trained under Qwen2's own
  normalizer and pre-tokenizer, so `Qwen2Tokenizer` gives exactly its ids with no auto_map and no
  code file.
* `tiny_words` (the testbed's names regime): a word (a run of letters, or of digits) is a
  pre-token of its own, never joined to the space or punctuation before it, so a word has one
  tokenization wherever it stands; and every lowercase consonant-vowel syllable is one token (its
  first 105 merges), so a name coined from syllables is one token a syllable. Under `tiny`,
  `mobigu` is `[' mo', 'b', ...]` after a space and `['m', 'o', 'b', ...]` after a comma or a
  quote; of the 1,040 coined names in the prompts, gold SQL and SHOW TABLES results of 200
  training tasks, 335 were spelled with more than one token sequence, so copying a name from the
  prompt into SQL was a re-spelling, not a copy. Here it is token for token (0 of 1,040), one
  token a syllable: `['mo', 'bi', 'gu']` (docs/results.md, "Testbed v2").

docs/models.md, "Tokenizers and AutoTokenizer", has the measurements.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import TYPE_CHECKING

import tokenizers
from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, trainers

if TYPE_CHECKING:
    import transformers

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

# Qwen2's split rule, as `transformers.Qwen2Tokenizer` installs it (whatever tokenizer.json says).
QWEN2_PRETOKENIZE_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                           r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
# Words apart from what precedes them: letter runs, digit runs, and runs of everything else.
WORDS_PRETOKENIZE_REGEX = r"\p{L}+|\p{N}+|[^\p{L}\p{N}]+"
# `tiny_words` learns these merges first: lowercase consonant + vowel (105 of its 253 merges).
CV_SYLLABLES = tuple(c + v for c in "bcdfghjklmnpqrstvwxyz" for v in "aeiou")
_SYLLABLE_REPEATS = 500
PRETOKENIZERS = ("gpt2", "qwen2", "words")
# config name (`model.tokenizer`) -> pre-tokenizer of the tiny tokenizer
TINY_TOKENIZERS = {"tiny": "gpt2", "tiny_qwen2": "qwen2", "tiny_words": "words"}


def _qwen2_reference() -> tokenizers.Tokenizer:
    tok = tokenizers.Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return tok


def _train_bpe(corpus_path: pathlib.Path, vocab_size: int, pretokenizer: str) -> tokenizers.Tokenizer:
    tok = tokenizers.Tokenizer(models.BPE())
    if pretokenizer == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    elif pretokenizer == "words":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(WORDS_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:  # qwen2: NFC, then Qwen2's regex, then bytes (exactly Qwen2Tokenizer's pipeline)
        reference = _qwen2_reference()
        tok.normalizer, tok.pre_tokenizer = reference.normalizer, reference.pre_tokenizer
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
    if pretokenizer == "words":
        # Every consonant-vowel syllable first, each counted more often than any pair of the corpus
        # (430 at most), so each is one token and a word made of syllables is one token a syllable.
        lines = [" ".join(CV_SYLLABLES) + "\n"] * _SYLLABLE_REPEATS + lines
    tok.train_from_iterator(lines, trainer=trainer, length=len(lines))
    return tok


def build_tiny_tokenizer(
    out_dir: str | os.PathLike | None = None,
    vocab_size: int = 512,
    corpus_path: str | os.PathLike | None = None,
    pretokenizer: str = "gpt2",
) -> transformers.PreTrainedTokenizerFast:
    """Trains the tiny byte-level BPE tokenizer; with `out_dir`, saves it in HF format there.

    The same corpus, vocab_size and pretokenizer always give the same vocabulary and merges.
    `pretokenizer`: "gpt2" (the `tiny` tokenizer), "qwen2" (`tiny_qwen2`) or "words" (`tiny_words`;
    module docstring).
    """
    if pretokenizer not in PRETOKENIZERS:
        raise ValueError(f"pretokenizer={pretokenizer!r} is not one of {PRETOKENIZERS}")
    if vocab_size < _MIN_VOCAB:
        raise ValueError(
            f"vocab_size={vocab_size} is too small for a byte-level tokenizer: it needs at least "
            f"{_MIN_VOCAB} (256 bytes + {len(SPECIAL_TOKENS)} special tokens).")
    corpus = pathlib.Path(corpus_path) if corpus_path is not None else CORPUS_PATH
    if not corpus.is_file():
        raise FileNotFoundError(
            f"Tokenizer corpus {corpus} not found; it ships as hsjax/assets/tokenizer_corpus.txt.")
    import transformers  # heavy: imported where a tokenizer object is built

    hf_tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=_train_bpe(corpus, vocab_size, pretokenizer),
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


def tiny_tokenizer(name: str = "tiny") -> transformers.PreTrainedTokenizerFast:
    """The tiny tokenizer a config names (`model.tokenizer`: one of `TINY_TOKENIZERS`)."""
    if name not in TINY_TOKENIZERS:
        raise ValueError(f"model.tokenizer={name!r} is not one of {sorted(TINY_TOKENIZERS)} (the tiny tokenizers; "
                         "a real model's tokenizer comes with its model.hf_dir)")
    return build_tiny_tokenizer(pretokenizer=TINY_TOKENIZERS[name])


# Written beside a qwen2 model whose tokenizer does not split as Qwen2's (module docstring): named in
# tokenizer_config.json's auto_map, it keeps transformers 5's AutoTokenizer on tokenizer.json.
FROM_FILE_MODULE = "tokenization_hsjax"
FROM_FILE_SOURCE = '''"""This directory's tokenizer exactly as tokenizer.json defines it (written by hsjax).

transformers 5 builds a Qwen2Tokenizer for every qwen2 model directory and gives it Qwen2's own
normalizer and pre-tokenizer, which split this vocabulary's text differently (other token ids).
tokenizer_config.json's auto_map names this class, so AutoTokenizer loads tokenizer.json as it is:
without trust_remote_code transformers skips the class and loads tokenizer_config.json's
tokenizer_class (PreTrainedTokenizerFast); with it, it loads this subclass, which adds nothing.
"""
from transformers import PreTrainedTokenizerFast


class TokenizerFromFile(PreTrainedTokenizerFast):
    """PreTrainedTokenizerFast: tokenizer.json as saved."""
'''


def _pipeline(tokenizer) -> tuple:
    """(normalizer, pre-tokenizer) of a fast tokenizer as JSON, without `trim_offsets` (which moves
    offsets, never ids)."""
    def strip(node):
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if k != "trim_offsets"}
        return [strip(v) for v in node] if isinstance(node, list) else node

    backend = json.loads(tokenizer.to_str() if isinstance(tokenizer, tokenizers.Tokenizer)
                         else tokenizer.backend_tokenizer.to_str())
    return strip(backend.get("normalizer")), strip(backend.get("pre_tokenizer"))


def splits_as_qwen2(tokenizer) -> bool:
    """Whether `tokenizer` normalizes and pre-tokenizes exactly as transformers' `Qwen2Tokenizer`
    rebuilds it (NFC, Qwen2's split regex, bytes): then AutoTokenizer on a qwen2 directory keeps its ids."""
    return _pipeline(tokenizer) == _pipeline(_qwen2_reference())


def write_hf_tokenizer(tokenizer, out_dir: str | os.PathLike, model_type: str | None = None) -> None:
    """`tokenizer.save_pretrained(out_dir)` in the form transformers 4 and 5 both load (and so vLLM
    on either), giving the tokenizer's own ids:

    * the chat template inside `tokenizer_config.json` (not a separate chat_template.jinja);
    * `tokenizer_class` `PreTrainedTokenizerFast` where transformers 5 writes `TokenizersBackend`,
      and the special-token list as `additional_special_tokens` where it writes
      `extra_special_tokens`: transformers 4.57's AutoTokenizer fails on either ("Tokenizer class
      TokenizersBackend does not exist", "'list' object has no attribute 'keys'");
    * beside a `model_type` qwen2 model whose tokenizer does not split as Qwen2's (the `tiny`
      tokenizer), an `auto_map` naming `tokenization_hsjax.TokenizerFromFile` (written here), so
      transformers 5's AutoTokenizer loads tokenizer.json instead of rebuilding a `Qwen2Tokenizer`
      with other ids (module docstring; docs/models.md, "Tokenizers and AutoTokenizer")."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(out), save_jinja_files=False)
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    if config.get("tokenizer_class") in (None, "TokenizersBackend"):
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
    if isinstance(config.get("extra_special_tokens"), list):
        config["additional_special_tokens"] = config.pop("extra_special_tokens")
    for key in ("is_local", "local_files_only"):  # how this copy was loaded, not part of the tokenizer
        config.pop(key, None)
    if model_type == "qwen2" and not splits_as_qwen2(tokenizer):
        config["auto_map"] = {"AutoTokenizer": [None, f"{FROM_FILE_MODULE}.TokenizerFromFile"]}
        (out / f"{FROM_FILE_MODULE}.py").write_text(FROM_FILE_SOURCE, encoding="utf-8")
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def save_tokenizer(tokenizer: transformers.PreTrainedTokenizerFast, out_dir: str | os.PathLike,
                   model_type: str | None = None):
    """Saves a tiny tokenizer: `write_hf_tokenizer`'s files and `special_tokens_map.json`, the files
    older and newer HF loaders both read."""
    out = pathlib.Path(out_dir)
    write_hf_tokenizer(tokenizer, out, model_type)
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
    import transformers

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
