"""One stage of the workflow: ask, extract, check, and feed diagnostics back, boundedly.

Repair rounds carry only the original prompt, the last answer and the diagnostics (not the
whole history), so a round costs about the same tokens as the first call. Problems the
passes repair by themselves (a missing Reshape, a unique transpose fix) come back as
remarks on an `ok` check and need no round trip.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

from tlc_llm.checker import Check
from tlc_llm.client import Message
from tlc_llm.extract import Candidate, candidates, pick_best
from tlc_llm.prompts import no_code_prompt, repair_prompt


class Completer(Protocol):
    def complete(self, messages: list[Message], label: str) -> str: ...


class StageFailed(Exception):
    """No valid answer within the round budget; `details` holds the last diagnostics."""

    def __init__(self, message: str, details: str = "") -> None:
        super().__init__(message)
        self.details = details


@dataclass(frozen=True)
class StageResult:
    text: str
    check: Check
    answers: int  # model answers this stage took (1 = right the first time)
    problems: tuple[str, ...] = field(default_factory=tuple)  # first line of each rejected answer's problem


CheckFn = Callable[[str], Check]
ExtractFn = Callable[[str], list[Candidate]]


@dataclass(frozen=True)
class Dialect:
    """What a stage asks for: how to find the code in an answer and how to ask again."""

    extract: ExtractFn
    repair: Callable[[str, str], str]  # (filename, diagnostics) -> next prompt
    no_code: str
    what: str = "TL"


def tl_dialect() -> Dialect:
    return Dialect(candidates, repair_prompt, no_code_prompt())


def first_error_line(rendered: str) -> str:
    for line in rendered.splitlines():
        if ": error: " in line or line.startswith("error: "):
            return line.strip()
    return next((line.strip() for line in rendered.splitlines() if line.strip()), "rejected without a message")


def run_stage(
    client: Completer,
    system: str,
    prompt: str,
    check: CheckFn,
    *,
    label: str,
    filename: str,
    max_rounds: int,
    dialect: Dialect | None = None,
) -> StageResult:
    """Ask once, then up to `max_rounds` repair rounds; return the first answer tlc accepts."""
    dialect = dialect or tl_dialect()
    base: list[Message] = [{"role": "system", "content": system}, {"role": "user", "content": prompt}]
    messages = base
    problems: list[str] = []
    details = ""
    internal = ""
    for round_no in range(max_rounds + 1):
        answer = client.complete(messages, f"{label}/round-{round_no}")
        found = dialect.extract(answer)
        if not found:
            problems.append(f"the answer contains no {dialect.what} code block")
            details, internal, feedback = "", "", dialect.no_code
        else:
            chosen = pick_best(found, check, key=lambda c: (not c.ok, c.errors))
            assert chosen is not None  # found is non-empty
            candidate, result = chosen
            if result.ok:
                return StageResult(candidate.text, result, round_no + 1, tuple(problems))
            problems.append(first_error_line(result.rendered))
            details, internal = result.rendered, result.internal
            feedback = dialect.repair(filename, result.rendered or "error: the program was rejected")
        messages = base + [{"role": "assistant", "content": answer}, {"role": "user", "content": feedback}]
    answers = max_rounds + 1
    note = " (a failure inside tlc, not only in the answer: rerun with TLC_DEBUG=1 for a traceback)" if internal else ""
    raise StageFailed(
        f"{label}: no valid {dialect.what} after {answers} answer(s) ({max_rounds} repair round(s)); "
        f"last problem: {problems[-1]}{note}",
        details,
    )
