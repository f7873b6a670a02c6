"""The voters' log-probability mode: candidates are labelled A, B, C, ... and the voter's ranking is
read from the log-probabilities of those letters as the first token of its reply, not parsed from
its text.

Small models rarely answer a ranking prompt with well-formed JSON; most still put a candidate's
letter among the likeliest first tokens when asked for one. A voter in this mode makes one request
for a single token with `logprobs` and `top_logprobs` (what OpenAI, vLLM and hsjax's `serve`
return), and scores each candidate by the probability of every top token that reads as its letter
(" A", "A", "A.", "(A" are one letter: their probabilities add). The ranking is the candidates
whose letter is among the top tokens, best first; a reply where none is, or that carries no
logprobs at all (a server that ignores the field), is `malformed`, as an unreadable ranking is in
the text mode — so the two modes' malformed-vote rates compare directly.
"""
from __future__ import annotations

import math
import string
from typing import Sequence

LETTERS = string.ascii_uppercase
# As many alternatives as OpenAI allows (20): with up to 26 candidates, a letter outside the top
# 20 first tokens is too unlikely to rank.
TOP_LOGPROBS = 20
SYSTEM_PROMPT = (
    "You route failed agent tasks to harness variants. An agent (a language model policy) failed "
    "every attempt at the task below under the base harness. Each candidate harness changes how the "
    "task is presented or how the agent's replies are handled, and its card reports how often it "
    "rescued such failures before. Choose the candidate most likely to let the same agent succeed. "
    "Answer with the candidate's letter only.")


def letters_for(candidates: Sequence[str]) -> dict[str, str]:
    """letter -> candidate name, in the candidates' order."""
    if len(candidates) > len(LETTERS):
        raise ValueError(f"the log-probability vote labels candidates A-Z: {len(candidates)} candidates "
                         f"are more than {len(LETTERS)}; use vote_mode='ranking'")
    return dict(zip(LETTERS, candidates))


def letter_messages(task: dict, group_summary: str, cards: dict[str, str],
                    candidates: Sequence[str]) -> list[dict]:
    """The chat asking for one letter: the same task, group summary and cards as the ranking prompt."""
    labelled = letters_for(candidates)
    listed = "\n\n".join(f"{letter}) {name}\n{cards.get(name, '(no profile yet)')}"
                         for letter, name in labelled.items())
    user = (f"Task ({task.get('type') or 'unknown type'}, id {task.get('task_id')}):\n"
            f"{task.get('question') or '(question not available)'}\n\n"
            f"Failed group under the base harness:\n{group_summary}\n\n"
            f"Candidate harnesses:\n{listed}\n\n"
            f"Reply with one letter ({', '.join(labelled)}): the best candidate.")
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def letter_of(token: str) -> str | None:
    """The candidate letter a token reads as (" A", "A", "A.", "(A)", "A:"), or None."""
    core = token.strip().strip("()[]{}.:,*\"'`")
    return core if len(core) == 1 and core in LETTERS else None


def first_token_alternatives(response) -> list[tuple[str, float]] | None:
    """(token, logprob) of the reply's first token and its top alternatives, from an OpenAI-SDK chat
    completion; None when the reply carries no logprobs."""
    try:
        first = response.choices[0].logprobs.content[0]
    except (AttributeError, IndexError, TypeError):
        return None
    pairs = [(first.token, first.logprob)]
    pairs += [(alt.token, alt.logprob) for alt in (getattr(first, "top_logprobs", None) or [])]
    return [(str(t), float(lp)) for t, lp in pairs if isinstance(t, str) and isinstance(lp, (int, float))]


def letter_scores(alternatives: Sequence[tuple[str, float]], candidates: Sequence[str]) -> dict[str, float]:
    """candidate -> log-probability that the reply's first token names it (log of the summed
    probabilities of its distinct tokens); candidates absent from the alternatives are left out."""
    labelled = letters_for(candidates)
    by_letter: dict[str, dict[str, float]] = {}
    for token, logprob in alternatives:
        letter = letter_of(token)
        if letter in labelled and math.isfinite(logprob):
            by_letter.setdefault(letter, {})[token] = logprob  # the sampled token is listed twice
    return {labelled[letter]: _logsumexp(tokens.values()) for letter, tokens in by_letter.items()}


def ranking_from_scores(scores: dict[str, float], candidates: Sequence[str]) -> list[str]:
    """Best first; equal scores keep the candidates' order."""
    return sorted(scores, key=lambda name: (-scores[name], list(candidates).index(name)))


def _logsumexp(values) -> float:
    values = list(values)
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))
