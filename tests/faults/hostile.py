"""Hostile OpenAI-compatible servers for the fault-injection tests: real HTTP on 127.0.0.1 that
misbehaves on purpose.

    server = Hostile(status(500, "down"), drip(completion("late"), every_s=0.1), ok("hi"))
    ... ChatClient(ClientSettings(server.base_url, "m")) ...

Each POST runs the next behaviour of the script (the last one repeats). A behaviour is a function
`(handler, request) -> None` that writes the whole response itself, byte by byte if it likes:

    status(code, body, headers)   a complete response (str, bytes or JSON body)
    ok(content)                   200 with a chat completion saying `content`
    drip(body, every_s, part)     the body (or, part="headers", the status line and headers too)
                                  one byte every `every_s` seconds, until the client leaves
    truncated(body)               announces the whole body, sends half, closes the connection
    huge(n_bytes, announce)       n bytes of JSON whitespace, with Content-Length or without
                                  (close-delimited), stopping when the client leaves
    never()                       reads the request and never answers
    echo_key(code, template)      the request's Authorization header pasted into the reply or body
    by(fn)                        picks the behaviour from the request: fn(request) -> behaviour
    dbbench_oracle(tasks, special, opening)  plays DBBench as the oracle agent, except for the tasks
                                  in `special` ({task_id: behaviour}), and the first request of those
                                  in `opening` ({task_id: behaviour})
    surrogate_sql(text)           200 with SQL whose string literal holds `text` (default a lone
                                  surrogate, sent as the JSON escape \\udcff: valid JSON, unencodable str)
    invalid_utf8_sql()            200 whose body holds raw bytes that are not UTF-8 inside the SQL

Requests are recorded (path, headers, JSON body, arrival time) as by tests/fake_openai.py, whose
`completion` builds the replies. Start servers with the `hostile` fixture, which closes them; a
test module gets it with `from tests.faults.hostile import hostile`.
"""
from __future__ import annotations

import http.server
import json
import threading
import time
from typing import Callable

import pytest

from harness_envs.dbbench.agents import OracleAgent
from tests.fake_openai import Request, completion, read_request

Behaviour = Callable[[http.server.BaseHTTPRequestHandler, Request], None]
_GONE = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, OSError)


def _bytes(body) -> bytes:
    if isinstance(body, bytes):
        return body
    return (body if isinstance(body, str) else json.dumps(body)).encode()


