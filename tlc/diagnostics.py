"""Diagnostics: one `Diagnostic` dataclass and one renderer, clang style.

Every user-facing problem in tlc — parse errors, semantic errors, pass remarks, NVRTC
failures mapped back to `.tl` lines — is a `Diagnostic`; the CLI prints them and exits 1,
and the LLM repair loop feeds the same text back to the model.
"""
from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field
from typing import Iterable, Sequence


@dataclass(frozen=True)
class Loc:
    """A source span: 1-based line and column, `end_col` exclusive (same line)."""

    file: str
    line: int
    col: int
    end_col: int = 0

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


UNKNOWN_LOC = Loc("<unknown>", 0, 0)


@dataclass(frozen=True)
class Note:
    message: str
    loc: Loc | None = None


@dataclass(frozen=True)
class Diagnostic:
    """One message at one place: severity is `error`, `warning` or `remark`."""

    severity: str
    message: str
    loc: Loc | None = None
    notes: tuple[Note, ...] = field(default_factory=tuple)

    def render(self, sources: "SourceMap | None" = None) -> str:
        return render(self, sources)


class SourceMap:
    """File name → text, so the renderer can show the offending line and a caret."""

    def __init__(self) -> None:
        self._texts: dict[str, list[str]] = {}

    def add(self, file: str, text: str) -> None:
        self._texts[file] = text.splitlines()

    def line(self, loc: Loc) -> str | None:
        lines = self._texts.get(loc.file)
        if lines is None or not 1 <= loc.line <= len(lines):
            return None
        return lines[loc.line - 1]


GLOBAL_SOURCES = SourceMap()


def _escaped(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _is_control(ch: str) -> bool:
    """C0 (but tab and newline), DEL and C1 controls, and the invisible format characters and line
    separators that reorder or break what a terminal shows (bidi overrides, zero-width marks)."""
    return ch not in "\t\n" and unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp")


def escape_controls(text: str) -> str:
    """`text` with every control character written as an escape (ESC as `\\x1b`, U+202E as `\\u202e`):
    file names, source lines and values from users reach the terminal inside messages, and a raw ESC
    there would recolour, move or clear it. Tabs and newlines stay; printable text is unchanged, so
    escaping twice changes nothing."""
    if text.isprintable():
        return text
    return "".join(_escaped(ch) if _is_control(ch) else ch for ch in text)


def _shown_line(line: str, loc: Loc) -> tuple[str, str]:
    """The source line as printed (controls escaped) and the caret line under its span: each
    escaped character widens the span by the width of its escape."""
    start = max(loc.col - 1, 0)
    end = loc.end_col - 1 if loc.end_col > loc.col else start + 1
    end = min(max(end, start + 1), max(len(line), start + 1))
    shown = [_escaped(ch) if _is_control(ch) else ch for ch in line]
    prefix = "".join("\t" if ch == "\t" else " " * len(ch) for ch in shown[:start])
    width = sum(len(ch) for ch in shown[start:end]) or 1
    return "".join(shown), prefix + "^" + "~" * (width - 1)


def render(diag: Diagnostic, sources: SourceMap | None = None) -> str:
    sources = sources or GLOBAL_SOURCES
    where = f"{diag.loc}: " if diag.loc and diag.loc.line > 0 else (
        f"{diag.loc.file}: " if diag.loc and diag.loc.file and diag.loc.file != UNKNOWN_LOC.file else "")
    out = [escape_controls(f"{where}{diag.severity}: {diag.message}")]
    if diag.loc and diag.loc.line > 0:
        text = sources.line(diag.loc)
        if text is not None and len(text) <= 400:
            out.extend(_shown_line(text, diag.loc))
    for note in diag.notes:
        nwhere = f"{note.loc}: " if note.loc and note.loc.line > 0 else ""
        out.append(escape_controls(f"{nwhere}note: {note.message}"))
    return "\n".join(out)


class TlcError(Exception):
    """Raised with one or more diagnostics; the CLI renders them and exits 1."""

    def __init__(self, diagnostics: Diagnostic | Sequence[Diagnostic]):
        if isinstance(diagnostics, Diagnostic):
            diagnostics = [diagnostics]
        self.diagnostics: list[Diagnostic] = list(diagnostics)
        super().__init__("\n".join(d.render() for d in self.diagnostics))

    def render(self, sources: SourceMap | None = None, file: str | None = None) -> str:
        """Every diagnostic; with `file`, one that names no file of its own is prefixed with it."""
        return "\n".join(d.render(sources) if file is None or (d.loc is not None and d.loc.file and
                                                               (d.loc.line > 0 or d.loc.file != UNKNOWN_LOC.file))
                         else f"{escape_controls(file)}: {d.render(sources)}" for d in self.diagnostics)


def error(message: str, loc: Loc | None = None, *notes: Note) -> Diagnostic:
    return Diagnostic("error", message, loc, tuple(notes))


def remark(message: str, loc: Loc | None = None, *notes: Note) -> Diagnostic:
    return Diagnostic("remark", message, loc, tuple(notes))


def fail(message: str, loc: Loc | None = None, *notes: Note) -> TlcError:
    """Build (not raise) a one-diagnostic error: `raise fail("...", op.loc)`."""
    return TlcError(error(message, loc, *notes))


class DiagnosticSink:
    """Collects diagnostics during a check so all errors are reported, not just the first."""

    def __init__(self) -> None:
        self.items: list[Diagnostic] = []

    def error(self, message: str, loc: Loc | None = None, *notes: Note) -> None:
        self.items.append(error(message, loc, *notes))

    def remark(self, message: str, loc: Loc | None = None, *notes: Note) -> None:
        self.items.append(remark(message, loc, *notes))

    def extend(self, diags: Iterable[Diagnostic]) -> None:
        self.items.extend(diags)

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.items if d.severity == "error"]

    def raise_if_errors(self) -> None:
        if self.errors:
            raise TlcError(self.errors)
