"""Head offsets that read a kernel's grid axis or a loop's variable, and the heads they select.

An offset reads `head_idx` and `group`; it may also read one grid axis (`Kernel partial over [split_idx = Splits]`)
or one loop's variable (a combine loop `for split_idx = 0:Splits`), each copy evaluating it where it stands. Such an
offset must have the one form `head_idx * N + v`, `v` ranging over 0 … N − 1 (the axis's extent N, or every loop
binding `v` running `0:N`): then each (query head, v) has a head of its own, heads · N in all, and the query heads
are the tensor's heads / N. Any other offset that reads such a name is refused, so no launch can size a tensor by a
head the kernel does not reach last, or write one head from two instances.
"""
from __future__ import annotations

from tlc.expr import BinOp, Const, Expr, Var, free_names
from tlc.ir.graph import Graph
from tlc.ir.ops import LoopOp

FORM = "`head_idx * N + v`, v a grid axis of extent N or a loop's variable over 0:N"


def varying_names(graph: Graph, offset: Expr) -> set[str]:
    """The grid axes and loop variables `offset` reads."""
    loops = {op.var for _, op in graph.walk() if isinstance(op, LoopOp)}
    return free_names(offset) & (set(graph.axes) | loops)


def split_form(graph: Graph, offset: Expr) -> tuple[Expr, str] | str:
    """(N, v) of an offset `head_idx * N + v`; a str says why `offset` is not of that form."""
    if not (isinstance(offset, BinOp) and offset.op == "+" and isinstance(offset.rhs, Var)
            and isinstance(offset.lhs, BinOp) and offset.lhs.op == "*" and offset.lhs.lhs == Var("head_idx")):
        return f"the head offset `{offset}` reads a grid axis or a loop's variable, so it must be {FORM}"
    n, v = offset.lhs.rhs, offset.rhs.name
    if free_names(n) - set(graph.params) - set(graph.inputs):
        return f"the head offset `{offset}`: N = `{n}` must be an expression over Params and Inputs"
    if v in graph.axes:
        if graph.axes[v] != n:
            return f"the head offset `{offset}`: grid axis '{v}' ranges over 0:{graph.axes[v]}, not 0:{n}"
        return n, v
    loops = [op for _, op in graph.walk() if isinstance(op, LoopOp) and op.var == v]
    if not loops:
        return f"the head offset `{offset}`: '{v}' is neither a grid axis nor a loop's variable"
    for loop in loops:
        if str(loop.start) != "0" or loop.stop != n:
            return (f"the head offset `{offset}`: every loop over '{v}' must run 0:{n} (one runs "
                    f"{loop.start}:{loop.stop})")
    return n, v


def last_head(graph: Graph, offset: Expr) -> Expr | str:
    """The head the last query head reaches at the last value of `offset`'s axis or loop variable: `head_idx * N +
    (N − 1)`; a str says why the offset is refused."""
    form = split_form(graph, offset)
    if isinstance(form, str):
        return form
    n, _ = form
    return BinOp("+", BinOp("*", Var("head_idx"), n), BinOp("-", n, Const(1)))
