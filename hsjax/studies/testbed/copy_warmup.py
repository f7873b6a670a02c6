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
stream. v8 stretched them with rows of a header of names and filler in which the names recur: it
taught a bag of the header's names (4.8-5.8 nats at every gap) and undid the short copy. What
stretched them in a toy and in v9 (docs/results.md) is a curriculum: after the repeats,
`sft.copy_far_steps` steps alternate repeat rows with `gap_row`s (a list, up to
`sft.copy_far_tokens` of filler, the list again), the repeats keeping the short copy while the gap
rows stretch it. In v9 every gap row opened with its list, and the policy learnt to copy what the
row opened with, not a lookup; gap rows now draw a lead of filler before the first copy, and
`gap_table` measures the reach after the warm-up both with the first copy at the row's start and
150 tokens in (the run prints both). The words are random
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
LIST_TOKENS = 12  # a gap row's list: 3 words of 3 syllables, 2 commas and the end of line


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
    per tokenizer: every gap row needs them, and replay draws a batch every few steps."""
    def one(text):
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"{text!r} is {len(ids)} tokens of this tokenizer; the copy rows need "
                             "the words tokenizer (model.tokenizer=tiny_words)")
        return ids[0]
    syllable_ids = np.array([one(s) for s in CV_SYLLABLES])
    syllable_ids.setflags(write=False)  # shared by every caller through the cache
    return syllable_ids, one(" "), one(", "), one("\n")


def gap_row(tokenizer, rng: np.random.Generator, gap: int, lead: int = 0) -> tuple[list[int], list[float]]:
    """`lead` tokens of two-syllable filler words, a 3-word list (3 syllables each), `gap` tokens
    of filler, the list again; the filler uses none of the list's syllables and the mask covers
    the second copy after its first token. With `lead` 0 the first copy opens the row, and a
    policy can learn "copy from the row's start" instead of a lookup (v9, docs/results.md)."""
    syllable_ids, space, comma, newline = _syllable_ids(tokenizer)
    order = rng.permutation(len(CV_SYLLABLES))
    line = [*syllable_ids[order[0:3]], comma, *syllable_ids[order[3:6]], comma, *syllable_ids[order[6:9]], newline]
    assert len(line) == LIST_TOKENS

    def filler(n):
        words = []
        while len(words) < n:
            words += [*rng.choice(syllable_ids[order[9:]], 2), space]
        return words[:n]

    between = filler(gap)  # drawn first: a row without lead is the row earlier versions drew
    ids = filler(lead) + line + between + line
    return ids, [0.0] * (lead + len(line) + gap + 1) + [1.0] * (len(line) - 1)


def gap_batch(tokenizer, rng: np.random.Generator, batch_size: int, max_gap: int):
    """tokens_BxT, mask_BxT of `gap_row`s with gaps drawn uniformly from [0, `max_gap`] and a lead
    from [0, `max_gap` - gap], so the first copy stands anywhere in the row; padded at the end to
    the longest possible row (causal attention: padding changes nothing before it, and its mask is
    0). One shape for every batch: a new length would compile the step again."""
    rows = []
    for _ in range(batch_size):
        gap = int(rng.integers(0, max_gap + 1))
        rows.append(gap_row(tokenizer, rng, gap, int(rng.integers(0, max_gap - gap + 1))))
    return _padded(rows, max_gap + 2 * LIST_TOKENS)


def _padded(rows, length: int):
    """tokens_BxT, mask_BxT of (ids, mask) rows, each padded with 0 at the end to `length`."""
    tokens = np.zeros((len(rows), length), np.int32)
    mask = np.zeros((len(rows), length), np.float32)
    for b, (ids, m) in enumerate(rows):
        tokens[b, :len(ids)], mask[b, :len(m)] = ids, m
    return tokens, mask


def gap_rows_per_batch(batch_size: int) -> int:
    """Gap rows in a batch beside `batch_size` repeat rows: half as many (a gap row is up to ~4x as
    long as a repeat row), in the warm-up and in replay alike."""
    return max(1, batch_size // 2)


def gap_table(cfg, params, tokenizer, gaps=(0, 40, 150, 400, 550), rows: int = 16, seed: int = 7,
              lead: int = 0) -> dict[int, float]:
    """{gap: mean nats on a 3-word list's second copy after its first token}, `lead` tokens of
    filler, the list, `gap` tokens of filler words from other syllables, the list again: how far
    back the policy's heads copy from (a copying policy stays well under 1 nat at every gap, and
    at every lead: a lookup does not care where the first copy stands). All rows go through one
    forward, padded at the end (causal attention: the padding changes nothing)."""
    rng = np.random.default_rng(seed)
    drawn = [gap_row(tokenizer, rng, gap, lead) for gap in gaps for _ in range(rows)]
    tokens, mask = _padded(drawn, max(len(ids) for ids, _ in drawn))
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
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
    """The copy rows replayed after SFT step `step`: repeated lists, or, when `far_tokens` is set,
    with even odds a `gap_batch` of half as many rows with gaps up to `far_tokens` (the warm-up's
    mix). Drawn from (seed, step) alone, so a resumed run replays the same rows without carrying
    any state."""
    rng = np.random.default_rng([seed, step])
    if far_tokens and rng.random() < 0.5:
        return gap_batch(tokenizer, rng, gap_rows_per_batch(batch_size), far_tokens)
    return copy_batch(tokenizer, rng, batch_size)


def warm_up(cfg, params, tokenizer, *, steps: int, batch_size: int, learning_rate: float, seed: int,
            far_steps: int = 0, far_tokens: int = 0, report_every: int = 50, on_report=None):
    """`params` after `steps` AdamW steps on repeated lists, then `far_steps` that alternate a step
    on repeated lists with one on `gap_batch`es of `gap_rows_per_batch` rows (gaps up to
    `far_tokens`), one optimizer for all, discarded after. The
    repeats form the copy heads within a few hundred steps; the gap rows then stretch them over
    long gaps while the repeats keep the short copy (alone, long rows undid it: module docstring).
    Returns (params, report): report["repeat"] (repeat rows, both phases) and report["gap"] (gap
    rows) list (step, mean masked loss) every `report_every` steps and at the end, each also passed
    to `on_report(kind, step, total, loss)` (the run's progress lines); report["gap_nats"] is
    `gap_table` after the warm-up, report["gap_nats_lead"] the same with the first copy after
    150 tokens of filler (a lookup, not "copy from the row's start")."""
    total = steps + far_steps
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(
        optax.linear_schedule(0.0, learning_rate, min(20, total)), weight_decay=0.0))
    step_fn = make_copy_step(cfg, tx)
    rng = np.random.default_rng(seed)
    opt_state = tx.init(params)
    report = {"repeat": [], "gap": []}
    window = {"repeat": [], "gap": []}
    for done in range(1, total + 1):
        kind = "gap" if done > steps and (done - steps) % 2 == 0 else "repeat"
        tokens, mask = (gap_batch(tokenizer, rng, gap_rows_per_batch(batch_size), far_tokens) if kind == "gap"
                        else copy_batch(tokenizer, rng, batch_size))
        params, opt_state, loss = step_fn(params, opt_state, jnp.asarray(tokens), jnp.asarray(mask))
        window[kind].append(loss)
        if done % report_every == 0 or done == total:
            for name, losses_so_far in window.items():
                if losses_so_far:
                    report[name].append((done, float(np.mean(jax.device_get(losses_so_far)))))
                    if on_report is not None:
                        on_report(name, done, total, report[name][-1][1])
            window = {"repeat": [], "gap": []}
    report["gap_nats"] = gap_table(cfg, params, tokenizer)
    report["gap_nats_lead"] = gap_table(cfg, params, tokenizer, gaps=(0, 40, 150, 400), lead=150)
    return params, report
