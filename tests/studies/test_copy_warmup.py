"""The copy warm-up: rows that repeat random syllable words, a few steps on them, and the copy base run."""
import json

import jax
import numpy as np
import pytest

from hsjax.models.presets import get_preset
from hsjax.models.model import init_params
from hsjax.models.tokenizer import CV_SYLLABLES, tiny_tokenizer
from studies.testbed import copy_warmup
from tests.experiments.config_reads import covered, never_read


def test_a_row_repeats_its_list_after_a_lead_and_the_mask_covers_the_repeats():
    tok = tiny_tokenizer("tiny_words")
    tokens, mask = copy_warmup.copy_batch(tok, np.random.default_rng(0), 32)
    assert tokens.shape == mask.shape == (32, copy_warmup.ROW_TOKENS)
    periods, leads = set(), set()
    for row, m in zip(tokens, mask):
        start = int(np.flatnonzero(m)[0]) - 1  # the first repeat's first token
        text = tok.decode([int(t) for t in row[start:]])
        words = text.split(", ")[:-1]
        k = next(i for i in range(1, len(words)) if words[i] == words[0])  # words in the list
        assert copy_warmup.MIN_WORDS <= k <= copy_warmup.MAX_WORDS
        assert words == (words[:k] * len(words))[:len(words)]
        period = len(tok.encode(", ".join(words[:k]) + ", ", add_special_tokens=False))
        lead = start - period
        assert 0 <= lead <= copy_warmup.MAX_LEAD
        assert list(row[start:]) == list(row[lead:len(row) - period])  # the list, again and again
        syllables = [w[i:i + 2] for w in words[:k] for i in range(0, len(w), 2)]
        assert set(syllables) <= set(CV_SYLLABLES) and len(syllables) == len(set(syllables))
        # the filler: words of syllables the list does not use, no comma, no line break
        assert not set(row[:lead]) & set(row[lead:start]) - {int(t) for t in tok.encode(", ", add_special_tokens=False)}
        assert "," not in tok.decode([int(t) for t in row[:lead]]) and "\n" not in tok.decode([int(t) for t in row])
        assert m[:start + 1].sum() == 0 and m[start + 1:].all()
        periods.add(period)
        leads.add(lead)
    # neither the offset of the repeat nor where the list starts is fixed: only a lookup predicts
    assert len(periods) > 3 and len(leads) > 10 and min(leads) < 10 and max(leads) > 35


def test_context_rows_put_the_list_among_prose_with_drawn_separators():
    tok = tiny_tokenizer("tiny_words")
    separators = {int(tok.encode(t, add_special_tokens=False)[0]) for t in copy_warmup.SEPARATORS}
    train_text, table_text = (set(map(int, ids)) for ids in copy_warmup._corpus_ids(tok))
    syllables = {int(tok.encode(s, add_special_tokens=False)[0]) for s in CV_SYLLABLES}
    rng = np.random.default_rng(0)
    prose_leads, seps_seen = 0, set()
    for _ in range(64):
        unit, others = copy_warmup._list_unit(tok, rng, "context")
        words, word = [], []
        for t in unit:  # syllables, each word closed by its separator
            if t in separators:
                words.append((tuple(word), t))
                word = []
            else:
                assert t in syllables
                word.append(t)
        assert not word and copy_warmup.MIN_WORDS <= len(words) <= copy_warmup.MAX_WORDS
        assert all(2 <= len(w) <= 3 for w, _ in words)
        assert not set(unit) & set(map(int, others))
        seps_seen |= {sep for _, sep in words}
        ids, start = copy_warmup.copy_row(tok, rng, "context")
        period = next(p for p in range(6, 32) if ids[start:start + p] == ids[start - p:start])
        lead = ids[:start - period]
        assert len(ids) == copy_warmup.ROW_TOKENS and len(lead) <= copy_warmup.MAX_LEAD
        assert ids[start:] == (ids[start - period:start] * 20)[:len(ids) - start]
        if lead and any(t not in syllables and t != int(tok.encode(" ", add_special_tokens=False)[0]) for t in lead):
            prose_leads += 1
            assert set(lead) <= train_text  # prose from the training part of the corpus
    assert seps_seen == separators  # every separator drawn
    assert 16 < prose_leads < 48  # about half the leads are prose
    # the corpus's held-out part (context_table's leads) is text the training rows never hold
    assert len(copy_warmup._corpus_ids(tok)[1]) > 240


