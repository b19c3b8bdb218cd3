"""Tile evaluator: executable ops — copies, cp.async groups, waits and barriers, GEMM k-blocks and
the fragment math — on whole tiles. GEMM operands are (M, K) and (N, K): a k-major B is stored
(N, K), an mn-major B is read through its transposed view. An S2R load copies one 16-wide k-block
into the operand fragment's registers as shared memory holds it then; an MMA reads k-block kb of
its operands (registers, or a bf16/fp16 accumulator retiled as A) and adds A·Bᵀ."""
from __future__ import annotations

import torch

from tlc.kir import ops as K
from tlc.kir.expr import Var
from tlc.kir.tile_eval_expr import TileFault, eval_tensor_expr, round_to
from tlc.kir.tile_eval_state import (Block, Coords, Frag, GlobalView, OperandFrag, SharedRef, Window, handles,
                                     read_window, write_window)

NEG_INF = float("-inf")


# ----------------------------------------------------------------------------- copies and sync
def _copy_slices(blk: Block, copy: str, **operands: object) -> K.TiledCopyOp:
    """Every operand of a tiled copy must be partitioned by that copy's thread slice."""
    if copy not in blk.copies:
        raise TileFault(f"unknown tiled copy {copy!r}")
    atom = blk.copies[copy]
    for role, v in operands.items():
        if v is not None and getattr(v, "slice", "") != atom.thread_slice:
            raise TileFault(f"{role} is partitioned by {getattr(v, 'slice', '') or 'nothing'}, not by "
                            f"{copy}'s thread slice {atom.thread_slice}")
    return atom


def _pred_shape(pred: object, shape: tuple[int, ...]) -> None:
    if pred is not None and (not isinstance(pred, Coords) or pred.shape != shape):
        raise TileFault(f"the predicate is not the coordinates of a {shape} tile")


@handles(K.AsyncCopyOp)
def _async_copy(blk: Block, op: K.AsyncCopyOp) -> None:
    src, dst = blk.resolve(op.src), blk.shared(op.dst)
    pred = blk.resolve(op.pred) if op.pred is not None else None
    _copy_slices(blk, op.copy, src=src, dst=dst, pred=pred)
    if not isinstance(src, Window) or len(src.shape) != 2:
        raise TileFault(f"cp.async reads `{op.src}`, which is not one tile of a global tensor")
    if src.shape != blk.shared_shape(dst):
        raise TileFault(f"copies a {src.shape} tile into {dst.buffer} {blk.shared_shape(dst)}")
    _pred_shape(pred, src.shape)
    if op.buffer and op.buffer != dst.buffer:
        raise TileFault(f"says it writes buffer {op.buffer} but writes {dst.buffer} (sync decisions read `buffer`)")
    _check_gather(blk, op, src)
    value = read_window(src, blk.integer(op.row_limit), blk.integer(op.col_limit), blk.integer(op.row_first))
    blk.smem.write(dst.key(), dst.transposed, value, "async")


def _check_gather(blk: Block, op, tile: Window) -> None:
    """A copy reads or writes a gathered tensor's tile exactly when it says `gather`, from that tile's first row."""
    if tile.view.gathered != bool(op.gather):
        raise TileFault(f"copies {tile.view.name}, whose rows are gathered through a row map, as an affine tile"
                        if tile.view.gathered else f"gathers through {op.gather}, but copies {tile.view.name}, an "
                        "affine tensor")
    if op.gather and (blk.value(op.gather) is not tile.view or blk.integer(op.gather_row0) != tile.start[0]):
        raise TileFault(f"gathers the rows of {op.gather} from row {blk.integer(op.gather_row0)}, but its tile is "
                        f"{tile.view.name}'s from row {tile.start[0]}")


