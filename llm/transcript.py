"""JSON transcripts of every LLM exchange, and a transport that replays them offline.

A transcript holds what is needed to rerun a `tlc gen` run with no network: the command's
settings, and each HTTP attempt's request payload and reply (or transport error). Replay
serves the replies in order and checks each request equals the recorded one, so a run that
would have asked something different stops with a clear message instead of drifting.
It holds no API key (each exchange is redacted as it is recorded, and `dump` redacts again) and no
clock times, so replaying a run writes the same transcript and the same `.tl`, byte for byte.
A transcript is input like any other: `load` refuses one that is not this format, or whose
fields have the wrong types, in one line, before anything is replayed.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tlc_llm import __version__
from tlc_llm.client import Attempt, ProviderError
from tlc_llm.redact import redact, redact_body, redact_values
from tlc_llm.transport import HttpReply, TransportError

FORMAT = "tlc-llm-transcript/1"


class TranscriptError(Exception):
    """A transcript cannot be read or does not fit this run; one-line message."""


class ReplayDivergence(ProviderError):
    """The replayed run asked something the recorded run did not."""


def _attempt_record(index: int, attempt: Attempt, secret: str | None) -> dict[str, Any]:
    """One exchange as recorded: the key removed from the request, the reply and the error."""
    request = redact_values(attempt.payload, secret)
    record: dict[str, Any] = {"index": index, "label": attempt.label, "request": request}
    if attempt.error is not None:
        record["error"] = {"kind": attempt.error.kind, "message": redact(attempt.error.message, secret)}
    elif attempt.reply is not None:
        record["response"] = {
            "status": attempt.reply.status,
            "retry_after": attempt.reply.retry_after,
            "body": redact_body(attempt.reply.body, secret),
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
    source: Path | None = field(default=None, compare=False)  # the file `load` read it from

    def record(self, attempt: Attempt) -> None:
        self.exchanges.append(_attempt_record(len(self.exchanges), attempt, self.secret))

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
        return redact(text, self.secret)  # a second line of defence: exchanges are redacted as recorded

    def write(self, path: Path) -> Path:
        """Write to `path`, or to the next free `-1`, `-2`, … name if a file took it meanwhile; returns
        where it went. Never replaces a file; an interrupted write leaves at most an empty one, never half."""
        text = self.dump()
        path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            path = unique_path(path)
            try:  # claim the name first, so a file that appears meanwhile is never replaced
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
                break
            except FileExistsError:
                continue
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
        return path


def load(path: Path) -> Transcript:
    """Read and check a transcript; every problem is one `TranscriptError` line naming `path`."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TranscriptError(f"transcript {path} does not exist") from None
    except IsADirectoryError:
        raise TranscriptError(f"transcript {path} is a directory; pass the .transcript.json file") from None
    except UnicodeDecodeError:
        raise TranscriptError(f"transcript {path} is not UTF-8 text; pass a file that tlc gen wrote") from None
    except OSError as exc:
        raise TranscriptError(f"cannot read transcript {path}: {exc.strerror or 'I/O error'}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TranscriptError(f"transcript {path} is not valid JSON (line {exc.lineno}, column {exc.colno}); "
                              "pass a file that tlc gen wrote") from None
    except (ValueError, RecursionError):
        raise TranscriptError(f"transcript {path} is not a tlc gen transcript (a number too long or nesting "
                              "too deep)") from None
    if not isinstance(data, dict) or "format" not in data:
        raise TranscriptError(f"{path} is not a tlc gen transcript (no 'format': {FORMAT!r} field)")
    if data["format"] != FORMAT:
        raise TranscriptError(_other_version(path, data))
    problem = _structure_problem(data)
    if problem:
        raise TranscriptError(f"transcript {path}: {problem}; it was edited or damaged: record the run again")
    return Transcript(data["command"], data.get("endpoint") or {}, data["exchanges"], data.get("outcome") or {},
                      source=path)


def _other_version(path: Path, data: dict[str, Any]) -> str:
    recorded = data.get("format")
    writer = data.get("tlc_llm")
    by = f" (written by tlc_llm {writer})" if isinstance(writer, str) and len(writer) < 40 else ""
    shown = recorded if isinstance(recorded, str) and len(recorded) < 60 else "an unknown format"
    return (f"transcript {path} has format {shown!r}{by}; this tlc gen (tlc_llm {__version__}) replays only "
            f"{FORMAT!r}: replay it with the tlc_llm that recorded it")


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _exchange_problem(record: Any) -> str | None:
    if not isinstance(record, dict):
        return "is not a JSON object"
    if not isinstance(record.get("request"), dict):
        return "has no request object"
    if not isinstance(record.get("label", ""), str):
        return "has a label that is not text"
    if "error" in record:
        error = record["error"]
        if not (isinstance(error, dict) and isinstance(error.get("kind"), str)
                and isinstance(error.get("message", ""), str)):
            return "has an error without a text 'kind' and 'message'"
        return None
    response = record.get("response")
    if not isinstance(response, dict):
        return "has neither a response nor an error"
    status, retry_after = response.get("status"), response.get("retry_after")
    if not (_is_count(status) and 100 <= status <= 599):
        return "has a response status that is not an HTTP status (100-599)"
    if not isinstance(response.get("body", ""), str):
        return "has a response body that is not text"
    if retry_after is not None and not (isinstance(retry_after, (int, float)) and not isinstance(retry_after, bool)
                                        and math.isfinite(retry_after) and retry_after >= 0):
        return "has a retry_after that is not a number of seconds >= 0"
    return None


def _structure_problem(data: dict[str, Any]) -> str | None:
    """What is wrong with a transcript's outline and exchanges (the command is checked by `RunSettings`)."""
    if not isinstance(data.get("command"), dict):
        return "it has no 'command' object"
    if not isinstance(data.get("exchanges"), list):
        return "it has no 'exchanges' list"
    for name in ("endpoint", "outcome"):
        if not isinstance(data.get(name) or {}, dict):
            return f"its '{name}' is not an object"
    endpoint = data.get("endpoint") or {}
    if not all(isinstance(endpoint.get(key, ""), str) for key in ("base_url", "model")):
        return "its endpoint's base_url or model is not text"
    for number, record in enumerate(data["exchanges"], 1):
        problem = _exchange_problem(record)
        if problem:
            return f"exchange #{number} {problem}"
    return None


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
