"""DBBench's final answers: normalization and emptiness, as the scorer reads them."""
import pytest

from harness_envs.dbbench.answers import is_empty_answer, normalize_answer


@pytest.mark.parametrize("answer, mode, expected", [
    (' ["Vienna"]', "none", ' ["Vienna"]'),
    (None, "strip", None),
    ("""[" 'Vienna' ", "  `Graz`"]""", "strip", '["Vienna", "Graz"]'),
    (' Vienna ', "strip", '["Vienna"]'),
    ('["\\"House of Cards\\""]', "strip", '["\\"House of Cards\\""]'),  # double quotes stay
    ("[12, ' 3.50 ']", "strip", '["12", "3.50"]'),
    ("[12, ' 3.50 ', '3,729.7', 'x']", "numeric", '["12.0", "3.5", "3,729.7", "x"]'),
])
def test_normalize_answer(answer, mode, expected):
    assert normalize_answer(answer, mode) == expected


def test_empty_answers():
    for a in (None, "", "  ", "[]", "['']", "[' ', \"''\"]"):
        assert is_empty_answer(a), a
    for a in ("[0]", "['x']", "done"):
        assert not is_empty_answer(a), a
