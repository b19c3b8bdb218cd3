"""The last head a global tensor's offset selects: how many heads the launch gives the tensor.

An offset reads `head_idx` and `group`, and may read a kernel's grid axis (`Kernel partial over [split_idx =
Splits]`) or a loop's variable (a combine loop `for split_idx = 0:Splits`): each copy evaluates it where it stands.
Its last head is the offset with every such name at its last value (extent − 1, stop − 1), the tensor's head count
one more than that at the last query head (`head_idx * Splits + split_idx` → heads · Splits).
"""
from __future__ import annotations

from tlc.expr import BinOp, Const, Expr, Var, free_names, substitute
from tlc.ir.graph import Graph
from tlc.ir.ops import LoopOp


def last_head(graph: Graph, offset: Expr) -> Expr | str:
    """`offset` with each grid axis and loop variable it reads at its last value; a str says why it cannot be."""
    names = free_names(offset) - {"head_idx", "group"}
    loops = {op.var: op for _, op in graph.walk() if isinstance(op, LoopOp)}
    out = offset
    for name in sorted(names):
        if name in graph.axes:
            last = BinOp("-", graph.axes[name], Const(1))
        elif name in loops:
            loop = loops[name]
            if loop.stop is None or "/" in str(loop.stop) or str(loop.start) != "0":
                return (f"the offset `{offset}` reads loop variable '{name}', whose loop must run 0:N with N "
                        "free of division, for the launch to size the tensor")
            last = BinOp("-", loop.stop, Const(1))
        else:
            continue   # a Param or an Input: the launch knows it
        out = substitute(out, name, last)
    return out
