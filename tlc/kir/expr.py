"""Scalar expressions of the kernel IR: runtime index math, bounds and elementwise functions.

Only these node kinds exist, so only validated identifiers, numbers and whitelisted operators
and functions ever reach the emitted C++. Text form is infix, e.g. `ceil_div(p.sk, 64) - 1`,
read back by `parse_expr` with the LALR grammar in `expr.lark`.
"""
from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from lark import Transformer
from lark.exceptions import UnexpectedInput, VisitError

from tlc.diagnostics import Loc, TlcError, fail
from tlc.lark_errors import describe, load_grammar, visit_position

IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Dotted names reach struct fields and CUDA builtins: `p.sq`, `blockIdx.x`.
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$")
CPP_KEYWORDS = frozenset(
    "alignas alignof and asm auto bool break case catch char class const constexpr continue decltype "
    "default delete do double else enum explicit extern false float for friend goto if inline int long "
    "mutable namespace new noexcept not nullptr operator or private protected public register return "
    "short signed sizeof static struct switch template this throw true try typedef typename union "
    "unsigned using virtual void volatile while".split())

# Precedence for printing and parsing (higher binds tighter).
BINOPS = {"||": 1, "&&": 2, "==": 3, "!=": 3, "<": 4, "<=": 4, ">": 4, ">=": 4,
          "+": 5, "-": 5, "*": 6, "/": 6, "%": 6}
# name -> arity; the emitter owns the C++ spelling of each.
FUNCTIONS = {"min": 2, "max": 2, "ceil_div": 2, "floor_div": 2, "select": 3, "exp2": 1, "exp": 1, "log": 1,
             "tanh": 1, "abs": 1, "sqrt": 1, "isnan": 1}


def check_ident(name: str, what: str = "identifier") -> str:
    if not isinstance(name, str) or not IDENT.match(name) or name in CPP_KEYWORDS:
        raise fail(f"kernel IR: invalid {what} {name!r}: expected a C++ identifier like `tSrQ`")
    return name


class Expr:
    """Base of scalar expression nodes."""

    def __str__(self) -> str:
        return print_expr(self)


@dataclass(frozen=True)
class Var(Expr):
    """A named value: a `LetOp` result, a loop variable, `p.field`, `threadIdx.x`, or `_` (a whole mode)."""

    name: str

    def __post_init__(self) -> None:
        if self.name != "_" and not NAME.match(self.name):
            raise fail(f"kernel IR: invalid name {self.name!r} in an expression")
        for part in self.name.split("."):
            if part in CPP_KEYWORDS:
                raise fail(f"kernel IR: C++ keyword {part!r} used as a name")

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Const(Expr):
    value: int | float | bool

    def __str__(self) -> str:
        return print_expr(self)


@dataclass(frozen=True)
class BinOp(Expr):
    op: str
    lhs: Expr
    rhs: Expr

    def __post_init__(self) -> None:
        if self.op not in BINOPS:
            raise fail(f"kernel IR: unknown operator {self.op!r}")

    def __str__(self) -> str:
        return print_expr(self)


@dataclass(frozen=True)
class Neg(Expr):
    arg: Expr

    def __str__(self) -> str:
        return print_expr(self)


@dataclass(frozen=True)
class Call(Expr):
    fn: str
    args: tuple[Expr, ...]

    def __post_init__(self) -> None:
        if FUNCTIONS.get(self.fn) != len(self.args):
            raise fail(f"kernel IR: unknown function {self.fn}/{len(self.args)}; "
                       f"known: {', '.join(sorted(FUNCTIONS))}")

    def __str__(self) -> str:
        return print_expr(self)


@dataclass(frozen=True)
class Index(Expr):
    """A tensor slice `sK[_, _, stage]`: one index per mode, `_` keeps the mode."""

    base: Var
    indices: tuple[Expr, ...]

    def __str__(self) -> str:
        return print_expr(self)


ExprLike = Expr | int | float | str


