"""A real OpenAI-compatible chat-completions server on 127.0.0.1, replaying a script.

Each POST to /v1/chat/completions takes the next scripted `Reply`: a chat answer, a raw
body (garbage, truncated JSON), an HTTP status (429, 500), a delay (slow or silent server),
a reply trickled one byte at a time, a body that echoes the request's API key, or a dropped
connection. Requests are kept for assertions (headers included).
"""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Union


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: str | bytes = ""  # bytes: sent as they are (a body that is not UTF-8)
    delay_s: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    drop: bool = False  # close the connection without answering
    trickle_s: float = 0.0  # seconds between single bytes of the body (a socket timeout never fires)
    trickle_headers: bool = False  # trickle the status line and headers too
    echo_key: Callable[[str], str] | None = None  # the body, built from the request's bearer token


def completion(content: str, *, finish_reason: str = "stop") -> str:
    return json.dumps({
        "id": "chatcmpl-test", "object": "chat.completion", "model": "scripted",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                     "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    })


def answer(content: str) -> Reply:
    return Reply(200, completion(content))


def fenced(code: str, tag: str = "tl", chatter: str = "Here is the program.") -> Reply:
    return answer(f"{chatter}\n\n```{tag}\n{code.rstrip()}\n```\n\nIt follows the rules.")


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any] | None


Scripted = Union[Reply, Callable[[dict[str, Any]], Reply]]  # a callable sees the request body


class ScriptedServer:
    def __init__(self, script: list[Scripted] | None = None) -> None:
        self.script: list[Scripted] = list(script or [])
        self.received: list[Received] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw)
                except json.JSONDecodeError:
                    body = None
                with server._lock:
                    server.received.append(Received(self.path, dict(self.headers), body))
                    reply = server.script.pop(0) if server.script else Reply(500, '{"error": "script exhausted"}')
                if callable(reply):
                    reply = reply(body or {})
                if self.path.rstrip("/") != "/v1/chat/completions":
                    reply = Reply(404, '{"error": "not found"}')
                if reply.delay_s:
                    server._stop.wait(reply.delay_s)
                if reply.drop:
                    self.close_connection = True
                    self.connection.close()
                    return
                body = reply.body
                if reply.echo_key is not None:
                    body = reply.echo_key(self.headers.get("Authorization", "").removeprefix("Bearer "))
                data = body.encode("utf-8") if isinstance(body, str) else body
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for key, value in reply.headers.items():
                        self.send_header(key, value)
                    if reply.trickle_headers:
                        head, self._headers_buffer = b"".join(self._headers_buffer) + b"\r\n", []
                        self._trickle(head, reply.trickle_s)
                    else:
                        self.end_headers()
                    if reply.trickle_s:
                        self._trickle(data, reply.trickle_s)
                    else:
                        self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)

            def _trickle(self, data: bytes, every_s: float) -> None:
                for i in range(len(data)):
                    if server._stop.is_set():
                        return
                    self.wfile.write(data[i : i + 1])
                    self.wfile.flush()
                    server._stop.wait(every_s)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> ScriptedServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def one_error_line(output: str) -> str:
    """Every failure is exactly one `tlc gen: error:` line and never a traceback."""
    assert "Traceback" not in output
    errors = [ln for ln in output.splitlines() if ln.startswith("tlc gen: error: ")]
    assert len(errors) == 1, output
    return errors[0]
