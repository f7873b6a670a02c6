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
stream. So `sft.copy_far_steps` more steps follow on `scattered_row`s: a header of names, then
filler in which the names recur at gaps from a few tokens to the whole row; `gap_table` measures
the reach after the warm-up (the run prints it). In v8 those rows taught a bag of the header's
names (3.2 nats on the scattered rows, 4.8-5.8 at every gap) and undid the short copy; what forms
a long-range copy in this policy is still open (docs/results.md). The words are random
consonant-vowel syllables, not the tasks' names, and nothing about SQL, harnesses or SHOW TABLES
is in them: the warm-up stands in for the pretraining a real policy has.

Replay (`sft.copy_replay_every`): SFT at its learning rate erased what the warm-up formed (copy
rows cost 11.2 nats after 300 SFT steps, 0.56 before them) while the names were still not copied.
So the run can keep the skill alive the way pretraining data mixed into fine-tuning does: after
every N-th SFT step, one step of the same optimizer on copy rows drawn from (seed, step).
"""
from __future__ import annotations

import functools

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


@functools.lru_cache(maxsize=8)
def _syllable_ids(tokenizer) -> tuple[np.ndarray, int, int, int]:
    """(token id of each of `CV_SYLLABLES`, id of " ", of ", ", of "\n"): each is one token of the
    words tokenizer, so a row is built from ids directly, as encoding its text would give. Cached
    per tokenizer: every scattered or gap row needs them, and replay draws a batch every few steps."""
    def one(text):
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"{text!r} is {len(ids)} tokens of this tokenizer; the copy rows need "
                             "the words tokenizer (model.tokenizer=tiny_words)")
        return ids[0]
    syllable_ids = np.array([one(s) for s in CV_SYLLABLES])
    syllable_ids.setflags(write=False)  # shared by every caller through the cache
    return syllable_ids, one(" "), one(", "), one("\n")


def scattered_row(tokenizer, rng: np.random.Generator, row_tokens: int) -> tuple[list[int], list[float]]:
    """(`row_tokens` ids, their loss mask): copying across long gaps, as a name is copied from a
    schema hundreds of tokens back.

    A header line lists 2-5 names of 2-3 syllables; a body of filler words (1-3 syllables, never
    a name's) follows, in which each word is one of the names with a probability drawn per row
    from [0.03, 0.3] — so the gap back to a name's last occurrence runs from a few tokens to the
    whole row. The mask covers a name's syllables after its first in the body: given the first,
    only looking the name up in the context predicts the rest."""
    syllable_ids, space, comma, newline = _syllable_ids(tokenizer)
    order = rng.permutation(len(CV_SYLLABLES))
    sizes = rng.integers(2, 4, rng.integers(MIN_WORDS, MAX_WORDS + 1))
    names = np.split(syllable_ids[order[:sizes.sum()]], np.cumsum(sizes)[:-1])
    filler = syllable_ids[order[sizes.sum():]]
    ids = []
    for k, name in enumerate(names):
        ids += [*name, comma if k + 1 < len(names) else newline]
    mask = [0.0] * len(ids)
    p_name = rng.uniform(0.03, 0.3)
    while len(ids) < row_tokens:
        if rng.random() < p_name:
            name = names[rng.integers(len(names))]
            ids += [*name, space]
            mask += [0.0] + [1.0] * (len(name) - 1) + [0.0]
        else:
            ids += [*rng.choice(filler, rng.integers(1, 4)), space]
            mask += [0.0] * (len(ids) - len(mask))
    return ids[:row_tokens], mask[:row_tokens]


def scattered_batch(tokenizer, rng: np.random.Generator, batch_size: int, row_tokens: int):
    """tokens_BxT, mask_BxT of `scattered_row`s."""
    rows = [scattered_row(tokenizer, rng, row_tokens) for _ in range(batch_size)]
    return (np.array([r[0] for r in rows], np.int32), np.array([r[1] for r in rows], np.float32))


def gap_row(tokenizer, rng: np.random.Generator, gap: int) -> tuple[list[int], list[float]]:
    """A 3-word list (3 syllables each), `gap` tokens of two-syllable filler words from other
    syllables, the list again; the mask covers the second copy after its first token."""
    syllable_ids, space, comma, newline = _syllable_ids(tokenizer)
    order = rng.permutation(len(CV_SYLLABLES))
    line = [*syllable_ids[order[0:3]], comma, *syllable_ids[order[3:6]], comma, *syllable_ids[order[6:9]], newline]
    filler = []
    while len(filler) < gap:
        filler += [*rng.choice(syllable_ids[order[9:]], 2), space]
    ids = line + filler[:gap] + line
    return ids, [0.0] * (len(line) + gap + 1) + [1.0] * (len(line) - 1)


def gap_table(cfg, params, tokenizer, gaps=(0, 40, 150, 400), rows: int = 16, seed: int = 7) -> dict[int, float]:
    """{gap: mean nats on a 3-word list's second copy after its first token}, the list written
    once, then `gap` tokens of filler words from other syllables, then again: how far back the
    policy's heads copy from (a copying policy stays well under 1 nat at every gap). All rows go
    through one forward, padded at the end (causal attention: the padding changes nothing)."""
    rng = np.random.default_rng(seed)
    drawn = [gap_row(tokenizer, rng, gap) for gap in gaps for _ in range(rows)]
    length = max(len(ids) for ids, _ in drawn)
    tokens = np.zeros((len(drawn), length), np.int32)
    mask = np.zeros((len(drawn), length), np.float32)
    for b, (ids, m) in enumerate(drawn):
        tokens[b, :len(ids)], mask[b, :len(m)] = ids, m
    positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), tokens.shape)
    logits, _ = forward(cfg, params, jnp.asarray(tokens), positions)
    nats = -np.asarray(losses.token_logp(logits, jnp.asarray(tokens))[0]) * mask
    return {gap: float(nats[k * rows:(k + 1) * rows].sum() / mask[k * rows:(k + 1) * rows].sum())
            for k, gap in enumerate(gaps)}


def make_copy_step(cfg, tx):
    """A jitted AdamW step of `tx` on a batch of copy rows: (params, opt_state, tokens, mask) ->
    (params, opt_state, mean masked loss)."""
    def loss_fn(p, tokens_BxT, mask_BxT):
        positions_BxT = jnp.broadcast_to(jnp.arange(tokens_BxT.shape[1], dtype=jnp.int32), tokens_BxT.shape)
        logits_BxTxV, _ = forward(cfg, p, tokens_BxT, positions_BxT)
        logp_BxT, _ = losses.token_logp(logits_BxTxV, tokens_BxT)
        return -jnp.sum(logp_BxT * mask_BxT) / jnp.sum(mask_BxT)

    @jax.jit
    def step_fn(p, opt_state, tokens_BxT, mask_BxT):
        loss, grads = jax.value_and_grad(loss_fn)(p, tokens_BxT, mask_BxT)
        updates, opt_state = tx.update(grads, opt_state, p)
        return optax.apply_updates(p, updates), opt_state, loss

    return step_fn


def replay_batch(tokenizer, seed: int, step: int, batch_size: int, far_tokens: int = 0):
    """The copy rows replayed after SFT step `step`: `scattered_row`s of `far_tokens` when it is
    set, else the repeated lists. Drawn from (seed, step) alone, so a resumed run replays the
    same rows without carrying any state."""
    rng = np.random.default_rng([seed, step])
    if far_tokens:
        return scattered_batch(tokenizer, rng, batch_size, far_tokens)
    return copy_batch(tokenizer, rng, batch_size)


def warm_up(cfg, params, tokenizer, *, steps: int, batch_size: int, learning_rate: float, seed: int,
            far_steps: int = 0, far_tokens: int = 0, report_every: int = 50, on_report=None):
    """`params` after `steps` AdamW steps on repeated lists, then `far_steps` on `scattered_row`s
    of `far_tokens` (one optimizer for both, discarded after): the repeats form the heads within
    a few hundred steps, the scattered rows stretch them over long gaps. Returns (params, report):
    report["repeat"] and report["scattered"] list (step, mean masked loss) every `report_every`
    steps and at each phase's end, each also passed to `on_report(kind, step, total, loss)` (the
    run's progress lines); report["gap_nats"] is `gap_table` after the warm-up."""
    total = steps + far_steps
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(
        optax.linear_schedule(0.0, learning_rate, min(20, total)), weight_decay=0.0))
    step_fn = make_copy_step(cfg, tx)
    rng = np.random.default_rng(seed)
    opt_state = tx.init(params)
    report = {"repeat": [], "scattered": []}
    phases = (("repeat", steps, lambda: copy_batch(tokenizer, rng, batch_size)),
              ("scattered", far_steps, lambda: scattered_batch(tokenizer, rng, batch_size, far_tokens)))
    done = 0
    for name, phase_steps, draw in phases:
        window = []
        for k in range(phase_steps):
            tokens, mask = draw()
            params, opt_state, loss = step_fn(params, opt_state, jnp.asarray(tokens), jnp.asarray(mask))
            window.append(loss)
            done += 1
            if (k + 1) % report_every == 0 or k + 1 == phase_steps:
                report[name].append((done, float(np.mean(jax.device_get(window)))))
                window = []
                if on_report is not None:
                    on_report(name, done, total, report[name][-1][1])
    report["gap_nats"] = gap_table(cfg, params, tokenizer)
    return params, report
