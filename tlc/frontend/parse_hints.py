"""Syntax errors of TL lines in words: what lark expected, named as a user reads it, with the form of
the statement that was being written (`tlc.frontend.parser` reports them at the offending column)."""
from __future__ import annotations

import re

from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from tlc.diagnostics import Loc
from tlc.expr.parse import OPERATORS
from tlc.frontend.names import unknown_operation

STATEMENT_WORDS = ("Param", "Input", "Allocate", "Copy", "Compute", "Reshape", "for", "end")

_TERMINAL_WORDS = {
    "NAME": "a name", "IDENT": "a name", "NUMBER": "a number", "COMMA": "','", "LPAR": "'('", "RPAR": "')'",
    "EQUAL": "'='", "COLON": "':'", "LSQB": "'['", "RSQB": "']'", "PLUS": "'+'", "MINUS": "'-'",
    "STAR": "'*'", "SLASH": "'/'", "PERCENT": "'%'", "$END": "the end of the line",
    "TRANSPOSE": "'.T'", "GEMM_MODE": "'get' or 'accumulate'", "NEW": "'new'",
    "WHERE": "'where'",
}


def _word(terminal: str) -> str:
    if terminal in _TERMINAL_WORDS:
        return _TERMINAL_WORDS[terminal]
    if terminal.startswith("_") and terminal[1:].isalpha():
        return f"'{terminal[1:].lower()}'"
    return terminal.lower()



def hint(text: str, exc: UnexpectedInput) -> str:
    first = text.split()[0] if text.split() else ""
    col = getattr(exc, "column", 1) or 1
    bad = text[col - 1 : col + 12].split()[0] if text[col - 1 :].strip() else ""
    if first and col <= len(text) - len(text.lstrip()) + 1 and first.lower() not in {w.lower() for w in STATEMENT_WORDS}:
        return f"unknown statement '{first}'; a statement starts with " + ", ".join(STATEMENT_WORDS)
    if bad.startswith("^") or bad.startswith("'"):
        return "write a transpose as '.T' after the name, e.g. 'Compute GEMM Q, K.T and get S'"
    if bad.startswith(".") and not bad.startswith(".T"):
        return f"unexpected '{bad}': only '.T' (transpose) may follow a name"
    if isinstance(exc, UnexpectedCharacters):
        return f"unexpected character {text[col - 1]!r}"
    if isinstance(exc, (UnexpectedToken, UnexpectedEOF)):
        expected = _expected_words(exc.expected)
        got = "the end of the line" if isinstance(exc, UnexpectedEOF) or getattr(exc.token, "type", "") == "$END" else f"'{exc.token}'"
        lead = first.lower()
        shape_hint = {
            "copy": " (form: Copy X [(tile)] [in coordinate [L = expr [from end]]] from SPACE to SPACE)",
            "allocate": " (form: Allocate X in SPACE (dims) [as dtype] [with offset expr])",
            "reshape": " (form: Reshape X from (MMA_C, ...) to (MMA_A, ...) [as dtype])",
            "for": " (form: 'for n = 0:N' … 'end', or 'for n in 0:N:' with an indented body)",
            "param": " (form: Param NAME = value)",
        }.get(lead, "")
        second = text.split()[1].lower() if len(text.split()) > 1 else ""
        if lead == "compute" and ("'get' or 'accumulate'" in expected or second == "gemm"):
            shape_hint = " (form: Compute GEMM A, B[.T] and get|accumulate C)"
        elif lead == "compute" and second == "mask":
            shape_hint = (" (form: Compute Mask S causal ALIGNMENT, or Compute Mask S where PREDICATE, then "
                          "[and get [new] S]; the predicate is true where a score is masked)")
        elif lead == "compute" and "'and'" in expected:
            shape_hint = " (an elementwise Compute ends with 'and get [new] NAME')"
        return f"expected {_join(expected)} but found {got}{shape_hint}"
    return "syntax error"


def _expected_words(terminals) -> list[str]:
    """lark's expected terminals in words; the binary operators, where one may come, are named
    together as 'an operator' ('-' alone, where an operand must come, is the unary minus)."""
    names = {t for t in terminals if not t.startswith("__")}
    if names & OPERATORS - {"MINUS"}:
        names = names - OPERATORS | {"an operator"}
    return sorted({n if n == "an operator" else _word(n) for n in names})


_COMPUTE_OP = re.compile(r"(\s*compute\s+)([A-Za-z_][A-Za-z0-9_]*)", re.IGNORECASE)


def unknown_operation_at(line: str, file: str, lineno: int) -> tuple[str, Loc] | None:
    m = _COMPUTE_OP.match(line)
    message = unknown_operation(m.group(2)) if m else None
    if m is None or message is None:
        return None
    return message, Loc(file, lineno, m.start(2) + 1, m.end(2) + 1)


def _join(words: list[str]) -> str:
    if len(words) <= 1:
        return "".join(words)
    return ", ".join(words[:-1]) + " or " + words[-1]
