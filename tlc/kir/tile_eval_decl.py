"""Tile evaluator: declarations — scalars, atoms, layouts, shared buffers and views, global tensors
and tiles, partitions, fragments and row vectors — bound to tile values in a `Block`."""
from __future__ import annotations

import torch

from tlc.kir import ops as K
from tlc.kir.expr import Const, Var
from tlc.kir.evaluate import evaluate
from tlc.kir.tile_eval_expr import F64, TileFault, round_to
from tlc.kir.tile_eval_state import (Block, Coords, Frag, GlobalTiles, GlobalView, OperandFrag, SharedRef, Window,
                                     handles, partitioned, tile_start)


@handles(K.LetOp)
def _let(blk: Block, op: K.LetOp) -> None:
    v = blk.scalar(op.value)
    if op.type in ("i32", "i64"):
        if isinstance(v, float) and not v.is_integer():
            raise TileFault(f"{op.name} is {op.type} but `{op.value}` = {v}")
        v = int(v)
    elif op.type == "f32":
        v = round_to(torch.tensor(float(v), dtype=F64), "fp32").item()
    else:
        v = bool(v)
    blk.scalars[op.name] = v


@handles(K.TiledMmaOp)
def _mma(blk: Block, op: K.TiledMmaOp) -> None:
    blk.mmas[op.name] = op
    blk.slices.add(op.thread_slice)


@handles(K.TiledCopyOp)
def _copy_atom(blk: Block, op: K.TiledCopyOp) -> None:
    if op.kind != "threads" and op.mma not in blk.mmas:
        raise TileFault(f"{op.name} is matched to unknown TiledMMA {op.mma!r}")
    blk.copies[op.name] = op
    blk.slices.add(op.thread_slice)


@handles(K.SmemLayoutOp)
def _layout(blk: Block, op: K.SmemLayoutOp) -> None:
    blk.layouts[op.name] = op.shape


@handles(K.SmemTransposeLayoutOp)
def _transpose_layout(blk: Block, op: K.SmemTransposeLayoutOp) -> None:
    if op.of not in blk.layouts or op.of in blk.transpose_of:
        raise TileFault(f"{op.name} transposes {op.of!r}, which is not a shared layout declared before it")
    base = blk.layouts[op.of]
    if op.shape != (base[1], base[0], *base[2:]):
        raise TileFault(f"{op.name} has shape {op.shape}, but the transpose of {op.of} {base} is "
                        f"{(base[1], base[0], *base[2:])}")
    blk.layouts[op.name] = op.shape
    blk.transpose_of[op.name] = op.of


@handles(K.SharedBufferOp)
def _shared(blk: Block, op: K.SharedBufferOp) -> None:
    if op.layout not in blk.layouts or op.layout in blk.transpose_of:
        raise TileFault(f"{op.name} uses {op.layout!r}, which is not a (non-transposed) shared layout")
    shape = blk.layouts[op.layout]
    blk.smem.declare(op.name, op.dtype, shape, op.offset_bytes)
    blk.values[op.name] = SharedRef(op.name, transposed=False, stages=shape[2] if len(shape) == 3 else 0)


@handles(K.SharedViewOp)
def _shared_view(blk: Block, op: K.SharedViewOp) -> None:
    of = blk.value(op.of)
    if not isinstance(of, SharedRef) or of.stage is not None or of.rank != 2:
        raise TileFault(f"{op.name} views {op.of}, which is not a whole shared buffer")
    base = tuple(blk.smem.data[of.buffer].shape)
    layout = blk.layouts.get(op.layout)
    if layout is None:
        raise TileFault(f"{op.name} uses unknown layout {op.layout!r}")
    transposed = op.layout in blk.transpose_of
    if (transposed and layout != (base[1], base[0], *base[2:])) or (not transposed and layout != base):
        raise TileFault(f"{op.name}'s layout {op.layout} {layout} does not cover {of.buffer} {base}")
    blk.values[op.name] = SharedRef(of.buffer, transposed=transposed, stages=of.stages)


@handles(K.GlobalTensorOp)
def _global(blk: Block, op: K.GlobalTensorOp) -> None:
    if not isinstance(op.ptr, Var) or op.ptr.name not in blk.tensors:
        raise TileFault(f"{op.name} points at `{op.ptr}`, which is no tensor pointer of the launch ABI")
    bound = blk.tensors[op.ptr.name]
    name, dtype, storage = bound.name, bound.dtype, bound.storage
    if dtype != op.dtype:
        raise TileFault(f"{op.name} reads {name} as {op.dtype}, but the launch binds it as {dtype}")
    if op.rows_at is not None:
        _gathered(blk, op, bound)
        return
    offset, rows = blk.integer(op.offset), blk.integer(op.rows)
    real_rows = storage.shape[2]
    real_cols = storage.shape[3] if storage.dim() == 4 else 0   # a row vector (batch, heads, rows)
    if isinstance(op.rows, Var) or isinstance(op.rows, Const):
        if rows != real_rows:
            raise TileFault(f"{op.name} declares {rows} rows; the bound tensor {name} has {real_rows}")
    elif rows > real_rows:   # an extent the program computes (min(kv_lengths[b], seqlen_k)): its first rows
        raise TileFault(f"{op.name} declares {rows} rows, more than the bound tensor {name} holds ({real_rows})")
    rows = max(rows, 0)
    if op.cols:
        size, stride = (rows, real_cols), (blk.integer(op.row_stride), 1)
    else:
        size, stride = (rows,), (1,)
    last = offset + sum((n - 1) * s for n, s in zip(size, stride))
    if rows and (offset < 0 or last >= storage.numel()):
        raise TileFault(f"{op.name} at element offset {offset} reaches outside tensor {name} "
                        f"({storage.numel()} elements)")
    start = offset if rows else 0
    owner = None if bound.owner is None else torch.as_strided(bound.owner, size, stride, start)
    blk.values[op.name] = GlobalView(name, torch.as_strided(storage, size, stride, start), op.cols, op.dtype, owner)


