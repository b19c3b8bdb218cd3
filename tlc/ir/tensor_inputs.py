"""Tensor Inputs: runtime tensors a TL program reads element by element.

    Input seqlens : int32[batch]                 # one key length per sequence
    Input doc : int32[batch, seqlen_q]           # a document id per query row

`seqlens[batch_idx]` in an expression reads one element (an index outside its dimension reads 0,
LANGUAGE.md §2). A dimension is a number, a Param, an int Input or one of the launch's sizes below.
The graph keeps them apart from the scalar Inputs (`Graph.tensor_inputs`), the kernel reads them
through a pointer in its parameter struct (tlc/lowering/abi.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from tlc.expr import Call, Expr, ExprError, Index, Var, eval_expr, free_names, parse_expr
from tlc.expr.rewrite import children, subexprs

DTYPES = {"int32": "int", "fp32": "float"}   # element type → the kind of value a load gives
# The launch's sizes a dimension may name (batch and heads from the query tensor, kv_heads from K).
DIM_NAMES = {
    "batch": "the batch size",
    "heads": "the number of query heads",
    "kv_heads": "the number of key/value heads",
}


@dataclass(frozen=True)
class TensorInput:
    dtype: str                 # a key of DTYPES
    dims: tuple[Expr, ...]

    @property
    def kind(self) -> str:
        return DTYPES[self.dtype]

    def text(self) -> str:
        return f"{self.dtype}[{', '.join(str(d) for d in self.dims)}]"


def launch_sizes(batch: int, heads: int, kv_heads: int) -> dict[str, int]:
    """The launch's sizes a dimension may name (DIM_NAMES), by name."""
    return {"batch": batch, "heads": heads, "kv_heads": kv_heads}


def tensor_shape(dims: Sequence[Expr | str], env: Mapping[str, object]) -> tuple[int, ...]:
    """The shape declared dimensions (expressions, or their text as the launch ABI keeps it) have with `env`'s
    values (launch_sizes, Params, int Inputs), `/` flooring as TL's does; raises ExprError for a name without one."""
    return tuple(int(eval_expr(parse_expr(d) if isinstance(d, str) else d, env)) for d in dims)


def tensor_pointer(name: str) -> str:
    """The parameter-struct field holding a tensor Input's data pointer."""
    return f"{name}_ptr"


def loads(e: Expr) -> list[Index]:
    """The indexed reads in `e`, outermost first."""
    return [x for x in subexprs(e) if isinstance(x, Index)]


def scalar_names(e: Expr) -> set[str]:
    """The names `e` reads as values: not the tensors it indexes, but its indices' names."""
    if isinstance(e, Var):
        return set() if e.name == "_" else {e.name}
    if isinstance(e, Index):
        return set().union(*(scalar_names(i) for i in e.indices))
    return set().union(*(scalar_names(c) for c in children(e)))


def stored_rows(extent: Expr) -> Expr | str:
    """The rows a global tensor holds, from its Allocate's row extent: the extent itself, or for one that
    reads a tensor Input, R of `min(E, R)` (E the rows the program sees, R the rows there are: the launch
    binds R from the tensor, and E can never reach past it). A string says why an extent is not of that form."""
    if not loads(extent):
        return extent
    if isinstance(extent, Call) and extent.fn == "min" and len(extent.args) == 2:
        plain = [a for a in extent.args if not loads(a)]
        if len(plain) == 1:
            return plain[0]
    return (f"a row extent that reads a tensor Input is 'min(E, R)': R the rows the tensor holds (an int Input, "
            f"seqlen_k), E the rows the program sees; '{extent}' is not")


def batch_of(dims: Mapping[str, Sequence[Expr | str]], given: Mapping[str, object],
             env: Mapping[str, object]) -> int | None:
    """The batch a launch's tensor Inputs imply when no laid-out tensor gives it (every tensor read through a row
    map: packed sequences): the first Input whose first dimension is `a · batch + b` (a > 0, in the launch's other
    sizes) and whose tensor has n = a · batch + b elements there (`cu_seqlens : int32[batch + 1]`). None: none does."""
    for name, shape in dims.items():
        t = given.get(name)
        if not shape or t is None or not hasattr(t, "shape") or not len(t.shape):
            continue
        d = parse_expr(shape[0]) if isinstance(shape[0], str) else shape[0]
        if "batch" not in free_names(d):
            continue
        try:
            b0, b1 = (int(eval_expr(d, dict(env, batch=v, heads=1, kv_heads=1))) for v in (0, 1))
        except (ExprError, TypeError, ValueError):
            continue
        a, n = b1 - b0, int(t.shape[0])
        if a > 0 and (n - b0) % a == 0 and n >= b0:
            return (n - b0) // a
    return None
