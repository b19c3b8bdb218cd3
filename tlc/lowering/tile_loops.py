"""The Loop rule of `lower-tile-ops`, shared by every target family: a `ForOp` with the program's
bounds whose carried values live in fixed homes (the initial value's storage when it dies at the
loop, else a copy), the body lowered as a nested region, and the yields moved into the homes at
the end of each trip (through temporaries when a yield reads another value's home).
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from tlc.diagnostics import fail
from tlc.frontend import ast as A
from tlc.ir.graph import Graph
from tlc.ir.ops import LoopOp
from tlc.kir import ops as K
from tlc.kir.expr import E
from tlc.lowering.storage import Slot

if TYPE_CHECKING:
    from tlc.lowering.tile_ops import TileOpLowering


def lower_loop(cx: TileOpLowering, op: LoopOp, region: Graph, out: list[K.Op]) -> None:
    var = cx.names.fresh(op.var)
    cx.x.bind(op.var, var)
    start = cx.x.lower(op.start if op.start is not None else A.Num(0), op.loc)
    stop = cx.x.lower(op.stop, op.loc, ceil=True)
    carried = len(op.operands)
    if len(op.yields) > carried:
        raise fail("tlc build: values exported from a loop body (not carried) have no lowering; "
                   "run the TL passes (online-softmax carries the softmax statistics)", op.loc)
    homes: list[Slot] = []
    for v in op.operands:
        if cx.dies_here(v):
            home = cx.slots[v.uid]
        else:
            like = cx.register_tile(v, op)
            home = cx.fresh_like(like, v.base, out, op.loc)
            out.append(K.MapOp(target=home.name, srcs=(like.name,), fn=E("x0"), loc=op.loc))
        homes.append(home)
    body: list[K.Op] = []
    with cx.nested_region() as inner:
        for arg, home in zip(op.args[1:], homes):
            cx.bind(arg, dataclasses.replace(home, region=inner))
        cx.loops.append((var, set()))
        cx.lower_region(op.body, body, tuple(op.yields[:carried]))
        cx.loops.pop()
        moves = _moves_into_homes(cx, op, homes, body)
        body += moves
    out.append(K.ForOp(var=var, start=start, stop=stop, step=1, body=tuple(body), loc=op.loc))
    for res, home in zip(op.results, homes):
        cx.bind(res, dataclasses.replace(home, region=cx.region))


def _moves_into_homes(cx: TileOpLowering, op: LoopOp, homes: list[Slot], body: list[K.Op]) -> list[K.Op]:
    """The end of a trip: each yield copied into its home. A yield stored in another carried value's
    home goes through a temporary (declared in `body`), so no move reads a home already overwritten."""
    moves = [(cx.slots[y.uid].name, h.name) for y, h in zip(op.yields, homes) if cx.slots[y.uid].name != h.name]
    homes_set = {h.name for h in homes}
    if any(src in homes_set for src, _ in moves):
        temps = []
        for src, dst in moves:
            tmp = cx.fresh_like(next(h for h in homes if h.name == dst), f"{dst}_next", body, op.loc)
            body.append(K.MapOp(target=tmp.name, srcs=(src,), fn=E("x0"), loc=op.loc))
            temps.append((tmp.name, dst))
        moves = temps
    return [K.MapOp(target=dst, srcs=(src,), fn=E("x0"), loc=op.loc) for src, dst in moves]
