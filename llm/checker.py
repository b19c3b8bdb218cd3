"""The one place tlc_llm calls tlc's frontend and passes: `tlc.api.check_source`.

LLM output enters tlc only as `.tl` text through the same parser and diagnostics as a
hand-written file; this adapter reduces a `CheckResult` to what the repair loop needs.
"""
from __future__ import annotations

import importlib
import os
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
        except Exception as exc:  # noqa: BLE001 - a tlc bug must not look like a bad answer
            if os.environ.get("TLC_DEBUG"):
                raise
            raise ToolchainError(f"tlc crashed while checking {filename} ({type(exc).__name__}: {exc})") from None
        diagnostics = list(getattr(result, "diagnostics", []) or [])
        errors = sum(1 for d in diagnostics if getattr(d, "severity", "") == "error")
        remarks = tuple(d.render() for d in diagnostics if getattr(d, "severity", "") == "remark")
        ok = bool(result.ok)
        return Check(ok, errors if not ok else 0, str(getattr(result, "rendered", "") or ""), remarks)
