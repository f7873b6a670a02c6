"""The copy warm-up before SFT: rows that repeat random syllable words, and a few steps on them."""
import jax
import numpy as np

from hsjax.models.presets import get_preset
from hsjax.models.model import init_params
from hsjax.models.tokenizer import CV_SYLLABLES, tiny_tokenizer
from hsjax.studies.testbed import copy_warmup


def test_a_row_repeats_its_list_to_the_end_and_the_mask_covers_the_repeats():
    tok = tiny_tokenizer("tiny_words")
    tokens, mask = copy_warmup.copy_batch(tok, np.random.default_rng(0), 16)
    assert tokens.shape == mask.shape == (16, copy_warmup.ROW_TOKENS)
    periods = set()
    for row, m in zip(tokens, mask):
        lines = tok.decode([int(t) for t in row]).split("\n")
        words = lines[0].split(", ")
        assert copy_warmup.MIN_WORDS <= len(words) <= copy_warmup.MAX_WORDS
        assert all(line == lines[0] for line in lines[1:-1]) and lines[0].startswith(lines[-1])
        syllables = [w[i:i + 2] for w in words for i in range(0, len(w), 2)]
        assert set(syllables) <= set(CV_SYLLABLES) and len(syllables) == len(set(syllables))
        # Trained: every token after the first of the first repeat; nothing before it.
        period = len(tok.encode(lines[0] + "\n", add_special_tokens=False))
        assert list(row[period:]) == list(row[:len(row) - period])
        assert m[:period + 1].sum() == 0 and m[period + 1:].all()
        periods.add(period)
    assert len(periods) > 3  # the offset of the repeat varies: no fixed position predicts it


def test_gap_batches_hold_gap_rows_with_gaps_and_leads_across_the_range_padded_with_nothing_trained():
    tok = tiny_tokenizer("tiny_words")
    tokens, mask = copy_warmup.gap_batch(tok, np.random.default_rng(0), 32, 300)
    assert tokens.shape == mask.shape == (32, 300 + 2 * copy_warmup.LIST_TOKENS)  # one shape: one compile
    k = copy_warmup.LIST_TOKENS  # the list: 3 words of 3 syllables, two ", ", one newline
    gaps, leads = [], []
    for row, m in zip(tokens, mask):
        n = int(np.flatnonzero(row).max()) + 1  # id 0 is the padding; no syllable or separator is 0
        ids = [int(t) for t in row[:n]]
        line = ids[n - k:]
        lead = next(i for i in range(n - k) if ids[i:i + k] == line)  # the first copy
        assert tok.decode(line).count(", ") == 2 and lead + k <= n - k
        leads.append(lead)
        gaps.append(n - k - (lead + k))
        assert list(m[:n]) == [0.0] * (n - k + 1) + [1.0] * (k - 1)
        assert not m[n:].any() and not row[n:].any()
    assert all(0 <= g and 0 <= l and g + l <= 300 for g, l in zip(gaps, leads))
    assert min(gaps) < 40 and max(gaps) > 200 and min(leads) < 40 and max(leads) > 100, (gaps, leads)


def test_gap_rows_repeat_the_list_after_exactly_the_lead_and_the_gap():
    tok = tiny_tokenizer("tiny_words")
    rng = np.random.default_rng(0)
    k = copy_warmup.LIST_TOKENS
    for gap, lead in ((0, 0), (7, 0), (40, 0), (0, 9), (40, 150)):
        ids, mask = copy_warmup.gap_row(tok, rng, gap, lead)
        assert len(ids) == lead + 2 * k + gap
        line = ids[lead:lead + k]
        assert ids[lead + k + gap:] == line
        assert mask == [0.0] * (lead + k + gap + 1) + [1.0] * (k - 1)
        filler = ids[:lead] + ids[lead + k:lead + k + gap]
        assert not set(line[:-1]) & set(filler)  # the filler shares no syllable with the list


def test_a_few_steps_lower_the_loss_on_both_kinds_of_rows():
    tok = tiny_tokenizer("tiny_words")
    cfg = get_preset("tiny", vocab_size=len(tok))
    params = init_params(cfg, jax.random.key(0))
    lines = []
    new, report = copy_warmup.warm_up(cfg, params, tok, steps=60, batch_size=8, learning_rate=3e-3, seed=0,
                                      far_steps=10, far_tokens=64, report_every=20,
                                      on_report=lambda *line: lines.append(line))
    curve = report["repeat"]
    assert lines == [("repeat", s, 70, v) for s, v in curve[:3]] + [
        ("repeat", 70, 70, curve[3][1]), ("gap", 70, 70, report["gap"][0][1])]
    # 5 of the 10 far steps are on repeat rows: their losses join the repeat curve's last point
    assert [s for s, _ in curve] == [20, 40, 60, 70] and [s for s, _ in report["gap"]] == [70]
    assert curve[-1][1] < curve[0][1] - 0.5, curve
    assert sorted(report["gap_nats"]) == [0, 40, 150, 400, 550] and sorted(report["gap_nats_lead"]) == [0, 40, 150, 400]
    assert all(0 < v < 10 for v in report["gap_nats"].values())
    assert jax.tree.structure(new) == jax.tree.structure(params)


def test_replayed_rows_depend_on_the_seed_and_step_alone():
    """A resumed SFT run replays the rows the straight run replayed, with no state carried."""
    tok = tiny_tokenizer("tiny_words")
    a = copy_warmup.replay_batch(tok, 0, 7, 4)
    copy_warmup.replay_batch(tok, 0, 8, 4)  # other draws in between change nothing
    np.testing.assert_array_equal(a[0], copy_warmup.replay_batch(tok, 0, 7, 4)[0])
    assert not np.array_equal(a[0], copy_warmup.replay_batch(tok, 0, 9, 4)[0])
    assert not np.array_equal(a[0], copy_warmup.replay_batch(tok, 1, 7, 4)[0])
    # With far_tokens, about half the replays are gap batches of half as many rows.
    far = [copy_warmup.replay_batch(tok, 0, step, 4, far_tokens=96)[0] for step in range(40)]
    gap_steps = [step for step, tokens in enumerate(far) if tokens.shape[0] == 2]
    assert 10 < len(gap_steps) < 30
    assert all(far[step].shape[1] == 96 + 2 * copy_warmup.LIST_TOKENS for step in gap_steps)
    assert all(far[step].shape == (4, copy_warmup.ROW_TOKENS) for step in range(40) if step not in gap_steps)
    step = gap_steps[0]
    np.testing.assert_array_equal(far[step], copy_warmup.replay_batch(tok, 0, step, 4, far_tokens=96)[0])


def test_gap_table_in_one_padded_forward_equals_a_forward_per_gap():
    from hsjax.models.model import forward
    from hsjax.rl import losses
    import jax.numpy as jnp
    tok = tiny_tokenizer("tiny_words")
    cfg = get_preset("tiny", vocab_size=len(tok))
    params = init_params(cfg, jax.random.key(1))
    table = copy_warmup.gap_table(cfg, params, tok, gaps=(0, 40), rows=3, seed=5)
    rng = np.random.default_rng(5)
    for gap in (0, 40):
        ids, mask = map(np.asarray, zip(*(copy_warmup.gap_row(tok, rng, gap) for _ in range(3))))
        positions = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
        logp = losses.token_logp(forward(cfg, params, jnp.asarray(ids), positions)[0], jnp.asarray(ids))[0]
        np.testing.assert_allclose(table[gap], -(np.asarray(logp) * mask).sum() / mask.sum(), rtol=1e-5)