def test_plain_rows_are_the_rows_v10_drew():
    """The shipped v10 base (COPY_BASE_V10) was made from plain rows: the same seed and step must
    still draw them, token for token (ids printed by the v10 code), or its recipe no longer
    reproduces it."""
    tok = tiny_tokenizer("tiny_words")
    kind, tokens, mask = copy_warmup.warmup_batch(tok, 0, 1, 10, 2, 200)
    assert kind == "repeat" and int(mask.sum()) == 212
    assert tokens[0][:24].tolist() == [328, 355, 223, 356, 335, 223, 339, 319, 270, 351, 366, 265, 354, 366,
                                       310, 271, 292, 366, 304, 360, 279, 366, 321, 262]
    kind, tokens, mask = copy_warmup.warmup_batch(tok, 0, 12, 10, 4, 200)
    assert kind == "gap" and tokens.shape == (2, 224) and int(mask.sum()) == 22
    assert tokens[0][:24].tolist() == [360, 360, 223, 262, 355, 223, 337, 310, 341, 366, 347, 323, 350, 366,
                                       340, 275, 282, 201, 263, 290, 223, 259, 308, 223]
    with pytest.raises(ValueError, match="copy row style"):
        copy_warmup.copy_row(tok, np.random.default_rng(0), "prose")


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
    tables = copy_warmup.gap_tables(cfg, new, tok, rows=2)  # the smoke runs' rows: their programs
    assert sorted(tables["gap_nats"]) == [0, 40, 150, 400, 550] and sorted(tables["gap_nats_lead"]) == [0, 40, 150, 400]
    assert sorted(tables["context_nats"]) == list(copy_warmup.CONTEXT_LEADS)
    assert all(0 < v < 15 for table in tables.values() for v in table.values())
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


def test_the_context_table_tells_the_shipped_v11_base_from_v10():
    """The measurement behind v11: v10's lookup fails among prose, v11's does not (the shipped
    bases' copy_warmup.json hold the same figures)."""
    import experiments.testbed as testbed
    from hsjax.models import load_pretrained
    nats = {}
    for name, path in (("v10", testbed.COPY_BASE_V10), ("v11", testbed.COPY_BASE)):
        cfg, params, tok = load_pretrained(path)
        nats[name] = copy_warmup.context_table(cfg, params, tok)
    assert all(v > 5 for v in nats["v10"].values()) and all(v < 0.5 for v in nats["v11"].values()), nats


def test_warm_up_steps_draw_their_rows_from_the_seed_and_step_alone():
    tok = tiny_tokenizer("tiny_words")
    a = copy_warmup.warmup_batch(tok, 0, 6, 3, 4, 48)  # 3 repeat steps, then gap rows on steps 5, 7, ...
    assert a[0] == "repeat" and copy_warmup.warmup_batch(tok, 0, 5, 3, 4, 48)[0] == "gap"
    np.testing.assert_array_equal(a[1], copy_warmup.warmup_batch(tok, 0, 6, 3, 4, 48)[1])
    assert not np.array_equal(a[1], copy_warmup.warmup_batch(tok, 1, 6, 3, 4, 48)[1])
    assert not np.array_equal(a[1], copy_warmup.warmup_batch(tok, 0, 8, 3, 4, 48)[1])


def test_a_killed_copy_base_resumes_to_the_weights_of_an_uninterrupted_run(tmp_path, monkeypatch):
    from hsjax.infra import experiments
    from hsjax.models import load_pretrained
    from studies.testbed import copy_base

    config = experiments.get_config("testbed", "copy_base,names,smoke")  # 2 repeat + 2 alternating steps
    config.sft.save_every = 2
    # Every key of the config is read, or named by copy_base.unread (run.py rejects overriding those).
    unread = never_read(config, lambda: copy_base.main(config, str(tmp_path / "whole")))
    assert covered(unread, copy_base.unread(config)) == set()
    assert "sft.copy_far_tokens" not in unread and "sft.copy_warmup_lr" not in unread

    class Killed(Exception):
        pass

    warm_up = copy_warmup.warm_up

    def killed_after_step_3(*args, on_step, **kwargs):
        def step(done, p, o):
            on_step(done, p, o)
            if done == 3:
                raise Killed
        return warm_up(*args, on_step=step, **kwargs)

    monkeypatch.setattr(copy_warmup, "warm_up", killed_after_step_3)
    with pytest.raises(Killed):
        copy_base.main(config, str(tmp_path / "cut"))
    monkeypatch.setattr(copy_warmup, "warm_up", warm_up)
    copy_base.main(config, str(tmp_path / "cut"))  # resumes from the step-2 checkpoint
    _, a, _ = load_pretrained(tmp_path / "whole" / "hf")
    _, b, _ = load_pretrained(tmp_path / "cut" / "hf")
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    steps = [json.loads(line)["step"] for line in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps))  # the rows after the checkpoint were rewritten, not duplicated
