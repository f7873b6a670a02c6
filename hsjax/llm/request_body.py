"""A request body read and parsed within bounds, before anything else sees it (hsjax/llm/server.py).

Three bounds, each answered in OpenAI's error shape instead of an out-of-memory kill or a 500:
- size (413): an announced `Content-Length` past `max_bytes` is refused before a byte of the body
  is read; a chunked or unannounced body is counted as its pieces arrive and refused at the first
  piece past the bound. No more than `max_bytes` plus one piece is held (uvicorn buffers at most
  its 64 KiB flow-control window per connection until the app reads).
- nesting (400): arrays and objects nested deeper than `max_depth`. Python's JSON parser recurses
  once per level and raises RecursionError near 1,000; the bound is checked on the raw bytes first
  (strings blanked out, then a running count of brackets), so neither the parser nor anything that
  walks the parsed body later (repr, templates) meets a deep structure.
- syntax and encoding (400): anything `json.loads` refuses, non-UTF-8 included.
"""
from __future__ import annotations

import json
import re

import numpy as np

from hsjax.llm.openai_api import APIError, bad_request

MAX_BODY_BYTES = 4 << 20  # 4 MiB: 8 prompts of 32k-token contexts at ~4 characters a token fit
MAX_JSON_DEPTH = 32  # the deepest valid request (messages[i].content[j].text) is 5

# A JSON string, or the rest of the body from an unterminated one: every match attempt that starts at
# a quote succeeds at its first try, so blanking strings stays linear in the body's length.
_STRING = re.compile(rb'(?s)"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)')
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
_DEPTH_STEP = np.zeros(256, np.int8)
_DEPTH_STEP[list(b"[{")] = 1
_DEPTH_STEP[list(b"]}")] = -1


def too_large(max_bytes: int, announced: int | None = None) -> APIError:
    """413; the connection is closed after it, as the rest of the body is never read."""
    size = f"announces {announced} bytes, more than" if announced is not None else "runs past"
    return APIError(413, f"the request body {size} the {max_bytes} bytes this server takes "
                    "(serve.max_body_bytes); send a shorter prompt or raise the bound",
                    code="request_too_large", headers={"Connection": "close"})


def announced_length(headers) -> int | None:
    """The body's `Content-Length`, or None when it is sent chunked (uvicorn has already refused a
    malformed one with its own 400)."""
    value = headers.get("content-length")
    return int(value) if value is not None and value.strip().isdigit() else None


async def read_body(request, max_bytes: int) -> bytes:
    """The body of a Starlette `request`, at most `max_bytes` of it, or a 413 (see the module)."""
    announced = announced_length(request.headers)
    if announced is not None and announced > max_bytes:
        raise too_large(max_bytes, announced)
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > max_bytes:
            raise too_large(max_bytes)
    return bytes(body)


def json_depth(raw: bytes) -> int:
    """How deep arrays and objects nest in the JSON text `raw` (brackets inside strings ignored)."""
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    steps = _DEPTH_STEP[np.frombuffer(brackets, np.uint8)]
    return int(np.cumsum(steps, dtype=np.int32).max())


def parse_json(raw: bytes, max_depth: int = MAX_JSON_DEPTH):
    """The body parsed, or a 400 naming what is wrong with it (never echoing it)."""
    depth = json_depth(raw)
    if depth > max_depth:
        raise bad_request(f"the request body nests arrays and objects {depth} deep; this server takes at most "
                          f"{max_depth}")
    try:
        return json.loads(raw)
    except RecursionError:  # unreachable past the depth check; kept so a parser change cannot make it a 500
        raise bad_request(f"the request body nests deeper than the JSON parser allows (at most {max_depth})") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise bad_request(f"the request body is not valid JSON: {str(e)[:200]}") from None
