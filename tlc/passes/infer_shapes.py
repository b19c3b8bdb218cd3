"""infer-shapes: symbolic tile shapes, element types and fragment roles on every value.

Shapes stay symbolic (`BM`, `HeadDim`) and are compared by their printed form, so a
clash is a clash of intent even when -D makes two dims equal. Before / after:

    %S = gemm(%Q.3, %K.4) {trans_b = true}        : register(?) fp32
    %S = gemm(%Q.3, %K.4) {trans_b = true}        : register(BM, BN) fp32 acc

A GEMM whose inner dims clash is an error naming both operands, unless exactly one
other reading of its `.T` marks type-checks: that is resolve-transpose's to repair, so
this pass types the result by that reading and says nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from tlc.diagnostics import Note
from tlc.expr import Expr
from tlc.ir.graph import Graph
from tlc.ir.ops import (AllocateOp, CopyOp, ElementwiseOp, FullOp, GemmOp, LoopOp, MaskOp, ReshapeOp,
                        RowReduceOp, ScalarOp, ScaledExpOp, SoftmaxOp)
from tlc.ir.types import DTYPES, MMA_ROLE, SCALAR, TileType, Value
from tlc.passes.base import Pass, PassContext

Shape = tuple[Expr, ...]


def dims(shape: Shape | None) -> tuple[str, ...] | None:
    """The printed form of a shape: what 'the same dimension' means to these passes."""
    return None if shape is None else tuple(str(d) for d in shape)


def shape_text(shape: Shape | None) -> str:
    return "(?)" if shape is None else "(" + ", ".join(str(d) for d in shape) + ")"


class Reading(NamedTuple):
    trans_a: bool
    trans_b: bool
    shape: Shape  # (M, N) of the product


def product_shape(a: Shape, b: Shape, trans_a: bool, trans_b: bool, acc: Shape | None) -> Shape | None:
    """(M, N) of op(a)·op(b), or None if the inner dims (or the accumulator) disagree."""
    if len(a) != 2 or len(b) != 2:
        return None
    m, k = (a[1], a[0]) if trans_a else (a[0], a[1])
    k2, n = (b[1], b[0]) if trans_b else (b[0], b[1])
    if str(k) != str(k2):
        return None
    if acc is not None and dims(acc) != (str(m), str(n)):
        return None
    return (m, n)


def gemm_readings(op: GemmOp, a: Shape, b: Shape, acc: Shape | None) -> list[Reading]:
    """Every placement of `.T` marks under which the GEMM type-checks, the written one first."""
    flags = [(op.trans_a, op.trans_b)] + [(ta, tb) for ta in (False, True) for tb in (False, True)
                                          if (ta, tb) != (op.trans_a, op.trans_b)]
    out = []
    for ta, tb in flags:
        shape = product_shape(a, b, ta, tb, acc)
        if shape is not None:
            out.append(Reading(ta, tb, shape))
    return out


def operand_text(v: Value, transposed: bool, shape: Shape | None) -> str:
    if transposed and shape is not None and len(shape) == 2:
        return f"{v.base}.T {shape_text((shape[1], shape[0]))}"
    return f"{v.base}{'.T' if transposed else ''} {shape_text(shape)}"


def program_dtype(graph: Graph) -> str | None:
    v = graph.root().params.get("dtype")
    return DTYPES.get(str(v)) if v is not None else None


@dataclass(frozen=True)
class InferShapesPass(Pass):
    """Types every value; idempotent (it recomputes from the ops, never from old types)."""

    name: ClassVar[str] = "infer-shapes"

    def apply(self, ctx: PassContext, graph: Graph) -> None:
        _Infer(ctx).region(graph)
        _roles_by_use(graph)


class _Infer:
    def __init__(self, ctx: PassContext):
        self.ctx = ctx
        self.reported: set[tuple[str, object]] = set()  # loop bodies are swept more than once

    def error(self, message: str, loc, *notes: Note) -> None:
        if (message, loc) not in self.reported:
            self.reported.add((message, loc))
            self.ctx.error(message, loc, *notes)

    def region(self, g: Graph) -> None:
        for op in g.ops():
            handler = getattr(self, "op_" + type(op).__name__, None)
            if handler is not None:
                handler(op, g)

    @staticmethod
    def set(v: Value, space: str, shape: Shape | None, dtype: str | None, role: str = "none") -> None:
        v.type = TileType(space, shape, dtype, role)

    def op_AllocateOp(self, op: AllocateOp, g: Graph) -> None:
        self.set(op.result, op.space, tuple(op.shape) or None, op.dtype)  # acc: set by use, below

    def op_CopyOp(self, op: CopyOp, g: Graph) -> None:
        src = op.operands[0].type
        shape = tuple(op.tile) if op.tile is not None else src.shape
        dtype = op.operands[1].type.dtype if op.dst_space == "global" else src.dtype
        self.set(op.result, op.dst_space, shape, dtype)  # A/B: set by use, below

    def op_ScalarOp(self, op: ScalarOp, g: Graph) -> None:
        op.result.type = SCALAR

    def op_GemmOp(self, op: GemmOp, g: Graph) -> None:
        a, b = op.operands[0], op.operands[1]
        acc = op.operands[2].type.shape if op.accumulate else None
        shape = None
        if a.type.shape is not None and b.type.shape is not None:
            readings = gemm_readings(op, a.type.shape, b.type.shape, acc)
            written = [r for r in readings if (r.trans_a, r.trans_b) == (op.trans_a, op.trans_b)]
            if written:
                shape = written[0].shape
            elif len(readings) == 1:
                shape = readings[0].shape  # a unique `.T` repair: resolve-transpose's job
            elif not readings:
                self.error(
                    f"GEMM inner dimensions differ: {operand_text(a, op.trans_a, a.type.shape)} · "
                    f"{operand_text(b, op.trans_b, b.type.shape)}"
                    + (f" accumulating into {op.operands[2].base} {shape_text(acc)}" if acc else ""),
                    op.loc, Note("op(A) is (M, K) and op(B) is (K, N); no placement of '.T' makes them agree"))
        elif acc is not None:
            shape = acc
        self.set(op.result, "register", shape, "fp32", "acc")

    def op_ElementwiseOp(self, op: ElementwiseOp, g: Graph) -> None:
        tiles = [v for v in op.operands if v.type.space != "scalar"]
        if not tiles:
            return
        ref = max(tiles, key=lambda v: len(v.type.shape or ()))
        for v in tiles:
            if not _broadcasts(v.type.shape, ref.type.shape):
                self.error(f"'{op.fn}' of tiles with different shapes: {v.base} {shape_text(v.type.shape)} "
                               f"and {ref.base} {shape_text(ref.type.shape)}", op.loc)
                break
        dtype = "fp32" if any(v.type.dtype == "fp32" for v in tiles) else ref.type.dtype
        self.set(op.result, "register", ref.type.shape, dtype, ref.type.role)

    def op_MaskOp(self, op: MaskOp, g: Graph) -> None:
        x = op.operands[0].type
        self.set(op.result, "register", x.shape, x.dtype, x.role)

    def op_SoftmaxOp(self, op: SoftmaxOp, g: Graph) -> None:
        x = op.operands[0].type
        self.set(op.results[0], "register", x.shape, "fp32", x.role)
        for stat in op.results[1:]:
            self.set(stat, "register", _rows(x.shape), "fp32")

    def op_ReshapeOp(self, op: ReshapeOp, g: Graph) -> None:
        x = op.operands[0].type
        role = MMA_ROLE.get(op.dst_modes[0], "none") if op.dst_modes else "none"
        self.set(op.result, "register", x.shape, op.dtype or x.dtype, role)

    def op_FullOp(self, op: FullOp, g: Graph) -> None:
        self.set(op.result, "register", tuple(op.shape) or None, op.dtype)

    def op_RowReduceOp(self, op: RowReduceOp, g: Graph) -> None:
        self.set(op.result, "register", _rows(op.operands[0].type.shape), "fp32")

    def op_ScaledExpOp(self, op: ScaledExpOp, g: Graph) -> None:
        x = op.operands[0].type
        self.set(op.result, "register", x.shape, "fp32", x.role)

    def op_LoopOp(self, op: LoopOp, g: Graph) -> None:
        assert op.body is not None
        for arg, init in zip(op.args[1:], op.operands):
            arg.type = init.type
        for _ in range(3):  # a carried value's role (acc) may only show after one sweep
            self.region(op.body)
            changed = False
            for arg, init, y in zip(op.args[1:], op.operands, op.yields):
                if dims(y.type.shape) != dims(init.type.shape) and None not in (y.type.shape, init.type.shape):
                    self.error(f"'{init.base}' enters loop '{op.var}' as {shape_text(init.type.shape)} but "
                                   f"an iteration leaves it {shape_text(y.type.shape)}", op.loc)
                    return
                joined = init.type.with_(role=y.type.role if y.type.role != "none" else init.type.role)
                if arg.type != joined:
                    arg.type, changed = joined, True
            if not changed:
                break
        for r, y in zip(op.results, op.yields):
            r.type = y.type


def _rows(shape: Shape | None) -> Shape | None:
    return None if shape is None or len(shape) != 2 else (shape[0],)


def _broadcasts(small: Shape | None, big: Shape | None) -> bool:
    """Equal shapes, or a row vector (M,) against an (M, N) tile."""
    if small is None or big is None:
        return True
    if dims(small) == dims(big):
        return True
    return len(small) == 1 and len(big) == 2 and str(small[0]) == str(big[0])


def _roles_by_use(graph: Graph) -> None:
    """Register copies feeding a GEMM become its A/B fragment; accumulators are `acc`
    back to the register Allocate that zero-fills them (through loop-carried args)."""
    for region, op in graph.walk():
        if not isinstance(op, GemmOp):
            continue
        for v, role in zip(op.operands[:2], ("A", "B")):
            src = region.producer(v)
            if isinstance(src, CopyOp) and src.dst_space == "register":
                v.type = v.type.with_(role=role)
        if op.accumulate:
            _mark_acc(region, op.operands[2])


def _mark_acc(region: Graph, v: Value) -> None:
    seen: set[int] = set()
    while v.uid not in seen:
        seen.add(v.uid)
        v.type = v.type.with_(role="acc")
        src = region.producer(v)
        carried = list(src.args[1:]) if isinstance(src, LoopOp) else []
        if not any(a is v for a in carried):
            return  # the zero-filled Allocate (or whatever else started it)
        v = src.operands[next(i for i, a in enumerate(carried) if a is v)]

