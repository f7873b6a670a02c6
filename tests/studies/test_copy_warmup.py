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


def test_a_few_steps_lower_the_loss_on_the_repeat():
    tok = tiny_tokenizer("tiny_words")
    cfg = get_preset("tiny", vocab_size=len(tok))
    params = init_params(cfg, jax.random.key(0))
    new, curve = copy_warmup.warm_up(cfg, params, tok, steps=60, batch_size=8, learning_rate=3e-3, seed=0,
                                     report_every=20)
    assert [s for s, _ in curve] == [20, 40, 60]
    assert curve[-1][1] < curve[0][1] - 0.5, curve
    assert jax.tree.structure(new) == jax.tree.structure(params)


def test_replayed_rows_depend_on_the_seed_and_step_alone():
    """A resumed SFT run replays the rows the straight run replayed, with no state carried."""
    tok = tiny_tokenizer("tiny_words")
    a = copy_warmup.replay_batch(tok, 0, 7, 4)
    copy_warmup.replay_batch(tok, 0, 8, 4)  # other draws in between change nothing
    np.testing.assert_array_equal(a[0], copy_warmup.replay_batch(tok, 0, 7, 4)[0])
    assert not np.array_equal(a[0], copy_warmup.replay_batch(tok, 0, 9, 4)[0])
    assert not np.array_equal(a[0], copy_warmup.replay_batch(tok, 1, 7, 4)[0])
