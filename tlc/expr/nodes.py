"""Expression nodes and their printing: one frozen dataclass per kind, shared by the TL graph
(tile shapes `BM`, loop bounds `seqlen_k / BN`) and the kernel IR (`ceil_div(p.sk, 64) - 1`).

Only these node kinds exist and each checks itself when built, so only identifiers, numbers and
the operators and functions of the tables below ever reach the emitted C++.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable

from tlc.diagnostics import fail

IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Dotted names reach struct fields and CUDA builtins: `p.sq`, `blockIdx.x`.
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$")
CPP_KEYWORDS = frozenset(
    "alignas alignof and asm auto bool break case catch char class const constexpr continue decltype "
    "default delete do double else enum explicit extern false float for friend goto if inline int long "
    "mutable namespace new noexcept not nullptr operator or private protected public register return "
    "short signed sizeof static struct switch template this throw true try typedef typename union "
    "unsigned using virtual void volatile while".split())

# Precedence for printing and parsing (higher binds tighter); unary minus binds tighter still.
BINOPS = {"||": 1, "&&": 2, "==": 3, "!=": 3, "<": 4, "<=": 4, ">": 4, ">=": 4,
          "+": 5, "-": 5, "*": 6, "/": 6, "%": 6}
ARITHMETIC = ("+", "-", "*", "/", "%")
_NEG_PREC = 7
# name → (fewest, most) arguments; None: no upper bound. `cdiv` is TL's spelling of `ceil_div`;
# `floor_div` and `floor_mod` are TL's integer `/` and `%` in the kernel (C++'s truncate).
FUNCTIONS: dict[str, tuple[int, int | None]] = {
    "cdiv": (2, 2), "ceil_div": (2, 2), "floor_div": (2, 2), "floor_mod": (2, 2), "min": (2, None), "max": (2, None),
    "select": (3, 3), "exp2": (1, 1), "exp": (1, 1), "log": (1, 1), "tanh": (1, 1), "abs": (1, 1),
    "sqrt": (1, 1), "isnan": (1, 1),
    "load": (3, 3)}   # kernel IR only: load(p.x_ptr, flat index, inside), a tensor Input's element (0 outside)
# The words `parse_expr` reads as constants, never as names.
CONSTANT_WORDS = {"inf": math.inf, "true": True, "false": False}


def check_ident(name: str, what: str = "identifier") -> str:
    if not isinstance(name, str) or not IDENT.match(name) or name in CPP_KEYWORDS:
        raise fail(f"kernel IR: invalid {what} {name!r}: expected a C++ identifier like `tSrQ`")
    return name


def name_problem(name: str) -> str | None:
    """Why `name` cannot be a `Var`, or None."""
    if name == "_":
        return None
    if not isinstance(name, str) or not NAME.match(name):
        return f"invalid name {name!r} in an expression"
    keyword = next((part for part in name.split(".") if part in CPP_KEYWORDS), None)
    return f"C++ keyword {keyword!r} used as a name" if keyword else None


def call_problem(fn: str, n_args: int, among: tuple[str, ...] | None = None) -> str | None:
    """Why `fn(…n_args…)` is not a call of a known function (of `among`, when given), or None."""
    known = tuple(FUNCTIONS) if among is None else among
    if fn not in known:
        return f"unknown function '{fn}'; the functions are {_signatures(known)}"
    least, most = FUNCTIONS[fn]
    if n_args < least or (most is not None and n_args > most):
        want = f"exactly {least}" if most == least else f"at least {least}"
        return f"'{fn}' takes {want} arguments, got {n_args}; write {_signature(fn)}"
    return None


def _signature(fn: str) -> str:
    least, most = FUNCTIONS[fn]
    params = ", ".join("abc"[:least])
    return f"{fn}({params}{', …' if most is None else ''})"


def _signatures(names: tuple[str, ...]) -> str:
    shown = [_signature(fn) for fn in names]
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " and " + shown[-1]


class Expr:
    """Base of the expression nodes; `str(e)` is the text form `parse_expr` reads back."""

    __slots__ = ()

    def __str__(self) -> str:
        return print_expr(self)


@dataclass(frozen=True)
class Const(Expr):
    value: int | float | bool

    def __str__(self) -> str:
        return print_expr(self)


@dataclass(frozen=True)
class Var(Expr):
    """A named value: a Param, an Input, a loop variable, a `LetOp` result, `p.field`,
    `threadIdx.x`, or `_` (a whole mode in an `Index`)."""

    name: str

    def __post_init__(self) -> None:
        problem = name_problem(self.name)
        if problem:
            raise fail(problem)

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class BinOp(Expr):
    op: str
    lhs: Expr
    rhs: Expr

    def __post_init__(self) -> None:
        if self.op not in BINOPS:
            raise fail(f"unknown operator {self.op!r} in an expression")

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
        problem = call_problem(self.fn, len(self.args))
        if problem:
            raise fail(problem)

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
    """Coerce Python values: numbers and bools become `Const`, strings are parsed."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, (bool, int, float)):
        return Const(value)
    if isinstance(value, str):
        from tlc.expr.parse import parse_expr

        return parse_expr(value)
    raise fail(f"kernel IR: cannot make an expression of {value!r}")


# ------------------------------------------------------------------ printing


def const_text(v: int | float | bool) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return repr(float(v))


def _is_negative(e: Expr) -> bool:
    return isinstance(e, Neg) or (isinstance(e, Const) and not isinstance(e.value, bool) and e.value < 0)


def format_expr(e: Expr, const: Callable[[int | float | bool], str], call: Callable[[str, list[str]], str],
                index: Callable[[str, list[str]], str], parent_prec: int = 0, *,
                wrap_negative: bool = False) -> str:
    """Print `e` with the precedence rules shared by every text form (TL, the IR texts, C++); the
    three callables spell constants, calls and indexing in the target syntax. A negation of a
    negative operand is parenthesised: `-(-x)`, never `--x` (a decrement in C++)."""
    def sub(x: Expr, prec: int = 0) -> str:
        return format_expr(x, const, call, index, prec, wrap_negative=wrap_negative)

    if isinstance(e, Var):
        return e.name
    if isinstance(e, Const):
        text = const(e.value)
        return f"({text})" if wrap_negative and text.startswith("-") and parent_prec else text
    if isinstance(e, Neg):
        return f"-({sub(e.arg)})" if _is_negative(e.arg) else f"-{sub(e.arg, _NEG_PREC)}"
    if isinstance(e, Call):
        return call(e.fn, [sub(a) for a in e.args])
    if isinstance(e, Index):
        return index(e.base.name, [sub(a) for a in e.indices])
    if isinstance(e, BinOp):
        prec = BINOPS[e.op]
        text = f"{sub(e.lhs, prec)} {e.op} {sub(e.rhs, prec + 1)}"
        return f"({text})" if prec < parent_prec else text
    raise fail(f"not an expression: {e!r}")


def print_expr(e: Expr, parent_prec: int = 0) -> str:
    """The text form: what TL programs, the TL-graph text and the kernel-IR text write."""
    return format_expr(e, const_text, lambda fn, args: f"{fn}({', '.join(args)})",
                       lambda base, idx: f"{base}[{', '.join(idx)}]", parent_prec)
