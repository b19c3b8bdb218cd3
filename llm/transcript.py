"""JSON transcripts of every LLM exchange, and a transport that replays them offline.

A transcript holds what is needed to rerun a `tlc gen` run with no network: the command's
settings, and each HTTP attempt's request payload and reply (or transport error). Replay
serves the replies in order and checks each request equals the recorded one, so a run that
would have asked something different stops with a clear message instead of drifting.
It holds no API key (the transport scrubs replies, and `dump` scrubs again) and no clock times, so replaying a run
writes the same transcript and the same `.tl`, byte for byte.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tlc_llm import __version__
from tlc_llm.client import Attempt, ProviderError
from tlc_llm.redact import redact
from tlc_llm.transport import HttpReply, TransportError

FORMAT = "tlc-llm-transcript/1"


class TranscriptError(Exception):
    """A transcript cannot be read or does not fit this run; one-line message."""


class ReplayDivergence(ProviderError):
    """The replayed run asked something the recorded run did not."""


def _attempt_record(index: int, attempt: Attempt) -> dict[str, Any]:
    record: dict[str, Any] = {"index": index, "label": attempt.label, "request": attempt.payload}
    if attempt.error is not None:
        record["error"] = {"kind": attempt.error.kind, "message": attempt.error.message}
    elif attempt.reply is not None:
        record["response"] = {
            "status": attempt.reply.status,
            "retry_after": attempt.reply.retry_after,
            "body": attempt.reply.body,
        }
    return record


@dataclass
class Transcript:
    """Grows as the run goes; `dump()` gives the canonical bytes written to disk."""

    command: dict[str, Any]
    endpoint: dict[str, Any] = field(default_factory=dict)
    exchanges: list[dict[str, Any]] = field(default_factory=list)
    outcome: dict[str, Any] = field(default_factory=dict)
    secret: str | None = field(default=None, repr=False, compare=False)  # never written: removed from `dump`

    def record(self, attempt: Attempt) -> None:
        self.exchanges.append(_attempt_record(len(self.exchanges), attempt))

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "tlc_llm": __version__,
            "command": self.command,
            "endpoint": self.endpoint,
            "exchanges": self.exchanges,
            "outcome": self.outcome,
        }

    def dump(self) -> str:
        text = json.dumps(self.to_json(), indent=2, ensure_ascii=False, sort_keys=True) + "\n"
        return redact(text, self.secret)  # a second line of defence: replies are scrubbed already

    def write(self, path: Path) -> None:
        """Atomic write, so an interrupted run never leaves half a transcript."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        tmp.write_text(self.dump(), encoding="utf-8")
        os.replace(tmp, path)


def load(path: Path) -> Transcript:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TranscriptError(f"transcript {path} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TranscriptError(f"transcript {path} is not readable JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise TranscriptError(f"{path} is not a tlc gen transcript (expected format {FORMAT!r})")
    exchanges = data.get("exchanges")
    if not isinstance(exchanges, list) or not isinstance(data.get("command"), dict):
        raise TranscriptError(f"transcript {path} lacks its command or exchanges")
    return Transcript(data["command"], data.get("endpoint") or {}, exchanges, data.get("outcome") or {})


def unique_path(path: Path) -> Path:
    """`x.json`, else `x-1.json`, `x-2.json`, …: transcripts are never overwritten."""
    if not path.exists():
        return path
    stem, suffix = path.name.split(".", 1) if "." in path.name else (path.name, "")
    n = 1
    while True:
        candidate = path.with_name(f"{stem}-{n}" + (f".{suffix}" if suffix else ""))
        if not candidate.exists():
            return candidate
        n += 1


def _first_difference(recorded: Any, actual: Any, where: str = "request") -> str:
    if type(recorded) is not type(actual):
        return where
    if isinstance(recorded, dict):
        for key in sorted(set(recorded) | set(actual)):
            if recorded.get(key, object()) != actual.get(key, object()):
                return _first_difference(recorded.get(key), actual.get(key), f"{where}.{key}")
    if isinstance(recorded, list):
        for i, (a, b) in enumerate(zip(recorded, actual)):
            if a != b:
                return _first_difference(a, b, f"{where}[{i}]")
        if len(recorded) != len(actual):
            return f"{where} (length {len(recorded)} recorded, {len(actual)} now)"
    return where


class ReplayTransport:
    """Serves a transcript's replies in order; verifies each request matches the record."""

    def __init__(self, transcript: Transcript) -> None:
        self._exchanges = transcript.exchanges
        self.position = 0

    def post(self, payload: dict[str, Any], timeout_s: float | None = None) -> HttpReply:
        if self.position >= len(self._exchanges):
            raise ReplayDivergence(
                f"replay diverged: the run made request #{self.position + 1} but the transcript has only "
                f"{len(self._exchanges)}"
            )
        record = self._exchanges[self.position]
        self.position += 1
        actual = json.loads(json.dumps(payload))  # compare as JSON, as it was recorded
        if record.get("request") != actual:
            where = _first_difference(record.get("request"), actual)
            raise ReplayDivergence(
                f"replay diverged at request #{self.position} ({record.get('label', '?')}): {where} differs "
                "from the transcript (prompts, tlc or options changed since it was recorded)"
            )
        if "error" in record:
            err = record["error"]
            raise TransportError(str(err.get("kind", "connection")), str(err.get("message", "")))
        response = record.get("response") or {}
        return HttpReply(int(response.get("status", 0)), str(response.get("body", "")), response.get("retry_after"))

    def scrub(self, text: str) -> str:
        return text  # a replay has no key, and its transcript none either

    @property
    def unused(self) -> int:
        return len(self._exchanges) - self.position
