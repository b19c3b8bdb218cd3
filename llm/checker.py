"""The one place tlc_llm calls tlc's frontend and passes: `tlc.api.check_source`.

LLM output enters tlc only as `.tl` text through the same parser and diagnostics as a
hand-written file; this adapter reduces a `CheckResult` to what the repair loop needs. If tlc
fails internally on an answer (a RecursionError on a huge expression, any non-TlcError), that
becomes one more diagnostic for the model, never an abort of the whole run.
"""
from __future__ import annotations

import importlib
import os
import sys
import traceback
from dataclasses import dataclass, field
from types import ModuleType


class ToolchainError(Exception):
    """tlc itself is missing or failed (not the model's fault); one-line message."""


@dataclass(frozen=True)
class Check:
    ok: bool
    errors: int
    rendered: str  # clang-style diagnostics: what the model is shown in a repair round
    remarks: tuple[str, ...] = field(default_factory=tuple)  # repairs tlc made by itself
    internal: str = ""  # "RecursionError: …" when tlc itself failed on this text


def tlc_api() -> ModuleType:
    try:
        return importlib.import_module("tlc.api")
    except ImportError as exc:
        raise ToolchainError(f"tlc's frontend is not available (import tlc.api failed: {exc})") from None


class Checker:
    """Checks TL text with tlc (frontend + passes), with fixed `-D` defines for the run."""

    def __init__(self, defines: dict[str, str] | None = None) -> None:
        self.api = tlc_api()
        self.defines = dict(defines or {})

    def check(self, text: str, filename: str, *, sketch: bool = False) -> Check:
        from tlc.diagnostics import TlcError

        try:
            result = self.api.check_source(text, filename, sketch=sketch, defines=self.defines or None)
        except TlcError as exc:  # the contract says diagnostics come back, but do not trust it blindly
            return Check(False, max(len(exc.diagnostics), 1), exc.render())
        except Exception as exc:  # noqa: BLE001 - tlc failed on this text: the model may avoid it
            if os.environ.get("TLC_DEBUG"):
                traceback.print_exception(exc, file=sys.stderr)
            return internal_failure(text, filename, exc)
        diagnostics = list(getattr(result, "diagnostics", []) or [])
        errors = sum(1 for d in diagnostics if getattr(d, "severity", "") == "error")
        remarks = tuple(d.render() for d in diagnostics if getattr(d, "severity", "") == "remark")
        ok = bool(result.ok)
        return Check(ok, errors if not ok else 0, str(getattr(result, "rendered", "") or ""), remarks)


_OPERATORS = "+-*/%()[]"


def _heaviest_line(text: str) -> int:
    """The 1-based line with the most operators and brackets (then the longest): the likely culprit."""
    lines = text.splitlines() or [""]
    weights = [(sum(line.count(c) for c in _OPERATORS), len(line)) for line in lines]
    return max(range(len(lines)), key=lambda i: weights[i]) + 1


def internal_failure(text: str, filename: str, exc: Exception) -> Check:
    """A clang-style diagnostic the model can act on; tlc gave no location, so name the heaviest line."""
    detail = f"{type(exc).__name__}: {' '.join(str(exc).split()) or 'no message'}"
    line = _heaviest_line(text)
    rendered = (
        f"{filename}:{line}:1: error: internal error while checking your program: {detail}; simplify the "
        f"expression at line {line} (fewer terms, fewer nested parentheses; bind part of it to a Param) "
        "or write this statement another way\n"
    )
    return Check(False, 1, rendered, internal=detail)