def E(value: ExprLike) -> Expr:
    """Coerce Python values: ints and floats become `Const`, strings are parsed."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, bool):
        return Const(value)
    if isinstance(value, (int, float)):
        return Const(value)
    if isinstance(value, str):
        return parse_expr(value)
    raise fail(f"kernel IR: cannot make an expression of {value!r}")


def _const_text(v: int | float | bool) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    text = repr(float(v))
    return text


def format_expr(e: Expr, const: Callable[[int | float | bool], str], call: Callable[[str, list[str]], str],
                index: Callable[[str, list[str]], str], parent_prec: int = 0, *,
                wrap_negative: bool = False) -> str:
    """Print `e` with the precedence rules shared by the IR text and the emitted C++; the
    three callables spell constants, calls and indexing in the target syntax."""
    def sub(x: Expr, prec: int = 0) -> str:
        return format_expr(x, const, call, index, prec, wrap_negative=wrap_negative)

    if isinstance(e, Var):
        return e.name
    if isinstance(e, Const):
        text = const(e.value)
        return f"({text})" if wrap_negative and text.startswith("-") and parent_prec else text
    if isinstance(e, Neg):
        return f"-{sub(e.arg, 7)}"
    if isinstance(e, Call):
        return call(e.fn, [sub(a) for a in e.args])
    if isinstance(e, Index):
        return index(e.base.name, [sub(a) for a in e.indices])
    if isinstance(e, BinOp):
        prec = BINOPS[e.op]
        text = f"{sub(e.lhs, prec)} {e.op} {sub(e.rhs, prec + 1)}"
        return f"({text})" if prec < parent_prec else text
    raise fail(f"kernel IR: not an expression: {e!r}")


def print_expr(e: Expr, parent_prec: int = 0) -> str:
    return format_expr(e, _const_text, lambda fn, args: f"{fn}({', '.join(args)})",
                       lambda base, idx: f"{base}[{', '.join(idx)}]", parent_prec)


# ------------------------------------------------------------------ text → Expr (grammar in expr.lark)

_GRAMMAR = Path(__file__).with_name("expr.lark")
_WORDS = {"NAME": "a name", "NUMBER": "a number", "INF": "a number", "TRUE": "a name", "FALSE": "a name",
          "EQ_OP": "'==' or '!='", "REL_OP": "'<', '<=', '>' or '>='", "MUL_OP": "'*', '/' or '%'"}
_OPERATORS = frozenset({"OR", "AND", "EQ_OP", "REL_OP", "PLUS", "MINUS", "MUL_OP"})


class _ToExpr(Transformer):
    """lark tree → `Expr`; a minus in front of a number folds into the constant."""

    def number(self, items):
        text = str(items[0])
        return Const(float(text) if any(c in text for c in ".e") else int(text))

    def keyword(self, items):
        return Const({"inf": math.inf, "true": True, "false": False}[str(items[0])])

    def var(self, items):
        return Var(str(items[0]))

    def binop(self, items):
        lhs, op, rhs = items
        return BinOp(str(op), lhs, rhs)

    def neg(self, items):
        arg = items[-1]
        if isinstance(arg, Const) and not isinstance(arg.value, bool):
            return Const(-arg.value)
        return Neg(arg)

    def call(self, items):
        fn, args = str(items[0]), tuple(items[1:])
        if fn not in FUNCTIONS:
            raise fail(f"unknown function '{fn}'; the functions are {', '.join(sorted(FUNCTIONS))}")
        if FUNCTIONS[fn] != len(args):
            raise fail(f"'{fn}' takes {FUNCTIONS[fn]} argument(s), got {len(args)}")
        return Call(fn, args)

    def index(self, items):
        return Index(Var(str(items[0])), tuple(items[1:]))


@functools.lru_cache(maxsize=4096)
def _parse(text: str) -> Expr:
    # Expressions are immutable and the kernel-IR text repeats them: parse each text once.
    return _ToExpr().transform(load_grammar(_GRAMMAR).parse(text))


def parse_expr(text: str, at: Loc | None = None) -> Expr:
    """Infix text → `Expr`. Errors are `TlcError`s naming the column, and with `at` (where
    `text` starts in a larger text, as the kernel-IR text parser passes) the line too."""
    parser = load_grammar(_GRAMMAR)
    try:
        return _parse(text)
    except UnexpectedInput as exc:
        message, line, col = describe(exc, text, parser, _WORDS, "the end of the expression", _OPERATORS)
    except VisitError as exc:
        if not isinstance(exc.orig_exc, TlcError):
            raise exc.orig_exc from None
        message = "; ".join(d.message.removeprefix("kernel IR: ") for d in exc.orig_exc.diagnostics)
        line, col = visit_position(exc)
    except RecursionError:
        message, line, col = "expression nested too deeply", 1, 1
    shown = text if len(text) <= 80 else text[:77] + "..."
    if at is None:
        raise fail(f"kernel IR: expression {shown!r}, column {col}: {message}") from None
    where = Loc(at.file, at.line + line - 1, (at.col if line == 1 else 1) + col - 1)
    raise fail(f"kernel IR: expression `{shown}`: {message}", where) from None


def free_names(e: Expr) -> set[str]:
    if isinstance(e, Var):
        return set() if e.name == "_" else {e.name}
    if isinstance(e, Const):
        return set()
    if isinstance(e, Neg):
        return free_names(e.arg)
    if isinstance(e, BinOp):
        return free_names(e.lhs) | free_names(e.rhs)
    if isinstance(e, Call):
        return set().union(*(free_names(a) for a in e.args))
    if isinstance(e, Index):
        return {e.base.name}.union(*(free_names(a) for a in e.indices))
    return set()


def substitute(e: Expr, name: str, value: Expr) -> Expr:
    """`e` with every `Var(name)` replaced by `value` (also inside slices)."""
    if isinstance(e, Var):
        return value if e.name == name else e
    if isinstance(e, Neg):
        return Neg(substitute(e.arg, name, value))
    if isinstance(e, BinOp):
        return BinOp(e.op, substitute(e.lhs, name, value), substitute(e.rhs, name, value))
    if isinstance(e, Call):
        return Call(e.fn, tuple(substitute(a, name, value) for a in e.args))
    if isinstance(e, Index):
        return Index(e.base, tuple(substitute(a, name, value) for a in e.indices))
    return e
