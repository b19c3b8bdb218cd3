"""One HTTP POST to an OpenAI-compatible `/chat/completions` endpoint, nothing more.

Retries, parsing and recording live above this layer (client.py, transcript.py). The API
key is attached here, and removed here from the error messages this layer writes (a URL may
carry it). Reply bodies come back exactly as received: they are parsed, and a key cut out of
them could break the JSON or the program (`1` in `"index": 1`); what is shown or recorded of
them is redacted where it is shown or recorded. Each POST has one wall-clock
deadline covering connect, headers and the whole body: a server that trickles bytes cannot
keep resetting a per-read socket timeout.
"""
from __future__ import annotations

import http.client
import json
import math
import socket
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Protocol

from tlc_llm.redact import REDACTED, redact

__all__ = ["REDACTED", "HttpReply", "HttpTransport", "Transport", "TransportError", "chat_url", "redact",
           "seconds_text"]

MAX_BODY_BYTES = 16 * 1024 * 1024
CHUNK_BYTES = 65536


@dataclass(frozen=True)
class HttpReply:
    """What came back: status, body text (as received, not redacted), and a Retry-After hint in seconds."""

    status: int
    body: str
    retry_after: float | None = None


class TransportError(Exception):
    """The request got no HTTP reply: `kind` is "timeout" or "connection" (or "budget", from the
    client: no request was sent because the call's time budget was spent)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message


class Transport(Protocol):
    def post(self, payload: dict[str, Any], timeout_s: float | None = None) -> HttpReply:
        """`timeout_s` shortens this POST's deadline (the caller's budget is nearly spent)."""
        ...

    def scrub(self, text: str) -> str:
        """Remove the API key from a message about to be shown (an error quoting a reply, say)."""
        ...


def chat_url(base_url: str) -> str:
    """`https://host/v1` → `https://host/v1/chat/completions`; a full URL is kept as is."""
    base = base_url.rstrip("/")
    if base.endswith("/chat/completions"):
        return base
    return base + "/chat/completions"


def seconds_text(value: float) -> str:
    """`120`, `0.1`, `57.3`: seconds as a person writes them."""
    return f"{value:g}" if value < 1 or value == int(value) else f"{value:.1f}"


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # HTTP-date form: ignore, our own backoff applies
    return seconds if math.isfinite(seconds) and seconds >= 0 else None  # `inf` would not fit a transcript


class _Deadline:
    """One request's wall-clock budget. A watchdog shuts the connection's socket down when it
    expires, which ends a read blocked in connect, in the headers or in the body."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds
        self.expired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(max(seconds, 0.0), self._expire)
        self._timer.daemon = True

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()

    def remaining(self) -> float:
        return max(self.at - time.monotonic(), 0.001)

    def passed(self) -> bool:
        return self.expired or time.monotonic() >= self.at

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            if self.expired:
                _shutdown(sock)

    def tighten(self) -> None:
        """Per-read socket timeouts no longer than what is left of the deadline."""
        with self._lock:
            for sock in self._sockets:
                try:
                    sock.settimeout(self.remaining())
                except OSError:
                    pass

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._sockets:
                _shutdown(sock)


def _shutdown(sock: socket.socket) -> None:
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the TCP socket, under TLS too
    except OSError:
        pass


def _is_timeout(exc: BaseException) -> bool:
    reason = getattr(exc, "reason", None)  # URLError wraps the socket's error
    return isinstance(exc, (socket.timeout, TimeoutError)) or isinstance(reason, (socket.timeout, TimeoutError))


class _Watched:
    """Mixed into an HTTP(S)Connection: connect is bounded by the deadline, which gets the socket."""

    sock: socket.socket

    def __init__(self, host: str, *, deadline: _Deadline, **kwargs: Any) -> None:
        kwargs["timeout"] = deadline.remaining()
        super().__init__(host, **kwargs)  # type: ignore[call-arg]
        self._deadline = deadline

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]
        self._deadline.watch(self.sock)


class _WatchedConnection(_Watched, http.client.HTTPConnection):
    pass


class _WatchedHTTPSConnection(_Watched, http.client.HTTPSConnection):
    pass


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_WatchedConnection, req, deadline=self.deadline)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_WatchedHTTPSConnection, req, deadline=self.deadline)


class HttpTransport:
    """urllib-based POST (proxies from the environment still apply) with one deadline per request."""

    def __init__(self, base_url: str, api_key: str | None, timeout_s: float) -> None:
        self.url = chat_url(base_url)
        self._key = api_key or None
        self.timeout_s = timeout_s

    def post(self, payload: dict[str, Any], timeout_s: float | None = None) -> HttpReply:
        data = json.dumps(payload).encode("utf-8")
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        request = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
        limit = self.timeout_s if timeout_s is None else min(self.timeout_s, timeout_s)
        with _Deadline(limit) as deadline:
            opener = urllib.request.build_opener(_HTTPHandler(deadline), _HTTPSHandler(deadline))
            try:
                return self._exchange(opener, request, deadline)
            except (OSError, http.client.HTTPException) as exc:  # the watchdog's shutdown shows as either
                if deadline.passed() or _is_timeout(exc):
                    raise self._timeout(deadline) from None
                raise self._connection_error(exc) from None

    def _exchange(self, opener: urllib.request.OpenerDirector, request: urllib.request.Request,
                  deadline: _Deadline) -> HttpReply:
        try:
            with opener.open(request) as resp:
                body = self._read(resp, deadline)
                return HttpReply(resp.status, self._clean(body), _retry_after(resp.headers.get("Retry-After")))
        except urllib.error.HTTPError as exc:
            try:
                body = self._read(exc, deadline)
            except (TransportError, OSError, http.client.HTTPException):
                body = b""  # the status alone says enough
            finally:
                exc.close()
            return HttpReply(exc.code, self._clean(body), _retry_after(exc.headers.get("Retry-After")))

    def _read(self, resp: Any, deadline: _Deadline) -> bytes:
        read = getattr(resp, "read1", None) or resp.read  # read1: whatever has arrived, not a full chunk
        chunks: list[bytes] = []
        size = 0
        while True:
            if deadline.passed():
                raise self._timeout(deadline)
            deadline.tighten()
            chunk = read(CHUNK_BYTES)
            if deadline.passed():
                raise self._timeout(deadline)
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise TransportError("connection", f"reply from {self._scrub(self.url)} exceeds {MAX_BODY_BYTES} bytes")
            chunks.append(chunk)

    def _timeout(self, deadline: _Deadline) -> TransportError:
        within = seconds_text(deadline.seconds)
        return TransportError("timeout", self._scrub(f"no reply from {self.url} within {within} s"))

    def _connection_error(self, exc: Exception) -> TransportError:
        if isinstance(exc, urllib.error.URLError):
            return TransportError("connection", self._scrub(f"cannot reach {self.url}: {exc.reason}"))
        detail = type(exc).__name__ + (f": {exc}" if str(exc) else "")
        return TransportError("connection", self._scrub(f"connection to {self.url} failed ({detail})"))

    @staticmethod
    def _clean(body: bytes) -> str:
        # errors="replace": a reply is processed exactly as it is recorded, so replay matches
        return body.decode("utf-8", errors="replace")

    def _scrub(self, text: str) -> str:
        return redact(text, self._key)

    def scrub(self, text: str) -> str:
        return self._scrub(text)
