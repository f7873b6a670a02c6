"""hsjax on a real checkpoint, SmolLM2-135M-Instruct (scripts/fetch_smollm2.sh): config, tokenizer
and chat template, logits and greedy chat generation against transformers.

The tiny random models of test_parity.py check every family's layout; this checks what only a real
model has: 30 layers of trained weights (errors compound), tied embeddings, rope theta 1e5, a
GPT-2-style BPE with its own chat template (a default system prompt) and eos id."""
import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from hsjax.models import forward
from hsjax.policies.base import SamplingParams
from hsjax.policies.jax_policy import JaxPolicy
from hsjax.policies.tokens import render_prompt
from tests.smollm2 import load_reference, load_smollm2

# Both float32 implementations are about 1e-4 from the float64 logits (|logits| up to 40, 30 layers
# of rounding; the first position, with its large activations, the most), so they can differ by
# twice that and more. Transformers' own float32 error moves with the kernels and reduction order torch
# picks on a CPU: 1.7e-4 from float64 on one machine, 9.3e-5 on another, and 2.37e-4 from hsjax seen in
# CI under three test workers on two cores. So the bound on hsjax against transformers is 3e-4
# (relative 7.5e-6), and the sharp test is against float64: hsjax within FLOAT64_ATOL of it (float32
# rounding of |logits| up to 40: relative 5e-6), or no further than 1.5x transformers' own float32
# where that is further (docs/models.md, "A real model"). A layout or RoPE error is 1e-2 and more.
LOGIT_ATOL = 3e-4
FLOAT64_ATOL = 2e-4
LOGPROB_ATOL = 3e-4  # log-softmax removes none of it: the rounding is not a shift of the whole row
NEW_TOKENS = 20

TEXTS = [
    "The capital of France is",
    "SELECT name, salary FROM employees WHERE department = 'Sales' ORDER BY salary DESC;",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Übersetze: the cat sat on the mat. 日本語も少し。 Emoji 🙂 and tabs\tand  double  spaces.",
    "<|im_start|>user\nWhat is 12 * 7?<|im_end|>\n<|im_start|>assistant\n",
    "1, 1, 2, 3, 5, 8, 13, 21,",
]

QUESTIONS = [
    "What is the capital of Italy?",
    "Write one sentence about the sea.",
    "How many legs does a spider have?",
    "Give me a SQL query that counts the rows of a table named orders.",
    "What is 15 + 27?",
    "Name three primary colors.",
    "Translate 'good morning' into French.",
    "What does CPU stand for?",
    "Say hello in one word.",
    "Which planet is closest to the Sun?",
    "List two fruits that are yellow.",
    "What is the boiling point of water in Celsius?",
    "Write a Python function that returns the square of a number.",
    "Who wrote Romeo and Juliet?",
    "What is the opposite of 'cold'?",
    "Explain what a database index is in one sentence.",
    "How many days are in a leap year?",
    "What color is the sky on a clear day?",
    "Spell the word 'table' backwards.",
    "What is the largest ocean on Earth?",
    "Answer with yes or no: is ice cold?",
    "Give a synonym for 'happy'.",
]


@pytest.fixture(scope="module")
def real():
    return load_smollm2()


def test_config_and_tokenizer_match_transformers(real):
    path, cfg, _, tokenizer = real
    _, auto = load_reference()
    assert (cfg.family, cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads) == ("llama", 30, 576, 9, 3)
    assert cfg.tie_embeddings and cfg.rope_theta == 100000.0 and cfg.rope_scaling is None
    assert cfg.eos_token_ids == (2,) and tokenizer.convert_ids_to_tokens(2) == "<|im_end|>"
    for text in TEXTS:
        assert tokenizer.encode(text, add_special_tokens=False) == auto.encode(text, add_special_tokens=False)
    messages = [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!"},
                {"role": "user", "content": "How are you?"}]
    ids = render_prompt(tokenizer, messages)
    assert ids == auto.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    # The template's own default system prompt, and the generation prompt after the last turn.
    text = tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>user\nHow are you?<|im_end|>\n<|im_start|>assistant\n")


