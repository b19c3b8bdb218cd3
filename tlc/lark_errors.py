"""lark plumbing shared by the IR text parsers (`tlc.ir.irparser`, `tlc.kir.text`, `tlc.expr.parse`):
load a `.lark` grammar as LALR with positions, and say in words where a text broke and what was expected.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Iterable, Mapping

from lark import Lark
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, VisitError
from lark.lexer import PatternStr


@functools.lru_cache(maxsize=None)
def load_grammar(path: Path, starts: tuple[str, ...] = ("start",)) -> Lark:
    return Lark(path.read_text(), parser="lalr", propagate_positions=True, start=list(starts))


def _spell(parser: Lark, name: str, words: Mapping[str, str], end: str) -> str:
    if name == "$END":
        return end
    if name in words:
        return words[name]
    try:
        pattern = parser.get_terminal(name).pattern
    except KeyError:
        return name.lower()
    return f"'{pattern.value}'" if isinstance(pattern, PatternStr) else name.lower()


def expected_words(parser: Lark, expected: Iterable[str], words: Mapping[str, str], end: str,
                   operators: frozenset[str] = frozenset()) -> str:
    """lark's expected terminal names in words, e.g. `a name, '(' or the end of the line`. Where a
    binary operator may follow, any of `operators` may: they are named together as `an operator`
    (MINUS alone, where an operand must come, is the unary minus)."""
    names = set(expected)
    if names & operators - {"MINUS"}:
        names = names - operators | {"an operator"}
    spelled = sorted({n if n == "an operator" else _spell(parser, n, words, end) for n in names})
    return spelled[0] if len(spelled) == 1 else ", ".join(spelled[:-1]) + " or " + spelled[-1]


def end_position(text: str) -> tuple[int, int]:
    """1-based (line, column) just after the last non-blank character: where an EOF error points."""
    body = text.rstrip()
    return body.count("\n") + 1, len(body) - (body.rfind("\n") + 1) + 1


def describe(exc: UnexpectedInput, text: str, parser: Lark, words: Mapping[str, str], end: str,
             operators: frozenset[str] = frozenset(), catch_all: frozenset[str] = frozenset()
             ) -> tuple[str, int, int]:
    """(message, line, column) of a lark syntax error; the message says what was expected.
    A token of a `catch_all` terminal (one that matches any text) is named by its first character."""
    token = getattr(exc, "token", None)
    if isinstance(exc, UnexpectedCharacters) or (token is not None and token.type in catch_all):
        pos = exc.pos_in_stream if isinstance(exc, UnexpectedCharacters) else token.start_pos
        found = text[pos] if pos is not None and pos < len(text) else ""
        allowed = getattr(exc, "allowed", None) or getattr(exc, "accepts", None) or getattr(exc, "expected", None)
        expected = expected_words(parser, allowed, words, end, operators) if allowed else ""
        return (f"unexpected character {found!r}" + (f"; expected {expected}" if expected else ""),
                exc.line, exc.column)
    choices = getattr(exc, "accepts", None) or getattr(exc, "expected", None) or ()  # accepts: after reductions
    expected = expected_words(parser, choices, words, end, operators)
    if isinstance(exc, UnexpectedEOF) or token is None or token.type == "$END":
        return (f"expected {expected} but found {end}", *end_position(text))
    return f"expected {expected} but found {str(token)!r}", token.line, token.column


def visit_position(exc: VisitError) -> tuple[int, int]:
    """(line, column) of the grammar node whose transformer callback raised."""
    meta = getattr(exc.obj, "meta", None)
    if meta is None or getattr(meta, "empty", True):
        token = exc.obj
        return getattr(token, "line", 1) or 1, getattr(token, "column", 1) or 1
    return meta.line, meta.column
