"""The copy warm-up before SFT: rows that repeat random syllable words, and a few steps on them."""
import jax
import numpy as np

from hsjax.models.presets import get_preset
from hsjax.models.model import init_params
from hsjax.models.tokenizer import CV_SYLLABLES, tiny_tokenizer
from hsjax.studies.testbed import copy_warmup


def test_a_row_is_its_words_twice_and_the_mask_covers_the_repeat():
    tok = tiny_tokenizer("tiny_words")
    tokens, mask = copy_warmup.copy_batch(tok, np.random.default_rng(0), 4, pad_id=tok.pad_token_id)
    for row, m in zip(tokens, mask):
        text = tok.decode([int(t) for t in row if t != tok.pad_token_id])
        first, second = text.split("\n")
        assert first == second and len(first.split(", ")) == copy_warmup.WORDS_PER_ROW
        syllables = [w[i:i + 2] for w in first.split(", ") for i in range(0, len(w), 2)]
        assert set(syllables) <= set(CV_SYLLABLES) and len(syllables) == len(set(syllables))
        # Trained: every token of the repeat but its first; nothing else.
        trained = [int(t) for t, on in zip(row, m) if on]
        repeat = tok.encode(second, add_special_tokens=False)
        assert trained == repeat[1:]


def test_a_few_steps_lower_the_loss_on_the_repeat():
    tok = tiny_tokenizer("tiny_words")
    cfg = get_preset("tiny", vocab_size=len(tok))
    params = init_params(cfg, jax.random.key(0))
    new, curve = copy_warmup.warm_up(cfg, params, tok, steps=60, batch_size=8, learning_rate=3e-3, seed=0,
                                     pad_id=tok.pad_token_id, report_every=20)
    assert [s for s, _ in curve] == [20, 40, 60]
    assert curve[-1][1] < curve[0][1] - 0.5, curve
    assert jax.tree.structure(new) == jax.tree.structure(params)