def test_logits_match_transformers(real):
    _, cfg, params, tokenizer = real
    model, _ = load_reference()
    rows = [tokenizer.encode(t, add_special_tokens=False) for t in TEXTS]
    length = max(map(len, rows))
    tokens_BxT = np.zeros((len(rows), length), np.int32)
    mask_BxT = np.zeros((len(rows), length), np.int32)
    for b, row in enumerate(rows):  # left-padded, as the sampler pads
        tokens_BxT[b, length - len(row):], mask_BxT[b, length - len(row):] = row, 1
    positions_BxT = np.where(mask_BxT > 0, np.cumsum(mask_BxT, axis=1) - 1, -1)
    got, _ = jax.jit(forward, static_argnums=0)(cfg, params, jnp.asarray(tokens_BxT), jnp.asarray(positions_BxT))
    got = np.asarray(got)
    real_BxT = mask_BxT > 0
    inputs = dict(input_ids=torch.tensor(tokens_BxT), attention_mask=torch.tensor(mask_BxT),
                  position_ids=torch.tensor(np.maximum(positions_BxT, 0)))
    with torch.no_grad():
        ref = model(**inputs).logits.numpy()
        ref64 = copy.deepcopy(model).double()(**inputs).logits.numpy()
    ours64, theirs64 = (np.abs(x.astype(np.float64) - ref64)[real_BxT].max() for x in (got, ref))
    assert ours64 <= max(FLOAT64_ATOL, 1.5 * theirs64), \
        f"hsjax {ours64:.2e} from float64, transformers float32 {theirs64:.2e}"
    diff = np.abs(got - ref)[real_BxT].max()
    assert diff <= LOGIT_ATOL, f"max |logit diff| {diff:.2e} over {int(mask_BxT.sum())} real tokens"
    logp_diff = np.abs(jax.nn.log_softmax(got, -1) - jax.nn.log_softmax(ref, -1))[real_BxT].max()
    assert logp_diff <= LOGPROB_ATOL, f"max |logprob diff| {logp_diff:.2e}"
    # The same next-token choice everywhere it is not a near tie.
    assert (got.argmax(-1) == ref.argmax(-1))[real_BxT].mean() > 0.99


def test_greedy_chat_generation_matches_transformers_generate(real):
    _, cfg, params, tokenizer = real
    model, auto = load_reference()
    policy = JaxPolicy(cfg, params, tokenizer, kv_reuse=False)
    assert set(policy.eos_ids) == {2, 0}  # <|im_end|> and <|endoftext|>
    prompts = [render_prompt(tokenizer, [{"role": "user", "content": q}]) for q in QUESTIONS]
    gens = policy.generate(prompts, SamplingParams(greedy=True, max_new_tokens=NEW_TOKENS))
    refs = [auto.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                     tokenize=True, return_dict=False) for q in QUESTIONS]
    assert prompts == refs
    # One left-padded batch, as the sampler runs it (one prompt at a time takes minutes on 2 cores).
    length = max(map(len, prompts))
    tokens_BxT = torch.tensor([[tokenizer.pad_token_id] * (length - len(p)) + p for p in prompts])
    mask_BxT = torch.tensor([[0] * (length - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = model.generate(input_ids=tokens_BxT, attention_mask=mask_BxT, max_new_tokens=NEW_TOKENS,
                             do_sample=False, eos_token_id=list(policy.eos_ids), pad_token_id=tokenizer.pad_token_id)
    stopped = 0
    for q, gen, row in zip(QUESTIONS, gens, out[:, length:].tolist()):
        ends = [i for i, t in enumerate(row) if t in policy.eos_ids]
        theirs = row[:ends[0] + 1] if ends else row  # generate pads the rows that finished
        assert gen.ids == theirs, (f"{q!r}: hsjax {tokenizer.decode(gen.ids)!r} vs "
                                   f"transformers {tokenizer.decode(theirs)!r}")
        stopped += gen.finish_reason == "stop"
    assert len(QUESTIONS) >= 20 and stopped >= 1  # some replies end at <|im_end|> within the budget
