"""The TL abstract syntax tree: one frozen dataclass per statement, each with its `Loc`.

Produced by `tlc.frontend.parser`, printed back to TL text by `tlc.frontend.format`,
lowered to the TL graph by `tlc.frontend.lower`. Expressions are `tlc.expr` nodes, shared
with the TL graph (symbolic tile shapes `BM`, `HeadDim`) and the kernel IR.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tlc.diagnostics import Loc, UNKNOWN_LOC
from tlc.expr import BinOp, Call, Const, Expr, ExprError, Neg, Var, eval_expr, free_names
from tlc.expr import call_problem as _call_problem

# ---------------------------------------------------------------- expressions
# The nodes are those of `tlc.expr`, shared with the TL graph and the kernel IR. TL spells a
# number `Num` and a name `Name`; the classes are the same.

Num = Const
Name = Var
expr_names = free_names

# The functions a TL program may call (a subset of `tlc.expr.FUNCTIONS`).
TL_FUNCTIONS = ("cdiv", "min", "max")


def call_problem(fn: str, n_args: int) -> str | None:
    """Why `fn(…n_args…)` is not a valid call of a TL built-in function, or None."""
    return _call_problem(fn, n_args, TL_FUNCTIONS)


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
    """`Input seqlen_q, seqlen_k : int` — runtime scalars bound at launch; `Input seqlens : int32[batch]`
    — a runtime tensor (`dims` given) read element by element (tlc/ir/tensor_inputs.py)."""

    names: tuple[str, ...]
    kind: str = "int"
    dims: tuple[Expr, ...] | None = None


@dataclass(frozen=True)
class AllocateStmt(Stmt):
    """`Allocate Q in global (seqlen_q, HeadDim) [as bf16] [with offset head_idx / group] [and rows at E]`."""

    name: str
    space: str
    shape: tuple[Expr, ...]
    dtype: str | None = None
    offset: Expr | None = None
    rows_at: Expr | None = None    # the storage row of the tensor's row `row` (a gather: a paged cache)
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
    from_end: tuple[str, ...] = ()       # coordinate keys counted from the tensor's end (`[L = i from end]`)
    add: bool = False                    # `… to global and add`: a reduce-store (the tile added in)
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
    """`Compute Mask S causal top_left [and get new S]`, or `Compute Mask S where kv_idx > q_idx [and get
    new S]`: a predicate over the score's positions, true where the score is masked (`alignment` None)."""

    x: str
    alignment: str | None
    out: str | None
    new: bool = False
    x_loc: Loc = field(default=UNKNOWN_LOC, compare=False)
    alignment_loc: Loc = field(default=UNKNOWN_LOC, compare=False)
    predicate: Expr | None = None
    predicate_loc: Loc = field(default=UNKNOWN_LOC, compare=False)


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
class KernelStmt(Stmt):
    """`Kernel combine` — a kernel boundary: what follows, up to the next one, is the kernel `name`."""

    name: str
    name_loc: Loc = field(default=UNKNOWN_LOC, compare=False)
    axes: tuple[tuple[str, Expr], ...] = ()   # `over [split_idx = Splits]`: grid axes of its own


@dataclass(frozen=True)
class Program:
    file: str
    body: tuple[Stmt, ...]
    axes: tuple[tuple[str, Expr], ...] = ()   # a kernel's own grid axes (tlc/frontend/kernels.py)
    axes_loc: Loc | None = field(default=None, compare=False)   # its Kernel line


__all__ = ["AllocateStmt", "Arg", "BinOp", "Call", "ComputeStmt", "Const", "CopyStmt", "Expr", "ExprError",
           "ForStmt", "GemmStmt", "InputStmt", "KernelStmt", "MaskStmt", "Name", "Neg", "Num", "Operand", "ParamStmt",
           "Program", "ReshapeStmt", "SoftmaxStmt", "Stmt", "TL_FUNCTIONS", "Var", "call_problem", "eval_expr",
           "expr_names"]