def _head(status: int, headers: dict) -> bytes:
    lines = [f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}"]
    lines += [f"{name}: {value}" for name, value in {"Content-Type": "application/json", **headers}.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def status(code: int, body="", headers: dict | None = None) -> Behaviour:
    def send(handler, request):
        data = _bytes(body)
        handler.wfile.write(_head(code, {"Content-Length": len(data), **(headers or {})}) + data)
    return send


def ok(content: str | None) -> Behaviour:
    return status(200, completion(content))


def drip(body=None, every_s: float = 0.1, part: str = "body") -> Behaviour:
    def send(handler, request):
        data = _bytes(completion("late") if body is None else body)
        head = _head(200, {"Content-Length": len(data)})
        if part == "body":
            handler.wfile.write(head)
            handler.wfile.flush()
        for i in range(len(data) + (len(head) if part == "headers" else 0)):
            byte = (head + data)[i:i + 1] if part == "headers" else data[i:i + 1]
            handler.wfile.write(byte)
            handler.wfile.flush()
            time.sleep(every_s)
    return send


def truncated(body=None) -> Behaviour:
    def send(handler, request):
        data = _bytes(completion("cut short") if body is None else body)
        handler.wfile.write(_head(200, {"Content-Length": len(data)}) + data[:len(data) // 2])
        handler.wfile.flush()
        handler.close_connection = True
    return send


def huge(n_bytes: int, announce: bool = True) -> Behaviour:
    def send(handler, request):
        headers = {"Content-Length": n_bytes} if announce else {"Connection": "close"}
        handler.wfile.write(_head(200, headers))
        chunk = b" " * (64 << 10)
        sent = 0
        while sent < n_bytes:
            piece = chunk[:n_bytes - sent]
            handler.wfile.write(piece)
            sent += len(piece)
            handler.server.hostile.sent_bytes += len(piece)
        handler.close_connection = True
    return send


def never() -> Behaviour:
    def send(handler, request):
        while not handler.server.hostile.closed:
            time.sleep(0.05)
    return send


def echo_key(code: int, template: str = "bad auth: {auth}", as_reply: bool | None = None) -> Behaviour:
    """`template` with the request's Authorization header, as a reply's content (`as_reply`, by
    default for a 200) or in an error body (a 200 with one is malformed)."""
    def send(handler, request):
        text = template.format(auth=request.headers.get("Authorization", ""))
        reply = code == 200 if as_reply is None else as_reply
        status(code, completion(text) if reply else {"error": {"message": text}})(handler, request)
    return send


def by(pick: Callable[[Request], Behaviour]) -> Behaviour:
    def send(handler, request):
        pick(request)(handler, request)
    return send


def surrogate_sql(text: str = "\udcff") -> Behaviour:
    """A DBBench SQL action whose string literal holds `text`: `completion` writes the body with
    json.dumps, so a lone surrogate travels as its JSON escape and the client decodes it back."""
    return ok(f"Action: Operation\n```sql\nSELECT 'hostile {text} output';\n```")


def invalid_utf8_sql() -> Behaviour:
    """A 200 whose content holds bytes that are not UTF-8 (0xff 0xfe, a lone continuation 0x80)."""
    body = json.dumps(completion("Action: Operation\n```sql\nSELECT 'BYTES';\n```")).encode()
    return status(200, body.replace(b"BYTES", b"\xff\xfe\x80"))


def dbbench_oracle(tasks, special: dict | None = None, opening: dict | None = None) -> Behaviour:
    """The oracle agent behind HTTP: the task is the one whose question the request's messages hold
    (one episode per task); tasks named in `special` get their own behaviour instead, and those
    named in `opening` get theirs for their first request and the oracle's after."""
    agent, special, opening = OracleAgent(), dict(special or {}), dict(opening or {})
    opened, lock = set(), threading.Lock()

    def send(handler, request):
        messages = request.body["messages"]
        text = "\n".join(m["content"] for m in messages if m["role"] == "user")
        task = next(t for t in tasks if t.question in text)
        if task.task_id in special:
            return special[task.task_id](handler, request)
        with lock:
            first = task.task_id in opening and task.task_id not in opened
            opened.add(task.task_id)
        if first:
            return opening[task.task_id](handler, request)
        info = {"task": task, "task_id": task.task_id, "episode_id": task.task_id}
        ok(agent.chat([messages], None, [info])[0])(handler, request)
    return send


class Hostile:
    """The server; see the module docstring. `close()` is idempotent."""

    def __init__(self, *script: Behaviour):
        self.script = list(script) or [ok("ok")]
        self.requests: list[Request] = []
        self.sent_bytes = 0
        self.closed = False
        self._lock = threading.Lock()
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.hostile = self
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True).start()

    def next(self, request: Request) -> Behaviour:
        with self._lock:
            self.requests.append(request)
            return self.script.pop(0) if len(self.script) > 1 else self.script[0]

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.httpd.shutdown()
            self.httpd.server_close()


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        request = read_request(self)
        try:
            self.server.hostile.next(request)(self, request)
            self.wfile.flush()
        except _GONE:
            self.close_connection = True  # the client gave up, as it should


@pytest.fixture
def hostile():
    """Starts hostile servers: `hostile(*behaviours) -> Hostile`; all are closed after the test."""
    started = []

    def start(*script: Behaviour) -> Hostile:
        started.append(Hostile(*script))
        return started[-1]

    yield start
    for server in started:
        server.close()
