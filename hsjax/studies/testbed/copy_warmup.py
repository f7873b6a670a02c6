"""A copy warm-up before the testbed's SFT: the generic skill of repeating what the context holds.

Every pretrained LLM copies a name from its prompt without effort; the testbed's 1.05M-parameter
policy starts from random weights. Two SFT runs on coined names (docs/results.md, "Testbed v2")
learnt the protocol, the SQL, the answers' numbers and when to run SHOW TABLES, yet after 1,600 and
2,100 steps still spent about log 63 nats on every syllable of a copied name — even the second
syllable of a name whose first syllable occurs once in the context: no induction head had formed.

What forms one quickly is repetition (docs/results.md, "the warm-up that teaches copying"): rows in which a short
random list of words is written again and again until the row is full ("kuvo, geba\nkuvo, geba\n
..."), the loss on everything after the list's first token repeats. The list's length varies from
row to row, so no fixed offset predicts the repeat; only matching the current token to its earlier
occurrence and copying what followed it does. A first version wrote a 12-word list exactly twice:
its loss stayed near uniform for 400 steps, as did a toy of one repeat at a random offset for
1,250 steps, while the tiny preset learns the many-repeat rows in about 500 steps at a learning
rate of 1e-3. Those heads copy from a few tokens back only (a list 40 tokens after its first
copy costs 7.7 nats; docs/results.md, v7), short of the hundreds a name spans in an expert
stream: rows with long gaps are the next step. The words are random consonant-vowel syllables,
not the tasks' names, and nothing about SQL, harnesses or SHOW TABLES is in them: the warm-up
stands in for the pretraining a real policy has.

Replay (`sft.copy_replay_every`): SFT at its learning rate erased what the warm-up formed (copy
rows cost 11.2 nats after 300 SFT steps, 0.56 before them) while the names were still not copied.
So the run can keep the skill alive the way pretraining data mixed into fine-tuning does: after
every N-th SFT step, one step of the same optimizer on copy rows drawn from (seed, step).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from hsjax.models.model import forward
from hsjax.models.tokenizer import CV_SYLLABLES
from hsjax.rl import losses

ROW_TOKENS = 128  # every row filled to this many tokens
MIN_WORDS, MAX_WORDS = 2, 5  # words in a row's list: periods of about 6 to 20 tokens


def copy_row(tokenizer, rng: np.random.Generator) -> tuple[list[int], int]:
    """(`ROW_TOKENS` token ids, index where the list's first repeat starts): a list of 2-5 words of
    2-3 syllables, no syllable twice in the row, written line after line until the row is full."""
    sizes = rng.integers(2, 4, rng.integers(MIN_WORDS, MAX_WORDS + 1))
    syllables = rng.choice(len(CV_SYLLABLES), int(sizes.sum()), replace=False)
    cuts = np.cumsum(sizes)[:-1]
    words = ["".join(CV_SYLLABLES[i] for i in part) for part in np.split(syllables, cuts)]
    line = tokenizer.encode(", ".join(words) + "\n", add_special_tokens=False)
    repeats = -(-ROW_TOKENS // len(line))
    return (line * repeats)[:ROW_TOKENS], len(line)


def copy_batch(tokenizer, rng: np.random.Generator, batch_size: int):
    """tokens_BxT, mask_BxT (1 from the second token of the first repeat on: its first token
    follows the first end of line, which nothing before predicts)."""
    tokens = np.zeros((batch_size, ROW_TOKENS), np.int32)
    mask = np.zeros((batch_size, ROW_TOKENS), np.float32)
    for b in range(batch_size):
        ids, start = copy_row(tokenizer, rng)
        tokens[b] = ids
        mask[b, start + 1:] = 1.0
    return tokens, mask


def make_copy_step(cfg, tx, batch_size: int):
    """A jitted AdamW step of `tx` on a batch of copy rows: (params, opt_state, tokens, mask) ->
    (params, opt_state, mean masked loss)."""
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

    return step_fn


def replay_batch(tokenizer, seed: int, step: int, batch_size: int):
    """The copy rows replayed after SFT step `step`: drawn from (seed, step) alone, so a resumed
    run replays the same rows without carrying any state."""
    return copy_batch(tokenizer, np.random.default_rng([seed, step]), batch_size)


def warm_up(cfg, params, tokenizer, *, steps: int, batch_size: int, learning_rate: float, seed: int,
            report_every: int = 50):
    """`params` after `steps` AdamW steps on copy rows (their own optimizer, discarded after);
    returns (params, [(step, mean masked loss)] every `report_every` steps and at the end)."""
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(
        optax.linear_schedule(0.0, learning_rate, min(20, steps)), weight_decay=0.0))
    step_fn = make_copy_step(cfg, tx, batch_size)
    rng = np.random.default_rng(seed)
    opt_state = tx.init(params)
    curve, window = [], []
    for step in range(steps):
        tokens, mask = copy_batch(tokenizer, rng, batch_size)
        params, opt_state, loss = step_fn(params, opt_state, jnp.asarray(tokens), jnp.asarray(mask))
        window.append(loss)
        if (step + 1) % report_every == 0 or step + 1 == steps:
            curve.append((step + 1, float(np.mean(jax.device_get(window)))))
            window = []
    return params, curve
