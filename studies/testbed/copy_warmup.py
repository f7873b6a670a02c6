"""A copy warm-up before the testbed's SFT: the generic skill of repeating what the context holds.

A pretrained LLM copies a name from its prompt without effort; the testbed's 1.05M-parameter policy
starts from random weights, and SFT on coined names alone forms no head that copies them. The
warm-up stands in for that part of pretraining: it runs once, as a copy base (`copy_base`) that SFT
starts from, and holds nothing of SQL, harnesses, SHOW TABLES or the tasks' names — its words are
random consonant-vowel syllables. How each choice below was reached, run by run, is in
docs/results.md ("Testbed v2", v6-v11, and "the copy warm-up's rows").

- Repeat rows: a short random list of words written again and again until the row is full, the loss
  on everything after the list's first token. Repetition is what forms copy heads quickly.
- No place to count from: a row opens with a random lead and has no line breaks ("tamo rive kuvo,
  geba, kuvo, geba, ..."), so copying by position (an offset after a line break, the row's first
  tokens) does not pay and the policy must look the current token up.
- Gap rows (`gap_row`; `sft.copy_far_steps` steps alternate them with repeat rows): filler, a list,
  up to `sft.copy_far_tokens` of filler, the list again — a name stands hundreds of tokens before
  the SQL that copies it, farther than repeats teach.
- Context rows (`style="context"`): leads and gaps are, with even odds, filler or a span of the
  tokenizer corpus (prose about data, SQL and the action format), and each word's separator is
  drawn from the marks a name stands beside in a task (`SEPARATORS`), so the lookup does not key on
  the rows' own filler and ", ".

`gap_tables` measures the reach with the first copy at the row's start and 150 tokens in (a policy
that looks words up is low in both); `context_table` scores repeats after prose no row holds.

Replay (`sft.copy_replay_every`): SFT at its learning rate erases what the warm-up formed, so after
every N-th SFT step one step of the same optimizer runs on copy rows drawn from (seed, step), the
way pretraining data mixed into fine-tuning keeps a skill alive.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from hsjax.models.model import forward
from hsjax.models.tokenizer import CORPUS_PATH, CV_SYLLABLES
from hsjax.rl import losses

ROW_TOKENS = 128  # every row filled to this many tokens
MIN_WORDS, MAX_WORDS = 2, 5  # words in a row's list: periods of about 6 to 20 tokens
LIST_TOKENS = 12  # a gap row's list: 3 words of 3 syllables, each closed by a separator
MAX_LEAD = 48  # filler tokens before a repeat row's list: up to 48
TABLE_LEAD = 150  # filler before the first copy in the second gap table: a lookup, not the row's start
STYLES = ("plain", "context")  # `sft.copy_style`: what surrounds the lists (module docstring)
# What follows a list word in a context row, one drawn per word: the marks that follow a name in
# the tasks' prompts and SQL, each one token of the words tokenizer.
SEPARATORS = (", ", ",", " ", ".", "?", "'", " = ")
HELD_OUT_TEXT = 0.8  # context leads come from the tokenizer corpus before this fraction; the table's after it
CONTEXT_LEADS = (0, 100, 240)  # leads of held-out text in `context_table`


def copy_row(tokenizer, rng: np.random.Generator, style: str = "plain") -> tuple[list[int], int]:
    """(`ROW_TOKENS` token ids, index where the list's first repeat starts): up to `MAX_LEAD` tokens
    of lead, then a list of 2-5 words of 2-3 syllables, each word followed by a separator, written
    again and again until the row is full; no syllable twice in the list. With neither a line
    break nor a fixed start to count from, the only way to the next token of a repeat is to find
    the current one earlier and copy what followed it: a lookup. Rows of lines that opened the row
    (v6-v9) were learnt by position instead (docs/results.md).

    `style="plain"` (v10): the lead is two-syllable filler words of syllables the list does not
    use, every separator ", ". `style="context"` (v11): the lead is, with even odds, such filler or a
    span of the tokenizer corpus (`_lead`), and each word's separator is drawn from `SEPARATORS`."""
    unit, others = _list_unit(tokenizer, rng, style)
    lead = _lead(tokenizer, rng, others, int(rng.integers(0, MAX_LEAD + 1)), style)
    return _repeated(lead, unit), len(lead) + len(unit)


def _list_unit(tokenizer, rng: np.random.Generator, style: str) -> tuple[list[int], np.ndarray]:
    """(a list of 2-5 words of 2-3 syllables, each followed by its separator; the syllable ids the
    list does not use)."""
    syllable_ids, _, comma, _ = _syllable_ids(tokenizer)
    order = rng.permutation(len(syllable_ids))
    sizes = rng.integers(2, 4, rng.integers(MIN_WORDS, MAX_WORDS + 1))
    unit = []
    for word in np.split(syllable_ids[order[:int(sizes.sum())]], np.cumsum(sizes)[:-1]):
        unit += [int(t) for t in word] + [_separator(tokenizer, rng, style, comma)]
    return unit, syllable_ids[order[int(sizes.sum()):]]


def _repeated(lead: list[int], unit: list[int], length: int = ROW_TOKENS) -> list[int]:
    """`lead`, then `unit` again and again, cut at `length` tokens."""
    repeats = -(-(length - len(lead)) // len(unit))
    return [int(t) for t in (lead + unit * repeats)[:length]]


def _separator(tokenizer, rng: np.random.Generator, style: str, plain: int) -> int:
    """The token after a list word: `plain` in plain rows, one of `SEPARATORS` in context rows."""
    if style == "plain":
        return plain
    if style != "context":
        raise ValueError(f"copy row style {style!r}: one of {STYLES}")
    return int(rng.choice(_separator_ids(tokenizer)))


def _lead(tokenizer, rng: np.random.Generator, syllable_ids, n: int, style: str) -> list[int]:
    """`n` tokens before (or between) a row's copies: `_filler` of `syllable_ids`, or in context
    rows with even odds a span of the tokenizer corpus's first `HELD_OUT_TEXT` (prose about data,
    SQL and the action format: the kind of text a name sits in, none of the tasks' names). Real text
    between the copies is what v10's filler-only rows lacked: their lookup failed after a task
    prompt (9.7 nats; docs/results.md, v11)."""
    if style == "context" and rng.random() < 0.5:
        text = _corpus_ids(tokenizer)[0]
        start = int(rng.integers(0, len(text) - n + 1))
        return [int(t) for t in text[start:start + n]]
    return _filler(rng, syllable_ids, _syllable_ids(tokenizer)[1], n)


def _filler(rng: np.random.Generator, syllable_ids, space: int, n: int) -> list[int]:
    """`n` tokens of two-syllable words drawn from `syllable_ids`, each followed by a space."""
    words = []
    while len(words) < n:
        words += [*rng.choice(syllable_ids, 2), space]
    return words[:n]


def copy_batch(tokenizer, rng: np.random.Generator, batch_size: int, style: str = "plain"):
    """tokens_BxT, mask_BxT of `copy_row`s (1 from the second token of the first repeat on: its
    first token follows the list's last separator, which nothing before predicts)."""
    tokens = np.zeros((batch_size, ROW_TOKENS), np.int32)
    mask = np.zeros((batch_size, ROW_TOKENS), np.float32)
    for b in range(batch_size):
        ids, start = copy_row(tokenizer, rng, style)
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


@functools.lru_cache(maxsize=8)
def _separator_ids(tokenizer) -> np.ndarray:
    """The token id of each of `SEPARATORS` (each must be one token of the words tokenizer)."""
    ids = [tokenizer.encode(text, add_special_tokens=False) for text in SEPARATORS]
    if any(len(i) != 1 for i in ids):
        raise ValueError(f"every separator must be one token of this tokenizer; {SEPARATORS} are {ids}")
    ids = np.array([i[0] for i in ids])
    ids.setflags(write=False)  # shared by every caller through the cache
    return ids


@functools.lru_cache(maxsize=8)
def _corpus_ids(tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """The tokenizer corpus as token ids, split at `HELD_OUT_TEXT`: (leads for training rows,
    leads for `context_table`)."""
    ids = np.array(tokenizer.encode(CORPUS_PATH.read_text(), add_special_tokens=False))
    ids.setflags(write=False)  # shared by every caller through the cache
    cut = int(len(ids) * HELD_OUT_TEXT)
    return ids[:cut], ids[cut:]


def gap_row(tokenizer, rng: np.random.Generator, gap: int, lead: int = 0,
            style: str = "plain") -> tuple[list[int], list[float]]:
    """`lead` tokens, a 3-word list (3 syllables each), `gap` tokens, the list again; the mask
    covers the second copy after its first token. Plain rows: the lead and gap are filler words of
    syllables the list does not use, the list's words end in ", ", ", " and a line break; context
    rows: each of lead and gap is filler or corpus text (`_lead`), each word's separator drawn
    (`_separator`). With `lead` 0 the first copy opens the row, and a policy can learn "copy from
    the row's start" instead of a lookup (v9, docs/results.md)."""
    syllable_ids, space, comma, newline = _syllable_ids(tokenizer)
    order = rng.permutation(len(CV_SYLLABLES))
    ends = [_separator(tokenizer, rng, style, comma), _separator(tokenizer, rng, style, comma),
            _separator(tokenizer, rng, style, newline)]
    line = [int(t) for k in range(3) for t in (*syllable_ids[order[3 * k:3 * k + 3]], ends[k])]
    assert len(line) == LIST_TOKENS

    between = _lead(tokenizer, rng, syllable_ids[order[9:]], gap, style)  # drawn first, as before leads were
    ids = _lead(tokenizer, rng, syllable_ids[order[9:]], lead, style) + line + between + line
    return ids, [0.0] * (lead + len(line) + gap + 1) + [1.0] * (len(line) - 1)


def gap_batch(tokenizer, rng: np.random.Generator, batch_size: int, max_gap: int, style: str = "plain"):
    """tokens_BxT, mask_BxT of `gap_row`s with gaps drawn uniformly from [0, `max_gap`] and a lead
    from [0, `max_gap` - gap], so the first copy stands anywhere in the row; padded at the end to
    the longest possible row (causal attention: padding changes nothing before it, and its mask is
    0). One shape for every batch: a new length would compile the step again."""
    drawn = []
    for _ in range(batch_size):
        gap = int(rng.integers(0, max_gap + 1))
        drawn.append(gap_row(tokenizer, rng, gap, int(rng.integers(0, max_gap - gap + 1)), style))
    return _padded(drawn, max_gap + 2 * LIST_TOKENS)


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
    at every lead: a lookup does not care where the first copy stands)."""
    rng = np.random.default_rng(seed)
    drawn = [gap_row(tokenizer, rng, gap, lead) for gap in gaps for _ in range(rows)]
    return _mean_nats(cfg, params, drawn, gaps, rows)


def _mean_nats(cfg, params, drawn, keys, rows: int) -> dict[int, float]:
    """{key: mean masked nats of its `rows` consecutive (ids, mask) rows of `drawn`}, all rows in
    one forward, padded at the end (causal attention: the padding changes nothing)."""
    tokens, mask = _padded(drawn, max(len(ids) for ids, _ in drawn))
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
    logits, _ = forward(cfg, params, jnp.asarray(tokens), positions)
    nats = -np.asarray(losses.token_logp(logits, jnp.asarray(tokens))[0]) * mask
    return {key: float(nats[k * rows:(k + 1) * rows].sum() / mask[k * rows:(k + 1) * rows].sum())
            for k, key in enumerate(keys)}


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


def replay_batch(tokenizer, seed: int, step: int, batch_size: int, far_tokens: int = 0, style: str = "plain"):
    """The copy rows replayed after SFT step `step`: repeated lists, or, when `far_tokens` is set,
    with even odds a `gap_batch` of half as many rows with gaps up to `far_tokens` (the warm-up's
    mix), in the copy base's `style`. Drawn from (seed, step) alone, so a resumed run replays the
    same rows without carrying any state."""
    rng = np.random.default_rng([seed, step])
    if far_tokens and rng.random() < 0.5:
        return gap_batch(tokenizer, rng, gap_rows_per_batch(batch_size), far_tokens, style)
    return copy_batch(tokenizer, rng, batch_size, style)


def warmup_optimizer(learning_rate: float, total_steps: int):
    """The warm-up's AdamW: clipped at global norm 1, no weight decay, a 20-step linear ramp."""
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(
        optax.linear_schedule(0.0, learning_rate, min(20, total_steps)), weight_decay=0.0))


def warmup_batch(tokenizer, seed: int, done: int, steps: int, batch_size: int, far_tokens: int,
                 style: str = "plain"):
    """(kind, tokens_BxT, mask_BxT) of warm-up step `done` (from 1): repeat rows for the first
    `steps`, then gap rows on every second step. Drawn from (seed, done) alone, in a stream apart
    from replay's, so a resumed warm-up draws the rows the first attempt would have."""
    rng = np.random.default_rng([seed, 1, done])
    if done > steps and (done - steps) % 2 == 0:
        return "gap", *gap_batch(tokenizer, rng, gap_rows_per_batch(batch_size), far_tokens, style)
    return "repeat", *copy_batch(tokenizer, rng, batch_size, style)


def warm_up(cfg, params, tokenizer, *, steps: int, batch_size: int, learning_rate: float, seed: int,
            far_steps: int = 0, far_tokens: int = 0, report_every: int = 50, on_report=None,
            start: int = 0, opt_state=None, on_step=None, table_every: int = 0, on_tables=None,
            table_rows: int = 16, style: str = "plain"):
    """`params` after `steps` AdamW steps on repeated lists, then `far_steps` that alternate a step
    on repeated lists with one on `gap_batch`es of `gap_rows_per_batch` rows (gaps up to
    `far_tokens`), one optimizer for all (`warmup_optimizer`). The repeats form the copy heads
    within a few hundred steps; the gap rows then stretch them over long gaps while the repeats
    keep the short copy (alone, long rows undid it: module docstring). Rows of `style` (`STYLES`).

    Resuming: `start` steps done, with their `opt_state`; `on_step(done, params, opt_state)` after
    every step is where a caller checkpoints. Every `table_every` steps `on_tables(done, tables)`
    gets `gap_tables` over `table_rows` rows a cell (the reach as it forms). Returns (params,
    report): report["repeat"] (repeat rows, both phases) and report["gap"] (gap rows) list (step,
    mean masked loss) every `report_every` steps and at the end, each also passed to
    `on_report(kind, step, total, loss)` (the run's progress lines). What the warm-up reached:
    `gap_tables` of the params."""
    total = steps + far_steps
    tx = warmup_optimizer(learning_rate, total)
    step_fn = make_copy_step(cfg, tx)
    opt_state = tx.init(params) if opt_state is None else opt_state
    report = {"repeat": [], "gap": []}
    window = {"repeat": [], "gap": []}
    for done in range(start + 1, total + 1):
        kind, tokens, mask = warmup_batch(tokenizer, seed, done, steps, batch_size, far_tokens, style)
        params, opt_state, loss = step_fn(params, opt_state, jnp.asarray(tokens), jnp.asarray(mask))
        window[kind].append(loss)
        if done % report_every == 0 or done == total:
            for name, losses_so_far in window.items():
                if losses_so_far:
                    report[name].append((done, float(np.mean(jax.device_get(losses_so_far)))))
                    if on_report is not None:
                        on_report(name, done, total, report[name][-1][1])
            window = {"repeat": [], "gap": []}
        if table_every and done % table_every == 0 and done < total and on_tables is not None:
            on_tables(done, gap_tables(cfg, params, tokenizer, table_rows))
        if on_step is not None:
            on_step(done, params, opt_state)
    return params, report


def gap_tables(cfg, params, tokenizer, rows: int = 16) -> dict[str, dict[int, float]]:
    """{"gap_nats": `gap_table` with the first copy at the row's start (gaps 0-550),
    "gap_nats_lead": the same `TABLE_LEAD` tokens in (gaps 0-400), "context_nats": `context_table`},
    each cell a mean over `rows` rows: a lookup that a task's prompt can use is low in all three."""
    return {"gap_nats": gap_table(cfg, params, tokenizer, rows=rows),
            "gap_nats_lead": gap_table(cfg, params, tokenizer, gaps=(0, 40, 150, 400), rows=rows, lead=TABLE_LEAD),
            "context_nats": context_table(cfg, params, tokenizer, rows=rows)}


def context_table(cfg, params, tokenizer, leads=CONTEXT_LEADS, rows: int = 16, seed: int = 11) -> dict[int, float]:
    """{lead: mean nats on the repeats of context `copy_row`s whose lead is replaced by `lead`
    tokens of text no training row holds (the corpus after `HELD_OUT_TEXT`)}: whether the lookup
    works among prose and other separators, as a name in a task's prompt needs. v10's plain base:
    0.003 nats on its own rows, 9.7 after a task prompt, 12.1 with "," for ", " (docs/results.md)."""
    rng = np.random.default_rng(seed)
    text = _corpus_ids(tokenizer)[1]
    drawn = []
    for lead in leads:
        for _ in range(rows):
            unit, _ = _list_unit(tokenizer, rng, "context")
            at = int(rng.integers(0, len(text) - lead + 1))
            ids = _repeated([int(t) for t in text[at:at + lead]], unit, lead + ROW_TOKENS - MAX_LEAD)
            drawn.append((ids, [0.0] * (lead + len(unit) + 1) + [1.0] * (len(ids) - lead - len(unit) - 1)))
    return _mean_nats(cfg, params, drawn, leads, rows)


def gap_lines(tables: dict) -> list[str]:
    """`gap_tables` (or a report holding them) as three console lines."""
    return ["copy across a gap of " + ", ".join(f"{gap} tokens: {nats:.2f} nats" for gap, nats in tables["gap_nats"].items()),
            f"the same, first copy after {TABLE_LEAD} tokens: " + ", ".join(
                f"{gap}: {nats:.2f}" for gap, nats in tables["gap_nats_lead"].items()),
            "repeats after held-out prose of " + ", ".join(
                f"{lead} tokens: {nats:.2f}" for lead, nats in tables["context_nats"].items())]
