"""One HTTP POST to an OpenAI-compatible `/chat/completions` endpoint, nothing more.

Retries, parsing and recording live above this layer (client.py, transcript.py). The API
key is attached here and scrubbed here from everything that leaves: reply bodies and
error messages, so no caller can ever log or record it.
"""
from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Protocol

REDACTED = "[REDACTED]"
MAX_BODY_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class HttpReply:
    """What came back: status, body text (key-scrubbed), and a Retry-After hint in seconds."""

    status: int
    body: str
    retry_after: float | None = None


class TransportError(Exception):
    """The request got no HTTP reply: `kind` is "timeout" or "connection"."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message


class Transport(Protocol):
    def post(self, payload: dict[str, Any]) -> HttpReply: ...


def redact(text: str, secret: str | None) -> str:
    """Replace every occurrence of `secret` in `text`; a no-op without a secret."""
    if not secret:
        return text
    return text.replace(secret, REDACTED)


def chat_url(base_url: str) -> str:
    """`https://host/v1` → `https://host/v1/chat/completions`; a full URL is kept as is."""
    base = base_url.rstrip("/")
    if base.endswith("/chat/completions"):
        return base
    return base + "/chat/completions"


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # HTTP-date form: ignore, our own backoff applies
    return seconds if seconds >= 0 else None


class HttpTransport:
    """urllib-based POST with a total deadline (not only a per-socket-read timeout)."""

    def __init__(self, base_url: str, api_key: str | None, timeout_s: float) -> None:
        self.url = chat_url(base_url)
        self._key = api_key or None
        self.timeout_s = timeout_s

    def post(self, payload: dict[str, Any]) -> HttpReply:
        data = json.dumps(payload).encode("utf-8")
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        request = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
        deadline = time.monotonic() + self.timeout_s
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as resp:
                body = self._read(resp, deadline)
                return HttpReply(resp.status, self._clean(body), _retry_after(resp.headers.get("Retry-After")))
        except urllib.error.HTTPError as exc:
            try:
                body = self._read(exc, deadline)
            except TransportError:
                body = b""
            return HttpReply(exc.code, self._clean(body), _retry_after(exc.headers.get("Retry-After")))
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, (socket.timeout, TimeoutError)):
                raise self._timeout() from None
            raise TransportError("connection", self._scrub(f"cannot reach {self.url}: {exc.reason}")) from None
        except (socket.timeout, TimeoutError):
            raise self._timeout() from None
        except (http.client.HTTPException, ConnectionError, OSError) as exc:
            detail = type(exc).__name__ + (f": {exc}" if str(exc) else "")
            raise TransportError("connection", self._scrub(f"connection to {self.url} failed ({detail})")) from None

    def _read(self, resp: Any, deadline: float) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            if time.monotonic() > deadline:
                raise self._timeout()
            chunk = resp.read(65536)
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise TransportError("connection", f"reply from {self._scrub(self.url)} exceeds {MAX_BODY_BYTES} bytes")
            chunks.append(chunk)

    def _timeout(self) -> TransportError:
        return TransportError("timeout", self._scrub(f"no reply from {self.url} within {self.timeout_s:g} s"))

    def _clean(self, body: bytes) -> str:
        # errors="replace": a reply is processed exactly as it is recorded, so replay matches
        return self._scrub(body.decode("utf-8", errors="replace"))

    def _scrub(self, text: str) -> str:
        return redact(text, self._key)
