"""The TL abstract syntax tree: one frozen dataclass per statement, each with its `Loc`.

Produced by `tlc.frontend.parser`, printed back to TL text by `tlc.frontend.format`,
lowered to the TL graph by `tlc.frontend.lower`. Integer expressions (`Expr`) are
shared with the IR, which keeps tile shapes symbolic (`BM`, `HeadDim`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Union

from tlc.diagnostics import Loc, UNKNOWN_LOC

# ---------------------------------------------------------------- expressions


@dataclass(frozen=True)
class Num:
    value: float | int

    def __str__(self) -> str:
        v = self.value
        if isinstance(v, float):
            if math.isinf(v):
                return "-inf" if v < 0 else "inf"
            return repr(v)
        return str(v)


@dataclass(frozen=True)
class Name:
    id: str

    def __str__(self) -> str:
        return self.id


@dataclass(frozen=True)
class BinOp:
    op: str  # + - * / %
    lhs: "Expr"
    rhs: "Expr"

    def __str__(self) -> str:
        return f"{_paren(self.lhs, self.op, False)} {self.op} {_paren(self.rhs, self.op, True)}"


@dataclass(frozen=True)
class Neg:
    operand: "Expr"

    def __str__(self) -> str:
        inner = str(self.operand)
        return f"-{inner}" if isinstance(self.operand, (Num, Name, Call)) else f"-({inner})"


@dataclass(frozen=True)
class Call:
    fn: str
    args: tuple["Expr", ...]

    def __str__(self) -> str:
        return f"{self.fn}({', '.join(str(a) for a in self.args)})"


Expr = Union[Num, Name, BinOp, Neg, Call]

_PREC = {"+": 1, "-": 1, "*": 2, "/": 2, "%": 2}


def _paren(e: Expr, parent: str, right: bool) -> str:
    if isinstance(e, BinOp):
        p, q = _PREC[e.op], _PREC[parent]
        if p < q or (right and p == q):
            return f"({e})"
    return str(e)


# name → (fewest, most) arguments; None: no upper bound. eval_expr and the frontend's
# check both read this table, so an arity the checker accepts always evaluates.
EXPR_FUNCTIONS: dict[str, tuple[int, int | None]] = {"cdiv": (2, 2), "min": (2, None), "max": (2, None)}


def call_problem(fn: str, n_args: int) -> str | None:
    """Why `fn(…n_args…)` is not a valid call of a built-in function, or None."""
    if fn not in EXPR_FUNCTIONS:
        return f"unknown function '{fn}'; the functions are cdiv(a, b), min(a, b, …) and max(a, b, …)"
    least, most = EXPR_FUNCTIONS[fn]
    if n_args < least or (most is not None and n_args > most):
        want = f"exactly {least}" if most == least else f"at least {least}"
        form = "cdiv(a, b)" if fn == "cdiv" else f"{fn}(a, b, …)"
        return f"'{fn}' takes {want} arguments, got {n_args}; write {form}"
    return None


class ExprError(Exception):
    """An expression could not be evaluated (unbound name, division by zero)."""


def eval_expr(e: Expr, env: Mapping[str, float | int], *, ceil_div: bool = False) -> float | int:
    """Evaluate with `env`; `/` on integers rounds down, or up when `ceil_div` (loop bounds)."""
    if isinstance(e, Num):
        return e.value
    if isinstance(e, Name):
        if e.id not in env:
            raise ExprError(f"'{e.id}' has no value here")
        return env[e.id]
    if isinstance(e, Neg):
        return -eval_expr(e.operand, env, ceil_div=ceil_div)
    if isinstance(e, Call):
        problem = call_problem(e.fn, len(e.args))
        if problem:
            raise ExprError(problem)
        args = [eval_expr(a, env, ceil_div=ceil_div) for a in e.args]
        if e.fn == "cdiv":
            if args[1] == 0:
                raise ExprError("cdiv by zero")
            return -(-args[0] // args[1])
        return (min if e.fn == "min" else max)(args)
    a = eval_expr(e.lhs, env, ceil_div=ceil_div)
    b = eval_expr(e.rhs, env, ceil_div=ceil_div)
    if e.op == "+":
        return a + b
    if e.op == "-":
        return a - b
    if e.op == "*":
        return a * b
    if b == 0:
        raise ExprError(f"division by zero in '{e}'")
    if e.op == "%":
        return a % b
    if isinstance(a, int) and isinstance(b, int):
        return -(-a // b) if ceil_div else a // b
    return a / b


def expr_names(e: Expr) -> set[str]:
    if isinstance(e, Name):
        return {e.id}
    if isinstance(e, Neg):
        return expr_names(e.operand)
    if isinstance(e, Call):
        return set().union(*(expr_names(a) for a in e.args)) if e.args else set()
    if isinstance(e, BinOp):
        return expr_names(e.lhs) | expr_names(e.rhs)
    return set()


# ---------------------------------------------------------------- statements


@dataclass(frozen=True)
class Stmt:
    loc: Loc = field(default=UNKNOWN_LOC, compare=False, kw_only=True)
    when: str | None = field(default=None, kw_only=True)


@dataclass(frozen=True)
class ParamStmt(Stmt):
    """`Param BM = 128` — a compile-time parameter; `Param BM` leaves it open (sketch)."""

    name: str
    value: int | float | str | None


@dataclass(frozen=True)
class InputStmt(Stmt):
    """`Input seqlen_q, seqlen_k : int` — runtime scalars bound at launch."""

    names: tuple[str, ...]
    kind: str = "int"


@dataclass(frozen=True)
class AllocateStmt(Stmt):
    """`Allocate Q in global (seqlen_q, HeadDim) [as bf16] [with offset head_idx / group]`."""

    name: str
    space: str
    shape: tuple[Expr, ...]
    dtype: str | None = None
    offset: Expr | None = None
    name_loc: Loc = field(default=UNKNOWN_LOC, compare=False)
    space_loc: Loc = field(default=UNKNOWN_LOC, compare=False)


@dataclass(frozen=True)
class CopyStmt(Stmt):
    """`Copy K (BN, HeadDim) in coordinate [L = n] from global to shared`."""

    name: str
    tile: tuple[Expr, ...] | None
    coord: tuple[tuple[str, Expr], ...]
    src: str
    dst: str
    name_loc: Loc = field(default=UNKNOWN_LOC, compare=False)
    src_loc: Loc = field(default=UNKNOWN_LOC, compare=False)
    dst_loc: Loc = field(default=UNKNOWN_LOC, compare=False)


@dataclass(frozen=True)
class Operand:
    name: str
    transposed: bool = False
    loc: Loc = field(default=UNKNOWN_LOC, compare=False)

    def __str__(self) -> str:
        return self.name + (".T" if self.transposed else "")


@dataclass(frozen=True)
class GemmStmt(Stmt):
    """`Compute GEMM Q, K.T and get S` / `Compute GEMM P, V and accumulate O`."""

    a: Operand
    b: Operand
    accumulate: bool
    out: str
    out_loc: Loc = field(default=UNKNOWN_LOC, compare=False)


@dataclass(frozen=True)
class SoftmaxStmt(Stmt):
    """`Compute Softmax S [with max m, sum l] [and get P]` — over the loop's whole domain."""

    x: str
    max_name: str | None
    sum_name: str | None
    out: str | None
    new: bool = False
    x_loc: Loc = field(default=UNKNOWN_LOC, compare=False)


