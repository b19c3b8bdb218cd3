"""The Allocate rule of `lower-tile-ops`, shared by every target family: a global tensor view
(pointer + the program's batch and head offset), a shared buffer, or a cleared register fragment.

Tile widths pad to the family's column unit (`Family.col_unit`, tile_copies.padded).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from tlc.diagnostics import fail
from tlc.frontend import ast as A
from tlc.ir.graph import Graph
from tlc.ir.ops import AllocateOp
from tlc.kir import ops as K
from tlc.expr import free_names
from tlc.kir.expr import BinOp, Const, Var
from tlc.lowering.storage import Buffer, Slot
from tlc.lowering.tile_copies import kblock, padded

if TYPE_CHECKING:
    from tlc.lowering.tile_ops import TileOpLowering


def lower_allocate(cx: TileOpLowering, op: AllocateOp, region: Graph, out: list[K.Op]) -> None:
    if op.space == "global":
        return _global_view(cx, op)
    if op.space == "register" and len(op.shape) == 1:   # a row vector of zeros: one value per row of the block
        from tlc.lowering.tile_copies import block_rows
        rows = block_rows(cx, cx.x.int_value(op.shape[0], op.loc, "a row vector's rows"), op)
        cx.register_allocs[op.name] = (f"Allocate {op.name} in register", op.loc)
        cx.bind(op.result, cx.fresh_like(Slot("row", "", rows), f"r{op.name}", out, op.loc))
        return
    rows, logical = cx.tile_shape(op.shape, op.loc, f"'{op.name}'")
    cols = padded(logical, cx.family.col_unit)
    if op.space == "shared":
        dtype = op.result.type.dtype or cx.dtype
        if op.name in cx.buffers:
            raise fail(f"tlc build: shared buffer '{op.name}' is allocated twice", op.loc)
        if logical % 8 or not kblock(cols):
            raise fail(f"tlc build: shared tile '{op.name}' has {logical} columns; the copies move 8 elements "
                       "(16 bytes) per thread, so the width must be a multiple of 8", op.loc)
        buf = cx.buffers[op.name] = Buffer(op.name, cx.names.fresh(f"s{op.name}"), rows, cols, dtype, op.loc,
                                           logical_cols=logical)
        cx.bind(op.result, Slot("smem", buf.name, rows, cols, region=-1, buffer=buf, uid=-1, logical_cols=logical))
        return
    name = cx.names.fresh(f"r{op.name}")
    cx.register_allocs[name] = (f"Allocate {op.name} in register", op.loc)
    mma = cx.warp_plan.mma_of_register(op.name)
    out += [cx.warp_plan.accumulator(name, mma, (rows, cols), op.loc), K.ClearOp(target=name, loc=op.loc)]
    cx.bind(op.result, Slot("frag", name, rows, cols, region=cx.region, logical_cols=logical, mma=mma))


def _global_view(cx: TileOpLowering, op: AllocateOp) -> None:
    t = next(t for t in cx.abi.tensors if t.name == op.name)
    if t.cols and t.cols % 8:
        raise fail(f"tlc build: global tensor '{op.name}' has {t.cols} columns; rows are copied in 16-byte "
                   "chunks, so the width must be a multiple of 8 (pad the tensor)", op.loc)
    cols = padded(t.cols, cx.family.col_unit) if t.cols else 0
    known = {"head_idx", "group", "batch_idx", "block_idx", *cx.g.params, *cx.g.inputs, *cx.g.axes}
    if op.offset is not None and free_names(op.offset) - known:   # a loop's variable: a view at each copy
        cx.bind(op.result, Slot("global", f"m{op.name}", cols=cols, region=-1, logical_cols=t.cols, deferred=op))
        return
    view = global_tensor(cx, op, cx.names.fresh(f"m{op.name}"))
    cx.decls.append(view)
    cx.bind(op.result, Slot("global", view.name, cols=cols, region=-1, logical_cols=t.cols))


def global_tensor(cx: TileOpLowering, op: AllocateOp, name: str) -> K.GlobalTensorOp:
    """The kernel's view of global tensor `op` (pointer, batch and head offset, rows; row stride), named `name`;
    its rows, seen to the program's extent, recorded for the copies' predicates."""
    t = next(t for t in cx.abi.tensors if t.name == op.name)
    head = cx.x.lower(op.offset if op.offset is not None else A.Name("head_idx"), op.loc)
    offset = BinOp("+", BinOp("*", Var("batch_idx"), Var(f"p.{t.stride('batch')}")),
                   BinOp("*", head, Var(f"p.{t.stride('head')}")))
    rows = cx.x.lower(op.shape[0], op.loc)
    cx.global_rows[name] = rows
    if op.rows_at is not None:   # a gather: the batch's storage together, rows where the map says
        cx.gathered.add(name)   # every view of it, a per-copy one too (tile_copies.is_gathered)
        return K.GlobalTensorOp(name=name, dtype=t.dtype, ptr=Var(f"p.{t.ptr}"),
                                offset=BinOp("*", head, Var(f"p.{t.stride('head')}")), rows=rows,
                                cols=padded(t.cols, cx.family.col_unit), row_stride=Var(f"p.{t.stride('row')}"),
                                rows_at=cx.x.lower_row_map(op.rows_at, op.loc),
                                storage_rows=Var(f"p.{t.storage_rows}"), loc=op.loc)
    if t.cols == 0:   # a row vector (batch, heads, rows): rows at stride 1
        return K.GlobalTensorOp(name=name, dtype=t.dtype, ptr=Var(f"p.{t.ptr}"), offset=offset, rows=rows, cols=0,
                                row_stride=Const(1), loc=op.loc)
    return K.GlobalTensorOp(name=name, dtype=t.dtype, ptr=Var(f"p.{t.ptr}"), offset=offset, rows=rows,
                            cols=padded(t.cols, cx.family.col_unit), row_stride=Var(f"p.{t.stride('row')}"),
                            loc=op.loc)