@handles(K.CopyOp)
def _copy(blk: Block, op: K.CopyOp) -> None:
    if op.kblock is not None:
        _load_kblock(blk, op)
        return
    src, dst = blk.resolve(op.src), blk.resolve(op.dst)
    pred = blk.resolve(op.pred) if op.pred is not None else None
    _copy_slices(blk, op.copy, src=src, dst=dst, pred=pred)
    if isinstance(src, Frag) and src.data.dim() == 2:
        value = src.data
    elif isinstance(src, SharedRef):
        if src.buffer not in op.reads:
            raise TileFault(f"reads shared {src.buffer} but lists reads={op.reads} (sync decisions read them)")
        value = blk.read_shared(src)
    else:
        raise TileFault(f"copies from `{op.src}`, a {type(src).__name__}; expected registers or shared memory")
    rows, cols = blk.integer(op.row_limit), blk.integer(op.col_limit)
    if isinstance(dst, Window):
        _pred_shape(pred, dst.shape)
        _check_gather(blk, op, dst)
        write_window(dst, value, rows, cols, blk.cta, blk.integer(op.row_first))
        return
    if not isinstance(dst, SharedRef):
        raise TileFault(f"copies into `{op.dst}`, a {type(dst).__name__}; expected shared or global memory")
    if dst.buffer not in op.writes:
        raise TileFault(f"writes shared {dst.buffer} but lists writes={op.writes} (sync decisions read them)")
    _pred_shape(pred, tuple(value.shape))
    keep = None
    first = blk.integer(op.row_first)
    if rows is not None or cols is not None or first is not None:
        r = torch.arange(value.shape[0])[:, None] < (value.shape[0] if rows is None else rows)
        if first is not None:
            r &= torch.arange(value.shape[0])[:, None] >= first
        c = torch.arange(value.shape[1])[None, :] < (value.shape[1] if cols is None else cols)
        keep = r & c
    blk.smem.write(dst.key(), dst.transposed, value, "reg", keep)


@handles(K.CommitOp)
def _commit(blk: Block, op: K.CommitOp) -> None:
    blk.smem.commit()


@handles(K.WaitOp)
def _wait(blk: Block, op: K.WaitOp) -> None:
    blk.smem.wait(op.pending)


@handles(K.BarrierOp)
def _barrier(blk: Block, op: K.BarrierOp) -> None:
    blk.smem.barrier()


# ----------------------------------------------------------------------------- GEMM
K_BLOCK = 16  # the k extent of an m16n8k16 MMA: one k-block of an operand fragment


def _kblock(blk: Block, e, k: int, what: str) -> int:
    kb = blk.integer(e)
    if kb is None or not 0 <= kb < k // K_BLOCK:
        raise TileFault(f"{what}: k-block {kb} of a {k}-wide operand (k-blocks 0..{k // K_BLOCK - 1})")
    return kb


def _load_kblock(blk: Block, op: K.CopyOp) -> None:
    """S2R: k-block `op.kblock` of a shared operand tile into its fragment's registers."""
    ref, frag = blk.resolve(op.src), blk.resolve(op.dst)
    atom = _copy_slices(blk, op.copy, src=ref, dst=frag)
    if not isinstance(ref, SharedRef) or not isinstance(frag, OperandFrag):
        raise TileFault(f"loads a k-block from `{op.src}` into `{op.dst}`: expected a shared tile and an operand "
                        "fragment's view")
    if atom.kind != frag.role:
        raise TileFault(f"loads operand {frag.role} with {op.copy}, a copy for operand {atom.kind}")
    if ref.transposed != atom.atom.endswith("_T"):
        raise TileFault(f"loads {'a transposed view' if ref.transposed else 'a row-major tile'} of {ref.buffer} "
                        f"with {atom.atom}; that needs ldmatrix{'.trans' if ref.transposed else ''}")
    if frag.src.buffer != ref.buffer or frag.src.transposed != ref.transposed:
        raise TileFault(f"operand fragment {frag.origin} is shaped for {frag.src.buffer} but loaded from "
                        f"{ref.buffer}{' (transposed)' if ref.transposed else ''}")
    if ref.buffer not in op.reads:
        raise TileFault(f"reads shared {ref.buffer} but lists reads={op.reads} (sync decisions read them)")
    tile = blk.read_shared(ref)
    kb = _kblock(blk, op.kblock, tile.shape[1], f"loads into {frag.origin}")
    frag.blocks[kb] = tile[:, kb * K_BLOCK:(kb + 1) * K_BLOCK].clone()


