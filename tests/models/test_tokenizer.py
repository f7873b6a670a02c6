import json
import pathlib
import subprocess
import sys

import pytest
import tokenizers
import transformers

from hsjax.models import tokenizer as tokenizer_lib


@pytest.fixture(scope="module")
def saved_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny_tok")
    tokenizer_lib.build_tiny_tokenizer(out)
    return out


@pytest.fixture(scope="module")
def tok(saved_dir):
    return tokenizer_lib.load_tokenizer(saved_dir)


TEXTS = [
    "",
    "hello world",
    "SELECT `name`, COUNT(*) FROM employees WHERE salary >= 85000.50 GROUP BY name;",
    "Action: Operation\n```sql\nUPDATE orders SET status = 'shipped' WHERE order_id = 7;\n```",
    'Action: Answer\nFinal Answer: ["42", "Alice"]',
    "Café naïve Zürich — 日本語 中文 한국어 العربية 🙂🚀",
    "  leading and trailing spaces  \n\n\ttabs\r\nwindows newlines",
    "\x00\x01\x7f odd control bytes \u200b zero-width \ufeff bom",
    "<|im_start|> looks special but sits inside text",
]


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text


def test_vocab_and_special_tokens(tok):
    assert len(tok) == 512
    vocab = tok.get_vocab()
    for special in tokenizer_lib.SPECIAL_TOKENS:
        assert special in vocab
    assert tok.eos_token == "<|endoftext|>" and tok.pad_token == "<|endoftext|>"
    assert tokenizer_lib.eos_ids(tok) == [vocab["<|endoftext|>"], vocab["<|im_end|>"]]
    # Special tokens are single ids, and the protocol phrases compress below one id per byte.
    assert tok.encode("<|im_end|>", add_special_tokens=False) == [vocab["<|im_end|>"]]
    phrase = "Action: Operation\n```sql\nSELECT * FROM table WHERE"
    assert len(tok.encode(phrase, add_special_tokens=False)) < len(phrase) / 2