@dataclass(frozen=True)
class MaskStmt(Stmt):
    """`Compute Mask S causal top_left [and get new S]`."""

    x: str
    alignment: str
    out: str | None
    new: bool = False
    x_loc: Loc = field(default=UNKNOWN_LOC, compare=False)
    alignment_loc: Loc = field(default=UNKNOWN_LOC, compare=False)


@dataclass(frozen=True)
class Arg:
    """An argument of an elementwise Compute: a tile name or a scalar expression."""

    expr: Expr
    loc: Loc = field(default=UNKNOWN_LOC, compare=False)

    def __str__(self) -> str:
        return str(self.expr)


@dataclass(frozen=True)
class ComputeStmt(Stmt):
    """`Compute Multiply S, scale and get new S` (Add, Subtract, Multiply, Divide, Exp, …)."""

    op: str
    args: tuple[Arg, ...]
    out: str
    new: bool = False
    op_loc: Loc = field(default=UNKNOWN_LOC, compare=False)


@dataclass(frozen=True)
class ReshapeStmt(Stmt):
    """`Reshape P from (MMA_C, MMA_M, MMA_N) to (MMA_A, MMA_M, MMA_N_new) [as bf16]`."""

    x: str
    src_modes: tuple[str, ...]
    dst_modes: tuple[str, ...]
    dtype: str | None = None
    x_loc: Loc = field(default=UNKNOWN_LOC, compare=False)
    to_loc: Loc = field(default=UNKNOWN_LOC, compare=False)


@dataclass(frozen=True)
class ForStmt(Stmt):
    """`for n = 0:N` … `end`, or `for n in 0:N:` with an indented body."""

    var: str
    start: Expr
    stop: Expr
    body: tuple[Stmt, ...]
    indented: bool = False


@dataclass(frozen=True)
class Program:
    file: str
    body: tuple[Stmt, ...]
