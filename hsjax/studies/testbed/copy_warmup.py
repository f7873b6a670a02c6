"""A copy warm-up before the testbed's SFT: the generic skill of repeating what the context holds.

Every pretrained LLM copies a name from its prompt without effort; the testbed's 1.05M-parameter
policy starts from random weights. Two SFT runs on coined names (docs/results.md, "Testbed v2")
learnt the protocol, the SQL, the answers' numbers and when to run SHOW TABLES, yet after 1,600 and
2,100 steps still spent log 63 nats on every syllable of a copied name — even the second syllable
of a name whose first syllable occurs once in the context. The same model learns to repeat a
sequence of random tokens in 200 steps when that is all it sees. So the warm-up gives it that
first: `sft.copy_warmup_steps` steps on rows of random words made of the tokenizer's
consonant-vowel syllables, written twice ("kuvo, geba, ...\nkuvo, geba, ..."), the loss on the
repeat. The words are random, not the tasks' names, and nothing about SQL, harnesses or SHOW
TABLES is in them: the warm-up stands in for the pretraining a real policy has.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from hsjax.models.model import forward
from hsjax.models.tokenizer import CV_SYLLABLES
from hsjax.rl import losses

ROW_TOKENS = 128  # every row padded to this many tokens
WORDS_PER_ROW = 12


def copy_row(tokenizer, rng: np.random.Generator) -> tuple[list[int], int]:
    """(token ids, index of the repeat's first token): `WORDS_PER_ROW` words of 2-3 syllables,
    no syllable twice in a row, listed, then listed again in the same order."""
    sizes = rng.integers(2, 4, WORDS_PER_ROW)
    syllables = rng.choice(len(CV_SYLLABLES), int(sizes.sum()), replace=False)
    cuts = np.cumsum(sizes)[:-1]
    words = ["".join(CV_SYLLABLES[i] for i in part) for part in np.split(syllables, cuts)]
    first = tokenizer.encode(", ".join(words) + "\n", add_special_tokens=False)
    second = tokenizer.encode(", ".join(words), add_special_tokens=False)
    return first + second, len(first)


def copy_batch(tokenizer, rng: np.random.Generator, batch_size: int, pad_id: int):
    """tokens_BxT, mask_BxT (1 on the repeat's tokens after its first, which nothing predicts)."""
    tokens = np.full((batch_size, ROW_TOKENS), pad_id, np.int32)
    mask = np.zeros((batch_size, ROW_TOKENS), np.float32)
    for b in range(batch_size):
        ids, start = copy_row(tokenizer, rng)
        if len(ids) > ROW_TOKENS:
            raise ValueError(f"a copy row of {len(ids)} tokens exceeds {ROW_TOKENS}")
        tokens[b, :len(ids)] = ids
        mask[b, start + 1:len(ids)] = 1.0
    return tokens, mask


def warm_up(cfg, params, tokenizer, *, steps: int, batch_size: int, learning_rate: float, seed: int,
            pad_id: int, report_every: int = 50):
    """`params` after `steps` AdamW steps on copy rows (their own optimizer, discarded after);
    returns (params, [(step, mean masked loss)] every `report_every` steps and at the end)."""
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(
        optax.linear_schedule(0.0, learning_rate, min(20, steps)), weight_decay=0.0))
    positions_BxT = jnp.tile(jnp.arange(ROW_TOKENS, dtype=jnp.int32), (batch_size, 1))

    def loss_fn(p, tokens_BxT, mask_BxT):
        logits_BxTxV, _ = forward(cfg, p, tokens_BxT, positions_BxT)
        logp_BxT, _ = losses.token_logp(logits_BxTxV, tokens_BxT)
        return -jnp.sum(logp_BxT * mask_BxT) / jnp.sum(mask_BxT)

    @jax.jit
    def step_fn(p, opt_state, tokens_BxT, mask_BxT):
        loss, grads = jax.value_and_grad(loss_fn)(p, tokens_BxT, mask_BxT)
        updates, opt_state = tx.update(grads, opt_state, p)
        return optax.apply_updates(p, updates), opt_state, loss

    rng = np.random.default_rng(seed)
    opt_state = tx.init(params)
    curve, window = [], []
    for step in range(steps):
        tokens, mask = copy_batch(tokenizer, rng, batch_size, pad_id)
        params, opt_state, loss = step_fn(params, opt_state, jnp.asarray(tokens), jnp.asarray(mask))
        window.append(loss)
        if (step + 1) % report_every == 0 or step + 1 == steps:
            curve.append((step + 1, float(np.mean(jax.device_get(window)))))
            window = []
    return params, curve
