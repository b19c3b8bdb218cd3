"""Scalar expressions of the kernel IR: runtime index math, bounds and elementwise functions.

Only these node kinds exist, so only validated identifiers, numbers and whitelisted operators
and functions ever reach the emitted C++. Text form is infix, e.g. `ceil_div(p.sk, 64) - 1`.
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


_TOKEN = re.compile(r"\s*(?:(?P<num>\d+\.\d*(?:e[+-]?\d+)?|\d+e[+-]?\d+|\d+)|(?P<name>[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)?)"
                    r"|(?P<op>\|\||&&|==|!=|<=|>=|[-+*/%<>()\[\],]))")


def _tokenize(text: str) -> list[str]:
    tokens, pos = [], 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise fail(f"kernel IR: cannot read expression {text!r} at column {pos + 1}")
        tokens.append(m.group(m.lastgroup))
        pos = m.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return tokens


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = _tokenize(text)
        self.i = 0

    def peek(self) -> str | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, want: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (want is not None and tok != want):
            raise fail(f"kernel IR: expected {want or 'more'} in expression {self.text!r}")
        self.i += 1
        return tok

    def parse(self, min_prec: int = 1) -> Expr:
        lhs = self.unary()
        while (tok := self.peek()) in BINOPS and BINOPS[tok] >= min_prec:
            self.take()
            rhs = self.parse(BINOPS[tok] + 1)
            lhs = BinOp(tok, lhs, rhs)
        return lhs

    def unary(self) -> Expr:
        tok = self.take()
        if tok == "-":
            arg = self.unary()
            if isinstance(arg, Const) and not isinstance(arg.value, bool):
                return Const(-arg.value)
            return Neg(arg)
        if tok == "(":
            e = self.parse()
            self.take(")")
            return e
        if tok[0].isdigit():
            return Const(float(tok) if any(c in tok for c in ".e") else int(tok))
        if tok in ("inf", "true", "false"):
            return Const({"inf": math.inf, "true": True, "false": False}[tok])
        if self.peek() == "(" and tok in FUNCTIONS:
            self.take("(")
            args = [self.parse()]
            while self.peek() == ",":
                self.take()
                args.append(self.parse())
            self.take(")")
            return Call(tok, tuple(args))
        if self.peek() == "[":
            self.take("[")
            idx = [self.parse()]
            while self.peek() == ",":
                self.take()
                idx.append(self.parse())
            self.take("]")
            return Index(Var(tok), tuple(idx))
        return Var(tok)


def parse_expr(text: str) -> Expr:
    p = _Parser(text)
    e = p.parse()
    if p.peek() is not None:
        raise fail(f"kernel IR: unexpected {p.peek()!r} in expression {text!r}")
    return e


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
