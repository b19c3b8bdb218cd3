"""Fragment-math rules of `lower-tile-ops`, shared by every target family: scalars, elementwise
ops, masks, row reductions, scaled exp2, constant tiles and the accumulator → A-operand Reshape.

Each rule takes the lowering context (tlc.lowering.tile_ops.TileOpLowering), the op, its region and
the kernel-IR list it appends to; tlc.lowering.rules registers them.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from tlc.diagnostics import fail
from tlc.frontend import ast as A
from tlc.ir.graph import Graph
from tlc.ir.ops import ElementwiseOp, FullOp, MaskOp, Op, ReshapeOp, RowReduceOp, ScalarOp, ScaledExpOp
from tlc.ir.tensor_inputs import stored_rows
from tlc.ir.types import Value
from tlc.kir import ops as K
from tlc.kir.expr import BinOp, Const, E, Expr, Var, substitute
from tlc.lowering.storage import Slot
from tlc.passes.tile_origin import origin

if TYPE_CHECKING:
    from tlc.lowering.tile_ops import TileOpLowering

LOG2E = 1.4426950408889634

# TL elementwise function → kernel-IR expression in x0, x1 (LANGUAGE.md §5: division by zero is 0).
FN = {"add": "x0 + x1", "sub": "x0 - x1", "mul": "x0 * x1", "div": "select(x1 == 0.0, 0.0, x0 / x1)",
      "max": "max(x0, x1)", "min": "min(x0, x1)", "exp": f"exp2(x0 * {LOG2E!r})", "exp2": "exp2(x0)",
      "log": "log(x0)", "tanh": "tanh(x0)", "relu": "max(x0, 0.0)", "neg": "-x0", "abs": "abs(x0)",
      "sqrt": "sqrt(x0)", "square": "x0 * x0"}


def lower_scalar(cx: TileOpLowering, op: ScalarOp, region: Graph, out: list[K.Op]) -> None:
    value = cx.x.lower(op.expr, op.loc)
    is_float = not cx.x._is_int(value)
    name = cx.names.fresh(op.result.base)
    out.append(K.LetOp(name=name, type="f32" if is_float else "i32", value=value, loc=op.loc))
    if is_float:
        cx.x.float_names.add(name)
    cx.bind(op.result, Slot("scalar", name, region=cx.region, is_float=is_float))


def _scalar_expr(cx: TileOpLowering, v: Value, op: Op) -> Expr | None:
    s = cx.slot(v, op)
    return Var(s.name) if s.kind == "scalar" else None


def lower_elementwise(cx: TileOpLowering, op: ElementwiseOp, region: Graph, out: list[K.Op]) -> None:
    fn = E(FN[op.fn])
    slots = [cx.slot(v, op) for v in op.operands]
    tiles = [i for i, s in enumerate(slots) if s.kind != "scalar"]
    if not tiles:
        raise fail("tlc build: an elementwise op on scalars only; write it as an expression", op.loc)
    for i, s in enumerate(slots):
        if s.kind == "scalar":
            fn = substitute(fn, f"x{i}", Var(s.name))
    kinds = {slots[i].kind for i in tiles}
    if kinds - {"frag", "row"}:
        cx.register_tile(op.operands[tiles[0]], op)
    if kinds == {"frag", "row"}:
        t = next(i for i in tiles if slots[i].kind == "frag")
        r = next(i for i in tiles if slots[i].kind == "row")
        if slots[t].rows != slots[r].rows:
            raise fail("tlc build: the row vector's length differs from the tile's rows", op.loc)
        fn = substitute(substitute(fn, f"x{t}", Var("x")), f"x{r}", Var("r"))
        dst = cx.in_place(op.operands[t], op.result, out, op.loc)
        out.append(K.RowBroadcastOp(target=dst.name, vec=slots[r].name, fn=fn, loc=op.loc))
        return
    shapes = {(slots[i].rows, slots[i].cols) for i in tiles}
    if len({slots[i].mma for i in tiles}) > 1:
        raise fail("tlc build: elementwise operands are spread over the warps differently (one is split by "
                   "columns across warps); compute them with GEMMs of the same kind", op.loc)
    if len(shapes) > 1:
        raise fail(f"tlc build: elementwise operands have different shapes {sorted(shapes)}", op.loc)
    for k, i in enumerate(tiles):
        fn = substitute(fn, f"x{i}", Var(f"y{k}"))
    for k in range(len(tiles)):
        fn = substitute(fn, f"y{k}", Var(f"x{k}"))
    first = op.operands[tiles[0]]
    if cx.dies_here(first):
        dst = cx.bind(op.result, dataclasses.replace(slots[tiles[0]], region=cx.region))
    else:
        dst = cx.bind(op.result, cx.fresh_like(slots[tiles[0]], op.result.base, out, op.loc))
    out.append(K.MapOp(target=dst.name, srcs=tuple(slots[i].name for i in tiles), fn=fn, loc=op.loc))


def lower_mask(cx: TileOpLowering, op: MaskOp, region: Graph, out: list[K.Op]) -> None:
    s = cx.register_tile(op.operands[0], op)
    rows_o, cols_o = origin(region, op.operands[0], 0), origin(region, op.operands[0], 1)
    if rows_o is None or cols_o is None:
        raise fail("tlc build: cannot tell which query rows and key columns this tile holds (mask a GEMM "
                   "result of tiles copied from global)", op.loc)
    row0, col0 = cx.x.lower(rows_o.start, op.loc), cx.x.lower(cols_o.start, op.loc)
    ident = cx.identity(s.rows, s.cols)
    coord = cx.partition(("C", ident, s.mma), f"tS{ident}", cx.warp_plan.slice_of(s.mma), "partition_C", Var(ident))
    dst = cx.in_place(op.operands[0], op.result, out, op.loc)
    if op.kind == "bounds":
        mask = K.MaskOp(target=dst.name, coord=coord, row0=row0, col0=col0, sq=Const(0),
                        sk=cx.x.lower(op.limit, op.loc), causal=False, alignment="top_left", bounds=True, loc=op.loc)
    elif op.kind == "predicate":   # each element, in the trips the mask pass left it (op.trips())
        assert op.predicate is not None
        mask = K.MaskOp(target=dst.name, coord=coord, row0=row0, col0=col0, sq=Const(0), sk=Const(0), causal=False,
                        alignment="top_left", bounds=False, predicate=cx.x.lower(op.predicate, op.loc, positions=True),
                        loc=op.loc)
    else:
        if rows_o.extent is None or cols_o.extent is None:
            raise fail("tlc build: a causal mask needs the lengths of both sequences", op.loc)
        # the diagonal's shift is the sequence lengths' difference: the rows the tensors hold (R of an extent
        # min(E, R) read from a tensor Input), as the interpreter and the mask pass take it
        held = [stored_rows(o.extent) for o in (rows_o, cols_o)]
        if any(isinstance(h, str) for h in held):
            raise fail(f"tlc build: {next(h for h in held if isinstance(h, str))}", op.loc)
        mask = K.MaskOp(target=dst.name, coord=coord, row0=row0, col0=col0, sq=cx.x.lower(held[0], op.loc),
                        sk=cx.x.lower(held[1], op.loc), causal=True, alignment=op.alignment, bounds=False,
                        loc=op.loc)
    trips = op.trips()
    if trips is None:
        out.append(mask)
        return
    # `n >= E` alone stays in that form: split-masked-trips reads it as the first masked trip
    out.append(K.IfOp(cond=cx.x.lower(trips, op.loc), body=(mask,), loc=op.loc))


def lower_row_reduce(cx: TileOpLowering, op: RowReduceOp, region: Graph, out: list[K.Op]) -> None:
    s = cx.register_tile(op.operands[0], op)
    if s.kind != "frag":
        raise fail("tlc build: a row reduction reads a tile", op.loc)
    if s.logical_cols != s.cols:
        raise fail(f"tlc build: a row reduction over a tile whose {s.logical_cols} columns are padded to {s.cols} "
                   "in the kernel is not supported; use a width that is a multiple of 32", op.loc)
    cx.warp_plan.need_whole_rows(s.mma, "a row reduction", op.loc)
    dst = cx.bind(op.result, cx.fresh_like(Slot("row", "", s.rows), op.result.base, out, op.loc))
    out += [K.RowReduceOp(dst=dst.name, src=s.name, kind=op.fn, accumulate=False, loc=op.loc),
            K.AllReduceOp(target=dst.name, kind=op.fn, width=4, loc=op.loc)]


def lower_scaled_exp(cx: TileOpLowering, op: ScaledExpOp, region: Graph, out: list[K.Op]) -> None:
    x, m = (cx.register_tile(v, op) for v in op.operands[:2])
    scale = _scalar_expr(cx, op.operands[2], op)
    if m.kind != "row" or scale is None:
        raise fail("tlc build: scaled_exp2 takes a tile, a row vector and a scalar", op.loc)
    if x.kind == "frag":
        dst = cx.in_place(op.operands[0], op.result, out, op.loc)
        out.append(K.Exp2ScaleOp(target=dst.name, row_max=m.name, scale_log2=scale, loc=op.loc))
        return
    fn = substitute(E("exp2(x0 * s - select(x1 == -inf, 0.0, x1 * s))"), "s", scale)
    dst = cx.bind(op.result, cx.fresh_like(x, op.result.base, out, op.loc))
    out.append(K.MapOp(target=dst.name, srcs=(x.name, m.name), fn=fn, loc=op.loc))


def lower_full(cx: TileOpLowering, op: FullOp, region: Graph, out: list[K.Op]) -> None:
    dims = [cx.x.int_value(d, op.loc, "a tile extent") for d in op.shape]
    if len(dims) == 1:
        dst = cx.fresh_like(Slot("row", "", dims[0]), op.result.base, out, op.loc, init=float(op.value))
    else:
        dst = cx.fresh_like(Slot("frag", "", *dims), op.result.base, out, op.loc)
        out.append(K.MapOp(target=dst.name, srcs=(), fn=Const(float(op.value)), loc=op.loc))
    cx.bind(op.result, dst)


def lower_reshape(cx: TileOpLowering, op: ReshapeOp, region: Graph, out: list[K.Op]) -> None:
    s = cx.register_tile(op.operands[0], op)
    if s.kind != "frag" or (op.src_modes[:1], op.dst_modes[:1]) != (("MMA_C",), ("MMA_A",)):
        raise fail("tlc build: the lowering regroups an accumulator (MMA_C) as an A operand (MMA_A) "
                   f"only; this Reshape goes {op.src_modes[:1]} → {op.dst_modes[:1]}", op.loc)
    dtype = op.dtype or cx.dtype
    if dtype not in ("bf16", "fp16"):
        raise fail(f"tlc build: an A operand is bf16 or fp16, not {dtype}", op.loc)
    cx.warp_plan.need_whole_rows(s.mma, "a Reshape to an A operand", op.loc)
    conv, frag = cx.names.fresh(f"r{op.result.base}"), cx.names.fresh(f"tAr{op.result.base}")
    out += [K.ConvertOp(name=conv, src=s.name, dtype=dtype, loc=op.loc),
            K.RetileAccToAOp(name=frag, src=conv, mma=s.mma, loc=op.loc)]
    cx.bind(op.result, Slot("afrag", frag, s.rows, s.cols, region=cx.region, mma=s.mma))
