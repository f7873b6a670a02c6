"""The replies of the OpenAI-compatible server: response bodies and stream chunks of both endpoints,
built from what the worker generated (`Reply`), with OpenAI's logprob shapes and vLLM's token-id
fields (`hsjax.llm.openai_api` has the request side and the field rules)."""
from __future__ import annotations

import dataclasses
import math
import time
import uuid
from typing import Iterator

from hsjax.llm.openai_api import FLOOR_LOGPROB, GenerateRequest


@dataclasses.dataclass
class Choice:
    """One generated sequence: its text (stop string and end-of-turn left out), why it ended, and
    for a token policy its ids, their logprobs and the top alternatives (None for a chat policy)."""

    text: str
    finish_reason: str
    ids: list[int] | None = None
    logprobs: list[float] | None = None
    top: list[list[tuple[int, float]]] | None = None


@dataclasses.dataclass
class Reply:
    """What the worker hands back: each prompt's ids (None for a chat policy) and the choices,
    prompt by prompt, n each."""

    prompt_ids: list[list[int] | None]
    choices: list[Choice]
    completion_tokens: int

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p or ()) for p in self.prompt_ids)

    def usage(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte <-> printable-character table, which byte-level BPE vocabularies are written in."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_BYTE_OF_CHAR = {c: b for b, c in _bytes_to_unicode().items()}


class TokenText:
    """The text and bytes of single tokens, as logprob entries show them (cached per id; one per
    server, used by the worker thread and the handlers alike: a lost race only computes twice)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._text: dict[int, str] = {}
        self._bytes: dict[int, list[int]] = {}

    def text(self, token_id: int) -> str:
        if token_id not in self._text:
            self._text[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return self._text[token_id]

    def bytes(self, token_id: int) -> list[int]:
        """The token's own bytes: exact for byte-level BPE vocabularies (a token may hold part of a
        UTF-8 character), the UTF-8 of its text otherwise."""
        if token_id not in self._bytes:
            piece = self.tokenizer.convert_ids_to_tokens(token_id)
            if isinstance(piece, str) and piece and all(c in _BYTE_OF_CHAR for c in piece):
                self._bytes[token_id] = [_BYTE_OF_CHAR[c] for c in piece]
            else:
                self._bytes[token_id] = list(self.text(token_id).encode("utf-8"))
        return self._bytes[token_id]

    def name(self, token_id: int, as_id: bool) -> str:
        return f"token_id:{token_id}" if as_id else self.text(token_id)


def _finite(x: float) -> float:
    return float(x) if math.isfinite(x) else FLOOR_LOGPROB


def _chat_logprobs(choice: Choice, start: int, stop: int, tt: TokenText, as_ids: bool) -> dict:
    content = []
    for j in range(start, stop):
        t = choice.ids[j]
        entry = {"token": tt.name(t, as_ids), "logprob": _finite(choice.logprobs[j]), "bytes": tt.bytes(t),
                 "top_logprobs": [{"token": tt.name(a, as_ids), "logprob": _finite(lp), "bytes": tt.bytes(a)}
                                  for a, lp in (choice.top[j] if choice.top else ())]}
        content.append(entry)
    return {"content": content}


def _completion_logprobs(choice: Choice, start: int, stop: int, tt: TokenText, as_ids: bool, offset: int) -> dict:
    tokens, token_logprobs, tops, offsets = [], [], [], []
    for j in range(start, stop):
        t = choice.ids[j]
        name = tt.name(t, as_ids)
        tokens.append(name)
        token_logprobs.append(_finite(choice.logprobs[j]))
        top = {tt.name(a, as_ids): _finite(lp) for a, lp in (choice.top[j] if choice.top else ())}
        top.setdefault(name, _finite(choice.logprobs[j]))  # the sampled token is always listed (vLLM)
        tops.append(top)
        offsets.append(offset)
        offset += len(tt.text(t))
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}


def _head(kind: str, model_name: str, rid: str, created: int) -> dict:
    return {"id": rid, "object": kind, "created": created, "model": model_name}


def _new_id(request: GenerateRequest) -> str:
    return f"{'chatcmpl' if request.kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"


def response_body(request: GenerateRequest, reply: Reply, model_name: str, tt: TokenText | None = None) -> dict:
    """The non-streaming body of either endpoint (`tt`: the tokens' text, needed for logprobs)."""
    created, rid = int(time.time()), _new_id(request)
    choices = []
    for i, c in enumerate(reply.choices):
        prompt = reply.prompt_ids[i // request.n]
        ids = c.ids or []
        if request.kind == "chat":
            choice = {"index": i, "message": {"role": "assistant", "content": c.text},
                      "logprobs": _chat_logprobs(c, 0, len(ids), tt, request.tokens_as_ids) if request.logprobs
                      else None, "finish_reason": c.finish_reason}
        else:
            choice = {"index": i, "text": c.text, "logprobs": _completion_logprobs(
                c, 0, len(ids), tt, request.tokens_as_ids, 0) if request.logprobs else None,
                "finish_reason": c.finish_reason}
            if request.return_token_ids:
                choice["prompt_token_ids"] = prompt
        if request.return_token_ids:
            choice["token_ids"] = ids
        choices.append(choice)
    body = {**_head("chat.completion" if request.kind == "chat" else "text_completion", model_name, rid, created),
            "choices": choices, "usage": reply.usage()}
    if request.kind == "chat" and request.return_token_ids:
        body["prompt_token_ids"] = reply.prompt_ids[0]
    return body


def text_pieces(decode, ids: list[int], text: str) -> list[str]:
    """`text` split at the generated tokens, for streaming: piece j is what token j adds to the text
    (`decode` of the ids so far), held back while a multi-byte character is incomplete; what a
    stop string or the end-of-turn token would add is not in `text`. The pieces join to `text`."""
    pieces, done = [], 0
    for j in range(len(ids)):
        prefix = decode(ids[:j + 1])
        if prefix.endswith("\ufffd") and j + 1 < len(ids):
            pieces.append("")
            continue
        end = max(done, min(len(prefix), len(text)))
        pieces.append(text[done:end])
        done = end
    if not pieces:
        return [text] if text else []
    pieces[-1] += text[done:]
    return pieces


def stream_chunks(request: GenerateRequest, reply: Reply, model_name: str,
                  tt: TokenText | None = None) -> Iterator[dict]:
    """The chunks of a streamed reply (`chat.completion.chunk` or `text_completion` objects): per choice
    a first chunk (chat: the role; with `return_token_ids`, the prompt's ids), one per generated token
    (its text piece, logprobs and `token_ids`), a last one with the finish reason; with
    `stream_options.include_usage` every chunk has `usage: null` and a final chunk with no choices
    holds the usage. Sent after the whole reply was generated (the sampler's loop is one program)."""
    chat = request.kind == "chat"
    created, rid = int(time.time()), _new_id(request)
    head = _head("chat.completion.chunk" if chat else "text_completion", model_name, rid, created)
    usage = {"usage": None} if request.include_usage else {}

    def chunk(index: int, piece: str, *, first: bool = False, ids: list[int] | None = None, logprobs=None,
              finish: str | None = None, prompt: list[int] | None = None) -> dict:
        if chat:
            delta = {"role": "assistant", "content": piece} if first else ({"content": piece} if finish is None else {})
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        else:
            choice = {"index": index, "text": piece, "logprobs": logprobs, "finish_reason": finish}
            if prompt is not None:
                choice["prompt_token_ids"] = prompt
        if ids is not None:
            choice["token_ids"] = ids
        out = {**head, "choices": [choice], **usage}
        if chat and prompt is not None:
            out["prompt_token_ids"] = prompt
        return out

    decode = (lambda ids: tt.tokenizer.decode(ids, skip_special_tokens=False)) if tt is not None else None
    for i, c in enumerate(reply.choices):
        prompt = reply.prompt_ids[i // request.n] if request.return_token_ids else None
        if chat or prompt is not None:
            yield chunk(i, "", first=True, prompt=prompt, ids=[] if request.return_token_ids else None)
        if c.ids is None:  # a chat policy: the text in one piece
            yield chunk(i, c.text)
        else:
            offset = 0
            for j, piece in enumerate(text_pieces(decode, c.ids, c.text)):
                logprobs = None
                if request.logprobs:
                    logprobs = (_chat_logprobs(c, j, j + 1, tt, request.tokens_as_ids) if chat else
                                _completion_logprobs(c, j, j + 1, tt, request.tokens_as_ids, offset))
                    offset += len(tt.text(c.ids[j]))
                yield chunk(i, piece, ids=[c.ids[j]] if request.return_token_ids else None, logprobs=logprobs)
        yield chunk(i, "", finish=c.finish_reason, ids=[] if request.return_token_ids else None)
    if request.include_usage:
        yield {**head, "choices": [], "usage": reply.usage()}