def _operand_block(blk: Block, name: str, role: str, op: K.MmaOp, kb_expr) -> torch.Tensor:
    """K-block kb of operand `role` as (rows, 16): loaded registers, or A retiled from an accumulator."""
    v = blk.value(name)
    if isinstance(v, OperandFrag):
        if v.role != role or v.mma != op.mma:
            raise TileFault(f"{v.origin} is an operand {v.role} fragment of {v.mma}, used as operand {role} of "
                            f"{op.mma}")
        kb = blk.integer(kb_expr)
        if kb not in v.blocks:
            raise TileFault(f"the MMA reads k-block {kb} of {v.origin} before any load fills it")
        return v.blocks[kb]
    if isinstance(v, Frag) and v.role == "A" and role == "A":
        kb = _kblock(blk, kb_expr, v.data.shape[1], f"reads {name}")
        return v.data[:, kb * K_BLOCK:(kb + 1) * K_BLOCK]
    raise TileFault(f"operand {role} {name} is neither loaded from shared memory nor an A operand retiled from "
                    "an accumulator")


@handles(K.MmaOp)
def _mma(blk: Block, op: K.MmaOp) -> None:
    if op.mma not in blk.mmas:
        raise TileFault(f"unknown TiledMMA {op.mma!r}")
    acc = blk.frag(op.acc, 2)
    a, b = _operand_block(blk, op.a, "A", op, op.kblock), _operand_block(blk, op.b, "B", op, op.kblock)
    if tuple(acc.data.shape) != (a.shape[0], b.shape[0]):
        raise TileFault(f"{op.acc} {tuple(acc.data.shape)} += A {tuple(a.shape)} · Bᵀ of {tuple(b.shape)}: shapes "
                        "do not match")
    acc.data += a @ b.T


# ----------------------------------------------------------------------------- fragment math
@handles(K.ClearOp)
def _clear(blk: Block, op: K.ClearOp) -> None:
    blk.frag(op.target).data.zero_()


@handles(K.MaskOp)
def _mask(blk: Block, op: K.MaskOp) -> None:
    x = blk.frag(op.target, 2)
    coord = blk.value(op.coord)
    if not isinstance(coord, Coords) or coord.shape != tuple(x.data.shape):
        raise TileFault(f"{op.coord} is not the coordinates of {op.target} {tuple(x.data.shape)}")
    if coord.slice not in {m.thread_slice for m in blk.mmas.values()}:
        raise TileFault(f"{op.coord} is not partitioned like an accumulator (partition_C of a TiledMMA slice)")
    rows = blk.integer(op.row0) + torch.arange(x.data.shape[0])[:, None]
    cols = blk.integer(op.col0) + torch.arange(x.data.shape[1])[None, :]
    sk = blk.integer(op.sk)
    masked = torch.zeros(x.data.shape, dtype=torch.bool)
    if op.bounds:
        masked |= cols >= sk
    if op.causal:
        diag = sk - blk.integer(op.sq) if op.alignment == "bottom_right" else 0
        masked |= cols > rows + diag
    if op.predicate is not None:   # q_idx, kv_idx per element; the kernel's scalars for the other names
        where = eval_tensor_expr(op.predicate, {"q_idx": rows, "kv_idx": cols}, blk.scalars)
        if where.dtype != torch.bool:
            raise TileFault(f"the predicate `{op.predicate}` is not a condition")
        masked |= where
    x.data.masked_fill_(masked, NEG_INF)


@handles(K.RowReduceOp)
def _row_reduce(blk: Block, op: K.RowReduceOp) -> None:
    src, dst = blk.frag(op.src, 2), blk.frag(op.dst, 1)
    if dst.data.shape[0] != src.data.shape[0]:
        raise TileFault(f"{op.dst} has {dst.data.shape[0]} rows, {op.src} {src.data.shape[0]}")
    red = src.data.amax(dim=1) if op.kind == "max" else src.data.sum(dim=1)
    if op.accumulate:
        red = torch.fmax(dst.data, red) if op.kind == "max" else dst.data + red
    dst.data.copy_(red)


@handles(K.AllReduceOp)
def _all_reduce(blk: Block, op: K.AllReduceOp) -> None:
    blk.frag(op.target, 1)   # a tile-level row reduction already covers every lane's columns


