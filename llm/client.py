"""Chat completions over a `Transport`: the request payload, bounded retries, the answer text.

Retry policy (why): 429 and 5xx are the endpoint telling us to come back later, and a
timeout or dropped connection is usually transient; a malformed 200 (truncated JSON, no
choices) is most often a proxy hiccup, so it gets the same bounded retries. Anything else
(400, 401, 404, …) will not get better by asking again and fails at once. A call also has a
wall-clock budget (`budget_s`) over all its attempts and backoff sleeps, so a dead endpoint
costs at most that long, not retries × timeout.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Callable

from tlc_llm.transport import HttpReply, Transport, TransportError, seconds_text

Message = dict[str, str]
BUDGET = "budget"  # a TransportError kind: no POST made, the call's time budget is spent
MIN_ATTEMPT_S = 0.05  # less budget than this left: stop rather than send a request that cannot finish


class ProviderError(Exception):
    """The endpoint gave no usable answer; the message is one line and key-free."""


class _Malformed(Exception):
    pass


@dataclass(frozen=True)
class ChatSettings:
    model: str
    temperature: float = 0.2
    seed: int | None = None
    max_tokens: int | None = None
    max_retries: int = 3
    backoff_s: float = 1.0
    backoff_max_s: float = 30.0
    budget_s: float | None = None  # one call, all attempts and sleeps; None: attempts × timeout


@dataclass(frozen=True)
class Attempt:
    """One HTTP attempt as the client saw it; the transcript stores exactly this."""

    label: str
    payload: dict[str, Any]
    reply: HttpReply | None
    error: TransportError | None


Observer = Callable[[Attempt], None]


def build_payload(settings: ChatSettings, messages: list[Message]) -> dict[str, Any]:
    payload: dict[str, Any] = {"model": settings.model, "messages": messages, "temperature": settings.temperature}
    if settings.seed is not None:
        payload["seed"] = settings.seed
    if settings.max_tokens is not None:
        payload["max_tokens"] = settings.max_tokens
    return payload


def answer_text(body: str, scrub: Callable[[str], str] = lambda text: text) -> str:
    """The first choice's message content, exactly as sent, or `_Malformed` saying what was wrong
    (`scrub` removes the key from what that message quotes before it is shortened)."""
    try:
        data = json.loads(body)
    except json.JSONDecodeError as exc:
        if body.lstrip()[:1] == "<":
            raise _Malformed("reply is not valid JSON but an HTML page (a proxy or a web server answered: "
                             "check that --base-url is the API's address, e.g. https://host/v1)") from None
        raise _Malformed(f"reply is not valid JSON (truncated?) at char {exc.pos}") from None
    except (ValueError, RecursionError):  # a number past Python's digit limit; nesting past its stack
        raise _Malformed("reply is not JSON that tlc gen can read (a number too long or nesting too deep)") from None
    if not isinstance(data, dict):
        raise _Malformed("reply is not a JSON object")
    if "error" in data and "choices" not in data:
        raise _Malformed(f"endpoint reported an error: {_short(scrub(json.dumps(data['error'])))}")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        raise _Malformed("reply has an empty choice list")
    first = choices[0]
    message = first.get("message") if isinstance(first, dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    if content is not None and not isinstance(content, str):
        raise _Malformed(f"reply's first choice has content that is not text (a JSON {_json_kind(content)})")
    if not isinstance(content, str) or not content.strip():
        raise _Malformed("reply's first choice has no message content")
    return content


def _json_kind(value: Any) -> str:
    kinds = ((bool, "boolean"), (int, "number"), (float, "number"), (list, "array"), (dict, "object"))
    return next((name for kind, name in kinds if isinstance(value, kind)), "value")


def _short(text: str, limit: int = 160) -> str:
    one_line = " ".join(text.split())
    return one_line if len(one_line) <= limit else one_line[: limit - 1] + "…"


class ChatClient:
    """Sends chat requests with bounded retries; every attempt is shown to `observer`."""

    def __init__(
        self,
        transport: Transport,
        settings: ChatSettings,
        observer: Observer | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.transport = transport
        self.settings = settings
        self.observer = observer
        self.sleep = sleep
        self.clock = clock
        self.calls = 0  # HTTP attempts made, for the cost report

    def complete(self, messages: list[Message], label: str) -> str:
        payload = build_payload(self.settings, messages)
        attempts = self.settings.max_retries + 1
        ends_at = None if self.settings.budget_s is None else self.clock() + self.settings.budget_s
        problem, timed_out, made = "", False, 0
        for attempt in range(attempts):
            reply, error = self._send(payload, label, ends_at)
            if error is not None and error.kind == BUDGET:
                raise self._failure(label, made, problem, timed_out, budget=error)
            made += 1
            timed_out = error is not None and error.kind == "timeout"
            if error is not None:
                problem = f"{error.kind}: {error.message}"
            elif reply is not None and reply.status == 200:
                try:
                    return answer_text(reply.body, self.transport.scrub)  # parsed as sent: never redacted
                except _Malformed as exc:
                    problem = str(exc)
            elif reply is not None and (reply.status == 429 or reply.status >= 500):
                problem = f"HTTP {reply.status}: {self._quoted(reply.body) or 'no body'}"
            elif reply is not None:
                raise ProviderError(self.transport.scrub(
                    f"{label}: endpoint refused the request: HTTP {reply.status}: {self._quoted(reply.body)}"))
            if attempt + 1 < attempts:
                self.sleep(self._delay(attempt, reply, ends_at))
        raise self._failure(label, made, problem, timed_out)

    def _quoted(self, body: str) -> str:
        """A reply body in a message: redacted whole, then shortened, so no part of the key survives the cut."""
        return _short(self.transport.scrub(body))

    def _failure(self, label: str, made: int, problem: str, timed_out: bool,
                 budget: TransportError | None = None) -> ProviderError:
        """One line; built from recorded errors only, so a replay fails with the same words."""
        spent = f" ({budget.message})" if budget is not None else ""
        hint = ""
        if timed_out:
            flags = "--timeout / --total-timeout" if budget is not None else "--timeout"
            hint = f"; the endpoint did not answer in time: check it, or raise {flags} if the model needs longer"
        message = f"{label}: no usable answer after {made} attempt(s){spent}; last: {problem or 'none'}{hint}"
        return ProviderError(self.transport.scrub(message))

    def _send(self, payload: dict[str, Any], label: str,
              ends_at: float | None) -> tuple[HttpReply | None, TransportError | None]:
        """One POST, or (budget spent) a recorded stop, so that a replay stops at the same place."""
        reply: HttpReply | None = None
        error: TransportError | None = None
        left = None if ends_at is None else ends_at - self.clock()
        if left is not None and left < MIN_ATTEMPT_S:
            budget = seconds_text(self.settings.budget_s or 0)
            error = TransportError(BUDGET, f"the {budget} s budget for one call, retries included, is spent")
        else:
            try:
                reply = self.transport.post(payload, left)
            except TransportError as exc:
                error = exc
        if error is None or error.kind != BUDGET:
            self.calls += 1
        if self.observer is not None:
            self.observer(Attempt(label, payload, reply, error))
        return reply, error

    def _delay(self, attempt: int, reply: HttpReply | None, ends_at: float | None) -> float:
        backoff = self.settings.backoff_s * (2 ** min(attempt, 32))  # capped below; 2**1100 is past float
        if reply is not None and reply.retry_after is not None:
            backoff = max(backoff, reply.retry_after)
        backoff = min(backoff, self.settings.backoff_max_s)
        if ends_at is not None:  # never sleep past the budget: the next attempt then stops at once
            backoff = min(backoff, max(ends_at - self.clock(), 0.0))
        return backoff
