"""One `tlc gen` run's connection to a model: live (HTTP, recorded) or replayed from a transcript.

Everything that changes what is sent to the model is in `RunSettings`, and a transcript
stores it; `--replay` takes it from there, so the replayed run asks the same questions.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

from tlc_llm.client import ChatClient, ChatSettings
from tlc_llm.output import OutputError
from tlc_llm.transcript import ReplayDivergence, ReplayTransport, Transcript, TranscriptError
from tlc_llm.transport import HttpTransport, redact

DEFAULT_TIMEOUT_S = 120.0  # one request: a slow model's long answer fits
DEFAULT_TOTAL_TIMEOUT_S = 300.0  # one model call, retries included: a dead endpoint costs 5 minutes, not 8

ENV_BASE_URL = "TLC_LLM_BASE_URL"
ENV_MODEL = "TLC_LLM_MODEL"
ENV_KEY = "TLC_LLM_API_KEY"


class SetupError(Exception):
    """The run cannot start (no endpoint, bad option); one-line message."""


@dataclass(frozen=True)
class RunSettings:
    """What determines the conversation; recorded in the transcript's `command`."""

    request: str
    target: str
    mode: str = "tl"  # "tl" or "vanilla"
    translate: str = "tlc"  # "tlc" or "llm"
    max_rounds: int = 3
    temperature: float = 0.2
    seed: int | None = None
    max_tokens: int | None = None
    max_retries: int = 3
    defines: dict[str, str] = field(default_factory=dict)
    eval_samples: int = 0
    filename: str = ""  # the name diagnostics and prompts use; a replay keeps it whatever -o says

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunSettings:
        """A transcript's `command`, checked field by field: a replay runs only settings a live run could have."""
        known = {f.name for f in fields(cls)}
        missing = {"request", "target"} - set(data)
        if missing:
            raise TranscriptError(f"its command lacks {', '.join(sorted(missing))}")
        problem = _command_problem(data)
        if problem:
            raise TranscriptError(f"its command's {problem}")
        return cls(**{k: v for k, v in data.items() if k in known})


_CHOICES = {"mode": ("tl", "vanilla"), "translate": ("tlc", "llm")}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _command_problem(data: dict[str, Any]) -> str | None:
    """The first field of a recorded command whose type or value no live run writes."""
    for name in ("request", "target", "filename", *_CHOICES):
        if name in data and not isinstance(data[name], str):
            return f"'{name}' is not text"
    for name, allowed in _CHOICES.items():
        if name in data and data[name] not in allowed:
            return f"'{name}' is not one of {', '.join(allowed)}"
    for name in ("max_rounds", "max_retries", "eval_samples"):
        if name in data and not (_is_int(data[name]) and data[name] >= 0):
            return f"'{name}' is not a whole number >= 0"
    for name in ("seed", "max_tokens"):
        if data.get(name) is not None and not _is_int(data[name]):
            return f"'{name}' is not a whole number"
    temperature = data.get("temperature", 0.0)
    if not (isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and math.isfinite(temperature)):
        return "'temperature' is not a number"
    defines = data.get("defines", {})
    if not (isinstance(defines, dict) and all(isinstance(v, str) for v in defines.values())):
        return "'defines' is not an object of NAME: VALUE texts"
    return None


@dataclass(frozen=True)
class Endpoint:
    base_url: str
    model: str
    api_key: str | None
    timeout_s: float = DEFAULT_TIMEOUT_S  # one HTTP request: connect, headers and the whole body
    total_timeout_s: float | None = None  # one model call, all retries and backoff included

    @classmethod
    def resolve(cls, base_url: str | None, model: str | None, api_key: str | None, timeout_s: float,
                total_timeout_s: float | None = None) -> Endpoint:
        base_url = base_url or os.environ.get(ENV_BASE_URL)
        model = model or os.environ.get(ENV_MODEL)
        api_key = api_key or os.environ.get(ENV_KEY) or None
        if not base_url:
            raise SetupError(f"no endpoint: pass --base-url or set {ENV_BASE_URL} (e.g. https://api.deepseek.com/v1)")
        if not model:
            raise SetupError(f"no model: pass --model or set {ENV_MODEL}")
        if not base_url.startswith(("http://", "https://")):
            raise SetupError(f"--base-url must start with http:// or https://, got {redact(base_url, api_key)!r}")
        return cls(base_url, model, api_key, timeout_s, total_timeout_s)

    def public(self) -> dict[str, str]:
        """What a transcript may show: no key, and no key hidden in the URL either."""
        return {"base_url": redact(self.base_url, self.api_key), "model": self.model}


@dataclass
class Session:
    client: ChatClient
    transcript: Transcript
    replay: ReplayTransport | None = None

    @property
    def secret(self) -> str | None:
        """The API key of a live run (None for a replay): what no output file may contain."""
        return self.transcript.secret

    def write_transcript(self, path: Path) -> Path:
        """Where the transcript went: `path`, or `path` with `-N` if a file has that name (none is replaced)."""
        try:
            return self.transcript.write(path)
        except OSError as exc:
            raise OutputError(f"cannot write the transcript {path}: {exc.strerror or 'I/O error'}") from None

    def finish_replay(self) -> None:
        """A replay that left recorded requests unasked diverged from the original run."""
        if self.replay is not None and self.replay.unused:
            raise ReplayDivergence(
                f"replay diverged: the run ended with {self.replay.unused} recorded request(s) not asked"
            )


def _chat_settings(settings: RunSettings, model: str, backoff_s: float, budget_s: float | None = None) -> ChatSettings:
    return ChatSettings(
        model=model, temperature=settings.temperature, seed=settings.seed, max_tokens=settings.max_tokens,
        max_retries=settings.max_retries, backoff_s=backoff_s, budget_s=budget_s,
    )


def live_session(settings: RunSettings, endpoint: Endpoint, backoff_s: float = 1.0,
                 sleep: Callable[[float], None] = time.sleep) -> Session:
    transcript = Transcript(settings.to_json(), endpoint.public(), secret=endpoint.api_key)
    transport = HttpTransport(endpoint.base_url, endpoint.api_key, endpoint.timeout_s)
    chat = _chat_settings(settings, endpoint.model, backoff_s, endpoint.total_timeout_s)
    client = ChatClient(transport, chat, transcript.record, sleep)
    return Session(client, transcript)


def replay_session(recorded: Transcript) -> tuple[RunSettings, Session]:
    """Settings and model come from the transcript; retries do not sleep (nothing to wait for) and
    no time budget applies: where the live run's budget ran out, the transcript says so."""
    try:
        settings = RunSettings.from_json(recorded.command)
    except TranscriptError as exc:
        raise TranscriptError(f"transcript {recorded.source}: {exc}; it was edited or damaged: record the run "
                              "again") from None
    model = str(recorded.endpoint.get("model", ""))
    if not model and recorded.exchanges:
        model = str(recorded.exchanges[0].get("request", {}).get("model", ""))
    transcript = Transcript(settings.to_json(), dict(recorded.endpoint))
    transport = ReplayTransport(recorded)
    client = ChatClient(transport, _chat_settings(settings, model, 0.0), transcript.record, lambda _s: None)
    return settings, Session(client, transcript, transport)


def transcript_path(directory: Path, stem: str) -> Path:
    return directory / f"{stem}.transcript.json"