@handles(K.Exp2ScaleOp)
def _exp2_scale(blk: Block, op: K.Exp2ScaleOp) -> None:
    x, m = blk.frag(op.target, 2), blk.frag(op.row_max, 1)
    if m.data.shape[0] != x.data.shape[0]:
        raise TileFault(f"{op.row_max} has {m.data.shape[0]} rows, {op.target} {x.data.shape[0]}")
    s = float(blk.scalar(op.scale_log2))
    shift = torch.where(m.data == NEG_INF, torch.zeros_like(m.data), m.data * s)
    x.data.copy_(torch.exp2(x.data * s - shift[:, None]))


@handles(K.RowBroadcastOp)
def _row_broadcast(blk: Block, op: K.RowBroadcastOp) -> None:
    x, r = blk.frag(op.target, 2), blk.frag(op.vec, 1)
    if r.data.shape[0] != x.data.shape[0]:
        raise TileFault(f"{op.vec} has {r.data.shape[0]} rows, {op.target} {x.data.shape[0]}")
    out = eval_tensor_expr(op.fn, {"x": x.data, "r": r.data[:, None]}, blk.scalars)
    x.data.copy_(out.to(x.data.dtype).expand(x.data.shape))


@handles(K.TimestampOp, K.TraceBufferOp)
def _timestamp(blk: Block, op: K.Op) -> None:
    """A timeline's stamp: no values change."""


@handles(K.WarpAnyOp)
def _warp_any(blk: Block, op: K.WarpAnyOp) -> None:
    """No lanes here: the whole tile's rows vote (a superset of any warp's)."""
    vec = blk.frag(op.vec, 1)
    blk.scalars[op.name] = bool(eval_tensor_expr(op.fn, {"x": vec.data}, blk.scalars).bool().any())


@handles(K.MapOp)
def _map(blk: Block, op: K.MapOp) -> None:
    target = blk.frag(op.target)
    srcs = {f"x{i}": blk.frag(s).data for i, s in enumerate(op.srcs)}
    for name, t in zip(op.srcs, srcs.values()):
        if t.shape != target.data.shape:
            raise TileFault(f"source {name} {tuple(t.shape)} and target {op.target} {tuple(target.data.shape)} "
                            "differ in shape")
    out = eval_tensor_expr(op.fn, srcs, blk.scalars)
    target.data.copy_(out.to(target.data.dtype).expand(target.data.shape))


@handles(K.ConvertOp)
def _convert(blk: Block, op: K.ConvertOp) -> None:
    src = blk.frag(op.src, 2)
    blk.values[op.name] = Frag(round_to(src.data, op.dtype), op.dtype, src.role, op.name)


@handles(K.RetileAccToAOp)
def _retile_acc(blk: Block, op: K.RetileAccToAOp) -> None:
    src = blk.frag(op.src, 2)
    if src.dtype not in ("bf16", "fp16") or op.mma not in blk.mmas:
        raise TileFault(f"an A operand of {op.mma} is bf16/fp16 registers; {op.src} is {src.dtype}")
    blk.values[op.name] = Frag(src.data, src.dtype, "A", op.name)


def _not_gathered(window: Window, tile: str) -> None:
    """Per-element and row-vector copies address rows affinely: a tile of a gathered tensor is refused (only the
    copies that say `gather` shift each row to its storage row)."""
    if window.view.gathered:
        raise TileFault(f"{tile} is a tile of {window.view.name}, whose rows are gathered through a row map, but this "
                        "copy addresses them affinely (it has no gather)")


def _vector_window(blk: Block, vec: Frag, tile: str, coord_name: str, what: str) -> Window:
    """The global vector tile `tile` a row vector `vec` is stored to or loaded from, its rows checked against the
    coordinates `coord_name`."""
    window, coord = blk.value(tile), blk.value(coord_name)
    if isinstance(window, GlobalView) and window.data.dim() == 1:   # rows index the vector itself
        window = Window(window, (0,), (vec.data.shape[0],), rank=1)
    if not isinstance(window, Window) or len(window.shape) != 1:
        raise TileFault(f"{tile} is not a tile of a global vector")
    _not_gathered(window, tile)
    if not isinstance(coord, Coords) or coord.shape[0] != vec.data.shape[0] or window.shape[0] != vec.data.shape[0]:
        raise TileFault(f"{coord_name}, {what} and {tile} cover different rows")
    return window