def _gathered(blk: Block, op: K.GlobalTensorOp, bound) -> None:
    """A gathered tensor (tlc/ir/row_maps.py): row r of its `rows` is row `rows_at` (at row = r) of the head's
    storage, zeros where that is outside the `storage_rows` rows."""
    storage = bound.storage
    if storage.dim() != 4 or storage.shape[0] != 1:
        raise TileFault(f"{op.name} gathers rows from {bound.name}, which must be a (1, heads, rows, cols) storage")
    real_rows, real_cols = storage.shape[2], storage.shape[3]
    if blk.integer(op.storage_rows) != real_rows:
        raise TileFault(f"{op.name} says its storage has {blk.integer(op.storage_rows)} rows; {bound.name} has "
                        f"{real_rows}")
    offset, rows, stride = blk.integer(op.offset), max(blk.integer(op.rows), 0), blk.integer(op.row_stride)
    if offset < 0 or offset + (real_rows - 1) * stride + real_cols > storage.numel():
        raise TileFault(f"{op.name} at element offset {offset} reaches outside tensor {bound.name}")
    heads = torch.as_strided(storage, (real_rows, real_cols), (stride, 1), offset)
    data = torch.zeros((rows, real_cols), dtype=storage.dtype)
    index = torch.tensor([int(evaluate(op.rows_at, {**blk.scalars, "row": r})) for r in range(rows)],
                         dtype=torch.int64)
    inside = (index >= 0) & (index < real_rows)
    data[inside] = heads[index[inside]]
    scatter = owner = None
    if bound.owner is not None:   # an output: stores go to the storage rows
        scatter = (heads, torch.as_strided(bound.owner, (real_rows, real_cols), (stride, 1), offset), index)
        owner = torch.full((rows, real_cols), -1, dtype=torch.int64)
    blk.values[op.name] = GlobalView(bound.name, data, op.cols, op.dtype, owner, gathered=True, scatter=scatter)


@handles(K.GlobalTileOp)
def _global_tile(blk: Block, op: K.GlobalTileOp) -> None:
    view = blk.value(op.src)
    if not isinstance(view, GlobalView) or len(op.tile) != view.data.dim():
        raise TileFault(f"{op.name} tiles {op.src} with a {len(op.tile)}-D tile; it needs a global tensor of that rank")
    if view.cols and op.tile[1] > view.cols:
        raise TileFault(f"{op.name}'s tile is {op.tile[1]} columns wide, {op.src} only {view.cols}")
    coord = tuple(None if c == Var("_") else blk.integer(c) for c in op.coord)
    shift = blk.integer(op.row_shift) if op.row_shift is not None else 0
    if all(c is not None for c in coord):
        blk.values[op.name] = Window(view, tile_start(coord, op.tile, shift), op.tile, rank=len(op.tile))
    else:
        blk.values[op.name] = GlobalTiles(view, op.tile, coord, rank=len(op.tile), row_shift=shift)


@handles(K.IdentityTileOp)
def _identity(blk: Block, op: K.IdentityTileOp) -> None:
    blk.values[op.name] = Coords(op.shape)


@handles(K.PartitionOp)
def _partition(blk: Block, op: K.PartitionOp) -> None:
    if op.slice not in blk.slices:
        raise TileFault(f"{op.name} partitions by {op.slice!r}, which no TiledCopy or TiledMMA declares")
    src = blk.resolve(op.src)
    retile = op.method.startswith("retile")
    if retile != isinstance(src, (Frag, OperandFrag)):
        raise TileFault(f"{op.method} of {type(src).__name__} `{op.src}`: retile_S/D view registers, "
                        "partition_* view memory or coordinates")
    blk.values[op.name] = partitioned(src, op.slice)


@handles(K.FragmentOp)
def _fragment(blk: Block, op: K.FragmentOp) -> None:
    if op.mma not in blk.mmas:
        raise TileFault(f"{op.name} belongs to unknown TiledMMA {op.mma!r}")
    if op.role == "C":
        # Uninitialised registers: NaN, so a read before a ClearOp or a write shows in the output.
        blk.values[op.name] = Frag(torch.full(op.shape, float("nan"), dtype=F64), op.dtype, "C", op.name)
        return
    src = blk.resolve(op.src)
    if not isinstance(src, SharedRef) or src.rank != 2:
        raise TileFault(f"operand fragment {op.name} is shaped like `{op.src}`, which is not a shared tile")
    src.key()
    blk.values[op.name] = OperandFrag(src, op.role, op.mma, op.name)


@handles(K.RowVectorOp)
def _row_vector(blk: Block, op: K.RowVectorOp) -> None:
    like = blk.frag(op.like, 2)
    if like.role != "C":
        raise TileFault(f"{op.name} is laid out like {op.like}, which is not an accumulator")
    init = float(blk.scalar(op.init))
    blk.values[op.name] = Frag(torch.full((like.data.shape[0],), init, dtype=F64), "fp32", "row", op.name)