def test_chat_template_renders_chatml(tok):
    msgs = [{"role": "system", "content": "You are a SQL agent."},
            {"role": "user", "content": "How many rows?"},
            {"role": "assistant", "content": "Action: Answer\nFinal Answer: [\"3\"]"}]
    text = tok.apply_chat_template(msgs, tokenize=False)
    assert text == ("<|im_start|>system\nYou are a SQL agent.<|im_end|>\n"
                    "<|im_start|>user\nHow many rows?<|im_end|>\n"
                    "<|im_start|>assistant\nAction: Answer\nFinal Answer: [\"3\"]<|im_end|>\n")
    prompt = tok.apply_chat_template(msgs[:2], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("How many rows?<|im_end|>\n<|im_start|>assistant\n")


def test_incremental_rendering_is_prefix(tok):
    contents = ["Which team won in 2019? The table is teams.",
                "I will look at the wins.\nAction: Operation\n```sql\nSELECT team FROM teams;\n```",
                "[('Lions',), ('Bears',)]",
                "Action: Answer\nFinal Answer: [\"Lions\"]",
                " spaces, unicode é 日本 and a trailing newline\n",
                "\n"]
    msgs = [{"role": "system", "content": "Be brief."}]
    msgs += [{"role": ("user", "assistant")[i % 2], "content": c} for i, c in enumerate(contents)]
    for k in range(1, len(msgs)):
        shorter = tokenizer_lib.chat_token_ids(tok, msgs[:k])
        longer = tokenizer_lib.chat_token_ids(tok, msgs[:k + 1])
        assert longer[:len(shorter)] == shorter, f"prefix broken at turn {k}"
        prompt = tokenizer_lib.chat_token_ids(tok, msgs[:k], add_generation_prompt=True)
        if msgs[k]["role"] == "assistant":
            # The sampler extends the generation prompt; the rendered turn must extend it too.
            assert longer[:len(prompt)] == prompt


def test_build_is_deterministic_across_processes(saved_dir, tmp_path):
    script = ("import sys; from hsjax.models.tokenizer import build_tiny_tokenizer; "
              "build_tiny_tokenizer(sys.argv[1])")
    repo_root = pathlib.Path(tokenizer_lib.__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True, timeout=120,
                   cwd=repo_root)
    assert (tmp_path / "tokenizer.json").read_bytes() == (saved_dir / "tokenizer.json").read_bytes()


def test_saved_dir_loads_with_auto_tokenizer(saved_dir):
    config = json.loads((saved_dir / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in config["chat_template"]
    assert (saved_dir / "special_tokens_map.json").is_file()
    auto = transformers.AutoTokenizer.from_pretrained(str(saved_dir), local_files_only=True)
    text = "SELECT 1; -- ünïcode"
    fresh = tokenizer_lib.build_tiny_tokenizer()
    assert auto.encode(text, add_special_tokens=False) == fresh.encode(text, add_special_tokens=False)
    msgs = [{"role": "user", "content": "hi"}]
    assert (auto.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_load_tokenizer_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        tokenizer_lib.load_tokenizer(tmp_path)


def test_vocab_too_small():
    with pytest.raises(ValueError, match="at least 259"):
        tokenizer_lib.build_tiny_tokenizer(vocab_size=100)


# ------------------------------------------------------------------ the two tiny tokenizers and AutoTokenizer

REPO = pathlib.Path(tokenizer_lib.__file__).resolve().parents[2]
QWEN2_CONFIG = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}
DIGITS = "SELECT name FROM users WHERE id = 3; -- 2023, 42.5"


def test_the_default_tiny_tokenizer_keeps_the_shipped_warm_starts_ids():
    """`tiny` must stay the tokenizer assets/testbed_warmstart was trained on (vocab and merges)."""
    shipped = json.loads((REPO / "assets" / "testbed_warmstart" / "tokenizer.json").read_text())["model"]
    fresh = json.loads(tokenizer_lib.tiny_tokenizer("tiny").backend_tokenizer.to_str())["model"]
    assert (fresh["vocab"], fresh["merges"]) == (shipped["vocab"], shipped["merges"])


def auto_dir(tmp_path, name, model_type=None):
    """The tiny tokenizer `name` saved beside a qwen2 config.json (by `write_hf_tokenizer` with the
    model type when given, as `save_pretrained` calls it)."""
    out = tmp_path / f"{name}_{model_type}"
    tokenizer_lib.save_tokenizer(tokenizer_lib.tiny_tokenizer(name), out, model_type)
    (out / "config.json").write_text(json.dumps(QWEN2_CONFIG))
    return out


def same_ids(auto, ours) -> tuple[bool, int]:
    corpus = tokenizer_lib.CORPUS_PATH.read_text(encoding="utf-8").splitlines()
    same = [auto.encode(t, add_special_tokens=False) == ours.encode(t, add_special_tokens=False)
            for t in [*TEXTS, DIGITS, *corpus]]
    msgs = [{"role": "user", "content": DIGITS}]
    same.append(auto.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
                == ours.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False))
    return all(same), same.count(False)


def test_plain_auto_tokenizer_gives_the_ids_of_tiny_qwen2_but_not_of_tiny(tmp_path):
    """The evidence: transformers 5 builds a Qwen2Tokenizer for any qwen2 model directory, with
    Qwen2's own pre-tokenizer: `tiny_qwen2` is trained under it, so the ids agree; `tiny` (GPT-2's
    split) does not, on numbers."""
    for name, agrees in (("tiny_qwen2", True), ("tiny", False)):
        auto = transformers.AutoTokenizer.from_pretrained(str(auto_dir(tmp_path, name)), local_files_only=True)
        assert type(auto).__name__ == "Qwen2Tokenizer"
        assert same_ids(auto, tokenizer_lib.tiny_tokenizer(name))[0] == agrees, name
    assert tokenizer_lib.tiny_tokenizer("tiny_qwen2").get_vocab() != tokenizer_lib.tiny_tokenizer("tiny").get_vocab()


@pytest.mark.parametrize("name", sorted(tokenizer_lib.TINY_TOKENIZERS))
@pytest.mark.parametrize("trust_remote_code", [None, True])
def test_written_beside_a_qwen2_model_auto_tokenizer_gives_the_projects_ids(tmp_path, name, trust_remote_code):
    """`write_hf_tokenizer(..., "qwen2")` keeps AutoTokenizer on tokenizer.json for `tiny` and
    `tiny_words` (an auto_map and tokenization_hsjax.py) and writes nothing extra for `tiny_qwen2`."""
    out = auto_dir(tmp_path, name, "qwen2")
    auto = transformers.AutoTokenizer.from_pretrained(str(out), local_files_only=True,
                                                      trust_remote_code=trust_remote_code)
    assert same_ids(auto, tokenizer_lib.tiny_tokenizer(name)) == (True, 0)
    has_map = "auto_map" in json.loads((out / "tokenizer_config.json").read_text())
    assert has_map == (out / "tokenization_hsjax.py").exists() == (name != "tiny_qwen2")
    assert type(auto).__name__ == ("Qwen2Tokenizer" if name == "tiny_qwen2" else
                                   "TokenizerFromFile" if trust_remote_code else "TokenizersBackend")


def test_a_qwen_style_pipeline_needs_no_auto_map():
    """Qwen2.5's own tokenizer.json (ByteLevel with trim_offsets false) splits as Qwen2Tokenizer does."""
    tok = tokenizer_lib.tiny_tokenizer("tiny_qwen2")
    backend = json.loads(tok.backend_tokenizer.to_str())
    backend["pre_tokenizer"]["pretokenizers"][1]["trim_offsets"] = False
    qwen_like = tokenizers.Tokenizer.from_str(json.dumps(backend))
    assert tokenizer_lib.splits_as_qwen2(qwen_like) and tokenizer_lib.splits_as_qwen2(tok)
    assert not tokenizer_lib.splits_as_qwen2(tokenizer_lib.tiny_tokenizer("tiny"))


@pytest.mark.parametrize("name", ["tiny_qwen2", "tiny_words"])
@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(text, name):
    tok = tokenizer_lib.tiny_tokenizer(name)
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


# A coined name where the testbed's names regime puts it: in the question, in a comma-separated
# header list, in SQL after a keyword, between quotes, in a SHOW TABLES result.
NAME_CONTEXTS = ("What is the mobigu of bapeka?", "headers of this table are dobube,mobigu,sufa.",
                 "SELECT mobigu FROM sufa WHERE dobube = 'mobigu'", "[('mobigu',)]", "mobigu")


def name_spellings(tok, name: str) -> set[tuple[int, ...]]:
    """The token sequences that cover exactly `name` wherever it occurs in NAME_CONTEXTS."""
    out = set()
    for text in NAME_CONTEXTS:
        enc = tok(text, return_offsets_mapping=True, add_special_tokens=False)
        start = text.find(name)
        while start >= 0:
            end = start + len(name)
            out.add(tuple(i for i, (a, b) in zip(enc["input_ids"], enc["offset_mapping"]) if a < end and b > start))
            start = text.find(name, end)
    return out


def test_tiny_words_spells_a_word_one_way_wherever_it_stands():
    """The copy the names regime asks of the policy is token for token under `tiny_words`; under
    `tiny` the same name is spelled with other tokens after a space, a comma and a quote."""
    words = tokenizer_lib.tiny_tokenizer("tiny_words")
    assert len(name_spellings(words, "mobigu")) == 1
    assert len(name_spellings(tokenizer_lib.tiny_tokenizer("tiny"), "mobigu")) > 1
    # ... one token a syllable: a coined name is as many tokens as it has syllables.
    assert all(len(words.encode(s, add_special_tokens=False)) == 1 for s in tokenizer_lib.CV_SYLLABLES)
    assert [words.decode([i]) for i in name_spellings(words, "mobigu").pop()] == ["mo", "bi", "gu"]


def test_written_tokenizer_config_is_one_transformers_4_loads(tmp_path):
    """transformers 4.57's AutoTokenizer fails on transformers 5's `TokenizersBackend` class name and
    list-valued `extra_special_tokens` (checked by hand with 4.57.1; docs/models.md)."""
    out = auto_dir(tmp_path, "tiny")
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert config["additional_special_tokens"] == ["<|im_start|>", "<|im_end|>"]
    assert "extra_special_tokens" not in config and "local_files_only" not in config and "is_local" not in config
    assert "<|im_start|>" in config["chat_template"] and not (out / "chat_template.jinja").exists()
    with pytest.raises(ValueError, match="tiny_qwen2"):
        tokenizer_lib.tiny_tokenizer("qwen2")