def _element_window(blk: Block, frag: Frag, tile: str, coord_name: str, what: str) -> Window:
    """The 2-D global tile a per-element copy of `frag` reads or writes, checked against its coordinates."""
    window, coord = blk.value(tile), blk.value(coord_name)
    if not isinstance(window, Window) or len(window.shape) != 2:
        raise TileFault(f"{tile} is not a 2-D tile of a global tensor")
    _not_gathered(window, tile)
    if not isinstance(coord, Coords) or not tuple(coord.shape) == tuple(frag.data.shape) == tuple(window.shape):
        raise TileFault(f"{coord_name}, {what} and {tile} cover different tiles")
    return window


def _limits(blk: Block, op) -> tuple[int, int | None, int | None]:
    return (blk.integer(op.row_limit), blk.integer(op.col_limit) if op.col_limit is not None else None,
            blk.integer(op.row_first) if op.row_first is not None else None)


@handles(K.RowStoreOp)
def _row_store(blk: Block, op: K.RowStoreOp) -> None:
    vec = blk.frag(op.vec, 1)
    write_window(_vector_window(blk, vec, op.dst, op.coord, op.vec), vec.data, blk.integer(op.row_limit), None, blk.cta)


@handles(K.RowLoadOp)
def _row_load(blk: Block, op: K.RowLoadOp) -> None:
    vec = blk.frag(op.dst, 1)
    vec.data.copy_(read_window(_vector_window(blk, vec, op.src, op.coord, op.dst), blk.integer(op.row_limit), None))


@handles(K.FragStoreOp)
def _frag_store(blk: Block, op: K.FragStoreOp) -> None:
    src = blk.frag(op.src, 2)
    dst = _element_window(blk, src, op.dst, op.coord, op.src)
    if src.dtype != "fp32" or dst.view.dtype != "fp32":
        raise TileFault(f"{op.src} ({src.dtype}) is stored element by element into {dst.view.name} "
                        f"({dst.view.dtype}); both must be fp32")
    row_limit, col_limit, row_first = _limits(blk, op)
    write_window(dst, src.data, row_limit, col_limit, blk.cta, row_first, add=op.add)


@handles(K.FragLoadOp)
def _frag_load(blk: Block, op: K.FragLoadOp) -> None:
    dst = blk.frag(op.dst, 2)
    row_limit, col_limit, row_first = _limits(blk, op)
    dst.data.copy_(read_window(_element_window(blk, dst, op.src, op.coord, op.dst), row_limit, col_limit, row_first))


# ----------------------------------------------------------------------------- control flow
@handles(K.IfOp)
def _if(blk: Block, op: K.IfOp) -> None:
    if blk.scalar(op.cond):
        blk.run(op.body)


@handles(K.ForOp)
def _for(blk: Block, op: K.ForOp) -> None:
    var, stop = blk.integer(op.start), blk.scalar(op.stop)
    trips = 0
    while (var < stop) if op.step > 0 else (var > stop):
        trips += 1
        if trips > 1_000_000:
            raise TileFault(f"loop {op.var} runs more than a million trips")
        blk.scalars[op.var] = var
        try:
            blk.run(op.body)
        except _Break:
            break
        var += op.step


@handles(K.CounterOp)
def _counter(blk: Block, op: K.CounterOp) -> None:
    blk.scalars[op.name] = blk.integer(op.init)


@handles(K.CounterAddOp)
def _counter_add(blk: Block, op: K.CounterAddOp) -> None:
    blk.scalars[op.counter] = blk.integer(Var(op.counter)) + blk.integer(op.value)


@handles(K.CounterSetOp)
def _counter_set(blk: Block, op: K.CounterSetOp) -> None:
    blk.scalars[op.counter] = blk.integer(op.value)


class _Break(Exception):
    """Unwinds to the innermost `ForOp` (`BreakOp`)."""


@handles(K.BreakOp)
def _break(blk: Block, op: K.BreakOp) -> None:
    raise _Break
