import json
import pathlib
import subprocess
import sys

import pytest
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
