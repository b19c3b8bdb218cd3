"""Where a register tile's rows and columns come from: tile extents and the global load
that fixes each axis's sequence positions, traced through the producer chain.

Shared by `online-softmax` (the row count of the running max before infer-shapes has
run) and `mask` (which load gives the scores' query rows and key columns).
"""
from __future__ import annotations

from dataclasses import dataclass

from tlc.expr import BinOp, Call, Const, Expr
from tlc.ir.graph import Graph
from tlc.ir.ops import (AllocateOp, CopyOp, ElementwiseOp, GemmOp, LoopOp, MaskOp, Op, ReshapeOp, RowReduceOp,
                        ScaledExpOp, SoftmaxOp)
from tlc.ir.types import Value

_PASS_THROUGH = (ElementwiseOp, MaskOp, ReshapeOp, SoftmaxOp, ScaledExpOp)


@dataclass(frozen=True)
class Origin:
    """Tile axis ↔ global tensor axis: positions are `start + i`, `i < tile`, where `start` is
    `coord * tile`, or `extent - (coord + 1) * tile` for rows counted from the end (`from_end`),
    and `extent` is the tensor's length along that axis (elements outside it are absent)."""

    copy: CopyOp
    axis: int
    coord: Expr
    tile: Expr
    extent: Expr | None
    from_end: bool = False

    @property
    def start(self) -> Expr:
        """The tile's first position (negative for a partial first tile counted from the end)."""
        if self.from_end:
            assert self.extent is not None
            return BinOp("-", self.extent, BinOp("*", BinOp("+", self.coord, Const(1)), self.tile))
        return BinOp("*", self.coord, self.tile)

    @property
    def end(self) -> Expr:
        """One past the tile's last position inside the tensor (at most `extent` when it is known)."""
        if self.from_end:
            assert self.extent is not None
            return BinOp("-", self.extent, BinOp("*", self.coord, self.tile))
        stop: Expr = BinOp("*", BinOp("+", self.coord, Const(1)), self.tile)
        return stop if self.extent is None else Call("min", (stop, self.extent))


def tile_operand(op: Op) -> Value | None:
    """The first operand that is a tile (`Multiply S, scale` → S)."""
    return next((v for v in op.operands if v.type.space not in ("scalar", "token")), None)


def _loop_init(loop: LoopOp, v: Value) -> Value | None:
    for i, a in enumerate(loop.args[1:]):
        if a is v:
            return loop.operands[i]
    for i, r in enumerate(loop.results[: len(loop.operands)]):
        if r is v:
            return loop.operands[i]
    return None


def _through(region: Graph, v: Value, axis: int) -> tuple[Value, int] | None:
    """One step up the producer chain, keeping track of which axis is meant."""
    op = region.producer(v)
    if isinstance(op, GemmOp):
        if axis == 0:
            return op.operands[0], 1 if op.trans_a else 0
        return op.operands[1], 0 if op.trans_b else 1
    if isinstance(op, _PASS_THROUGH) or isinstance(op, CopyOp) and op.src_space != "global":
        src = tile_operand(op)
        return None if src is None else (src, axis)
    if isinstance(op, RowReduceOp) and axis == 0:
        return op.operands[0], 0
    if isinstance(op, LoopOp):
        init = _loop_init(op, v)
        return None if init is None else (init, axis)
    return None


def extent(region: Graph, v: Value, axis: int) -> Expr | None:
    """The tile's length along `axis` (symbolic), from its type or its producers."""
    for _ in range(64):
        if v.type.shape is not None and len(v.type.shape) > axis:
            return v.type.shape[axis]
        op = region.producer(v)
        if isinstance(op, CopyOp) and op.tile is not None:
            return op.tile[axis]
        if isinstance(op, AllocateOp) and len(op.shape) > axis:
            return op.shape[axis]
        step = _through(region, v, axis)
        if step is None:
            return None
        v, axis = step
    return None


def origin(region: Graph, v: Value, axis: int) -> Origin | None:
    """The global load giving `v`'s positions along `axis` (None if not a plain load)."""
    for _ in range(64):
        op = region.producer(v)
        if isinstance(op, CopyOp) and op.src_space == "global":
            if op.tile is None:
                return None
            coord = dict(op.coord).get("L" if axis == 0 else "C", Const(0))
            alloc = region.producer(op.operands[0])
            ext = alloc.shape[axis] if isinstance(alloc, AllocateOp) and len(alloc.shape) > axis else None
            if op.from_end and axis == 0 and ext is None:
                return None   # counted from an end that is not known here
            return Origin(op, axis, coord, op.tile[axis], ext, op.from_end and axis == 0)
        step = _through(region, v, axis)
        if step is None:
            return None
        v, axis = step
    return None


def row_source(root: Graph, v: Value) -> Origin | None:
    """The global load whose rows the rows of `v` are, followed through GEMMs' A operands, elementwise ops (every
    tile operand: a row vector `m + log(l)` reaches the scores through either), row reductions and loops (a loop's
    result is what its body yields; a carried value is its initial value or what the body yields): the rows a
    store of `v` writes from. None when no load is reached, or when two paths reach loads of different rows."""
    found = row_origins(root, v)
    first = found[0] if found else None
    if first is None or any((o.copy is not first.copy) and (str(o.coord), str(o.tile), str(o.extent), o.from_end)
                            != (str(first.coord), str(first.tile), str(first.extent), first.from_end) for o in found):
        return None
    return first


def row_origins(root: Graph, v: Value) -> list[Origin]:
    """Every global load the rows of `v` reach (row_source's walk), in the order found."""
    producers = {r.uid: (region, op) for region, op in root.walk() for r in op.results}
    carried = {a.uid: (op, i) for _, op in root.walk() if isinstance(op, LoopOp) for i, a in enumerate(op.args[1:])}
    found: list[Origin] = []
    stack, seen = [(v, 0)], set()
    while stack and len(seen) < 4096:
        v, axis = stack.pop()
        if (v.uid, axis) in seen:
            continue
        seen.add((v.uid, axis))
        if v.uid in carried:
            loop, i = carried[v.uid]
            stack += [(loop.operands[i], axis)] + ([(loop.yields[i], axis)] if i < len(loop.yields) else [])
            continue
        if v.uid not in producers:
            continue
        region, op = producers[v.uid]
        if isinstance(op, LoopOp):
            i = next(i for i, r in enumerate(op.results) if r is v)
            if op.body is not None and i < len(op.yields):
                stack.append((op.yields[i], axis))
            continue
        if isinstance(op, CopyOp) and op.src_space == "global":
            o = origin(region, v, axis)
            if o is not None:
                found.append(o)
            continue
        if isinstance(op, (ElementwiseOp, MaskOp)) and axis == 0:
            stack += [(x, 0) for x in op.operands if x.type.space == "register"]
            continue
        step = _through(region, v, axis)
        if step is not None:
            stack.append(step)
    return found


def all_users(root: Graph, v: Value) -> list[Op]:
    """Every op anywhere under `root` reading `v` (a loop counts when it yields it)."""
    out = []
    for _, op in root.walk():
        if any(x is v for x in op.operands) or isinstance(op, LoopOp) and any(y is v for y in op.yields):
            out.append(op)
    return out


