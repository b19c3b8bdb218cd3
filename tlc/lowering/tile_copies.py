"""Copy rules of `lower-tile-ops`, shared by every target family: global→shared cp.async tiles,
shared→register hints, and the register→global epilogue (convert, stage in shared memory, 16-byte
stores of in-range rows).

Each rule takes the lowering context (tlc.lowering.tile_ops.TileOpLowering), the op, its region and
the kernel-IR list it appends to; tlc.lowering.rules registers them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from tlc.diagnostics import Loc, fail
from tlc.frontend import ast as A
from tlc.ir.graph import Graph
from tlc.ir.ops import CopyOp, GemmOp, LoopOp
from tlc.kir import ops as K
from tlc.kir.expr import BinOp, Call, Const, Expr, Index, Var
from tlc.lowering.storage import Buffer, Slot

if TYPE_CHECKING:
    from tlc.lowering.tile_ops import TileOpLowering

CP_ASYNC = "SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>"
ALL = Var("_")


def padded(cols: int, unit: int = 32) -> int:
    """Columns a tile occupies in the kernel: a multiple of 32 (FlashAttention pads head dims the
    same way), so copies move 16-byte chunks and mma.sync's k16/n16 steps tile it; on sm_90a a
    multiple of 64, the 128-byte swizzle atom GMMA and TMA read (96 → 128, 160 → 192); the padding is
    zero-filled on load and never stored. `unit` is the family's `col_unit`."""
    return cols if cols % unit == 0 else -(-cols // unit) * unit


def kblock(cols: int) -> int:
    """Row atom of a shared tile: 64 elements (128 bytes) where the width allows."""
    for kb in (64, 32, 16, 8):
        if cols % kb == 0:
            return kb
    return 0


def lower_copy(cx: TileOpLowering, op: CopyOp, region: Graph, out: list[K.Op]) -> None:
    route = (op.src_space, op.dst_space)
    if route == ("global", "shared"):
        return _load(cx, op, out)
    if route == ("shared", "register"):
        src = cx.slot(op.operands[0], op)
        if src.kind != "smem":
            raise fail("tlc build: a copy from shared to register reads a shared tile", op.loc)
        users = [u for _, u in cx.g.walk() if not isinstance(u, LoopOp) and any(x is op.result for x in u.operands)]
        for user in users:
            if not isinstance(user, GemmOp):
                raise fail(f"tlc build: '{op.result.base}' is copied to registers for a {user.mnemonic}; the "
                           "lowering loads shared tiles into registers only as GEMM operands (ldmatrix)", user.loc)
        cx.bind(op.result, Slot("smem", src.name, src.rows, src.cols, region=cx.region, buffer=src.buffer,
                                uid=src.uid))
        return
    if route == ("register", "global"):
        return _store(cx, op, out)
    if route == ("global", "register"):
        return _load_registers(cx, op, out)
    raise fail(f"tlc build: a copy from {op.src_space} to {op.dst_space} has no lowering (supported: "
               "global→shared, shared→register for a GEMM operand, register→global, global→register in a "
               "kernel without GEMMs)", op.loc)


def _load_registers(cx: TileOpLowering, op: CopyOp, out: list[K.Op]) -> None:
    """A tile (or a row vector) loaded from global memory straight into fp32 registers, each lane its own
    elements, laid out like an accumulator of the warp plan's row TiledMMA (FragLoadOp, RowLoadOp): the
    register tiles of a kernel without GEMMs. Elements past the tensor's end read 0 (absent: the stores
    skip their rows). A kernel with GEMMs would have to lay such a tile out like each GEMM that meets it:
    not supported yet."""
    if any(isinstance(u, GemmOp) for _, u in cx.g.walk()):
        raise fail(f"tlc build: '{op.result.base}' is loaded from global memory into registers in a kernel with "
                   "GEMMs (an additive bias, a mask tensor); the lowering loads registers from global only in "
                   "kernels without GEMMs yet: copy it to shared memory as a GEMM operand", op.loc)
    g = view_here(cx, cx.slot(op.operands[0], op), op, out, direct=True)
    if g.kind != "global":
        raise fail("tlc build: a copy from global reads a global tensor", op.loc)
    if is_gathered(cx, g):
        raise fail(f"tlc build: '{op.operands[0].base}' is read through a row map, which the lowering gathers in "
                   "copies to shared memory only; copy it to shared", op.loc)
    tile = [cx.x.int_value(d, op.loc, "the copied tile") for d in (op.tile or ())]
    coord = dict(op.coord)
    if g.cols == 0:   # a global vector: a row vector of the block's rows
        if len(tile) != 1 or set(coord) - {"L"} or op.from_end:
            raise fail(f"tlc build: a global vector is loaded as a row vector, `Copy {op.result.base} (BM) in "
                       "coordinate [L = …] from global to register` (tiles counted from the start)", op.loc)
        rows = block_rows(cx, tile[0], op)
        r = cx.x.lower(coord.get("L", A.Num(0)), op.loc)
        mma, cols = cx.warp_plan.row_layout()
        ident = cx.identity(rows, cols)
        rc = cx.partition(("C", ident, mma), f"tR{ident}", cx.warp_plan.slice_of(mma), "partition_C", Var(ident))
        view = cx.names.fresh("g" + g.name[1:] + "_rows")
        dst = cx.bind(op.result, cx.fresh_like(Slot("row", "", rows), op.result.base, out, op.loc))
        out += [K.GlobalTileOp(name=view, src=g.name, tile=(rows,), coord=(r,), loc=op.loc),
                K.RowLoadOp(dst=dst.name, src=view, coord=rc,
                            row_limit=BinOp("-", cx.global_rows[g.name], BinOp("*", r, Const(rows))), loc=op.loc)]
        return
    if len(tile) != 2:
        raise fail(f"tlc build: a copy into registers takes a (rows, cols) tile, `Copy {op.result.base} (BM, cols) "
                   "in coordinate [L = …] from global to register`", op.loc)
    tr, tc, logical, r, c = _copy_tile(cx, op, g, (tile[0], tile[1]), "the tile")
    block_rows(cx, tr, op)
    mma = cx.warp_plan.mma_of_register(op.result.base)
    r, shift, limit, first = _row_tiles(cx, op, g, tr, r)
    ident = cx.identity(tr, tc)
    coord_view = cx.partition(("C", ident, mma), f"tC{ident}", cx.warp_plan.slice_of(mma), "partition_C", Var(ident))
    view = cx.names.fresh("g" + g.name[1:] + "_in")
    name = cx.names.fresh(f"r{op.result.base}")
    out += [cx.warp_plan.accumulator(name, mma, (tr, tc), op.loc),
            K.GlobalTileOp(name=view, src=g.name, tile=(tr, tc), coord=(r, c), row_shift=shift, loc=op.loc),
            K.FragLoadOp(dst=name, src=view, coord=coord_view, row_limit=limit,
                         col_limit=Const(logical) if tc != logical else None, row_first=first, loc=op.loc)]
    cx.bind(op.result, Slot("frag", name, tr, tc, region=cx.region, logical_cols=logical, mma=mma))


def block_rows(cx: TileOpLowering, rows: int, op) -> int:
    """`rows`, the block's rows (the first register tile fixes them, as a GEMM's M does), which the warp plan's
    accumulator layout must tile: 16 rows per warp."""
    if cx.m_rows is None:
        # 16 rows per warp of the row TiledMMA; a wgmma plan's rows are its GEMMs', checked by their rule
        step = 16 * getattr(cx.warp_plan, "warps_m", 1)
        if rows % step:
            raise fail(f"tlc build: a register tile of {rows} rows on {cx.warps} warps; each warp holds 16 rows "
                       f"of it, so the rows must be a multiple of {step} (set BM, or -D Warps)", op.loc)
        cx.m_rows = rows
    elif rows != cx.m_rows:
        raise fail(f"tlc build: a register tile of {rows} rows in a block of {cx.m_rows}; the block's tiles share "
                   "their rows", op.loc)
    return rows


def _coords(cx: TileOpLowering, op: CopyOp, rows_tile: int, cols_tile: int, cols: int) -> tuple[Expr, Expr]:
    coord = dict(op.coord)
    unknown = sorted(set(coord) - {"L", "C"})
    if unknown:
        raise fail(f"tlc build: coordinate '{unknown[0]}' is not a tile axis (L: rows, C: columns)", op.loc)
    r = cx.x.lower(coord.get("L", A.Num(0)), op.loc)
    c = cx.x.lower(coord.get("C", A.Num(0)), op.loc)
    if cols % cols_tile:
        raise fail(f"tlc build: the tile's {cols_tile} columns do not divide the tensor's {cols}; a partial "
                   "column tile is not supported", op.loc)
    return r, c


def _copy_atom(cx: TileOpLowering, cols: int, dtype: str, atom: str, rows: int, loc: Loc,
               gathered: bool = False) -> tuple[str, str]:
    """A thread-cooperative copy of 16-byte chunks for tiles `cols` wide (memoised). A tile whose rows
    are not whole passes is refused, unless the family's copies may become TMA boxes (which take any
    rows; a gathered tile never does): then the refusal waits for warp-specialize (`partial_copies`)."""
    tpr = kblock(cols) // 8
    threads = 32 * cx.warps
    name = cx.declare_once(("gmem_copy", cols, dtype, atom),
                           f"gmem_copy_{cols}" if "ASYNC" in atom else f"store_copy_{cols}",
                           lambda n: K.TiledCopyOp(name=n, atom=atom, dtype=dtype, kind="threads",
                                                   thread_slice=f"{n}_thr", thread_layout=(threads // tpr, tpr),
                                                   value_layout=(1, 8)))
    per_pass = 32 * cx.warps // (kblock(cols) // 8)
    if rows % per_pass:
        why = (f"tlc build: a {rows}-row tile cannot be copied by {32 * cx.warps} threads moving "
               f"{per_pass} rows per pass; make the tile rows a multiple of {per_pass}")
        if not cx.family.tma_copies or gathered:
            raise fail(why, loc)
        cx.partial_copies.append((name, why, loc))
    return name, f"{name}_thr"


def _global_tile(cx: TileOpLowering, g: Slot, rows: int, cols: int, shift: Expr | None = None) -> str:
    base = "g" + g.name[1:] + ("_end" if shift is not None else "")
    return cx.declare_once(("gtile", g.name, rows, cols, str(shift)), base,
                           lambda n: K.GlobalTileOp(name=n, src=g.name, tile=(rows, cols), coord=(ALL, ALL),
                                                    row_shift=shift))


def _row_tiles(cx: TileOpLowering, op: CopyOp, g: Slot, tr: int,
               r: Expr) -> tuple[Expr, Expr | None, Expr, Expr | None]:
    """(tile index, row shift, row limit, first row) of the copy's row tile `r`, in the tile's own rows.
    Counted from the end (`[L = block_idx from end]`), tile r is tile T − 1 − r of a tiling that starts
    T·tr − rows rows before the tensor (T = cdiv(rows, tr)): its rows before (r + 1)·tr − rows are absent."""
    rows = cx.global_rows[g.name]
    if not op.from_end:
        return r, None, BinOp("-", rows, BinOp("*", r, Const(tr))), None
    tiles = Call("ceil_div", (rows, Const(tr)))
    index = BinOp("-", BinOp("-", tiles, Const(1)), r)
    shift = BinOp("-", BinOp("*", tiles, Const(tr)), rows)
    first = BinOp("-", BinOp("*", BinOp("+", r, Const(1)), Const(tr)), rows)
    return index, shift, Const(tr), first


def _copy_tile(cx: TileOpLowering, op: CopyOp, g: Slot, want: tuple[int, int], what: str):
    """(rows, padded cols, cols, row coord, col coord) of a copy's tile, which must match `want`."""
    tr, logical = cx.tile_shape(op.tile or (), op.loc, "the copied tile")
    if (tr, logical) != want:
        raise fail(f"tlc build: the copied tile is {tr}×{logical} but {what} is {want[0]}×{want[1]}", op.loc)
    r, c = _coords(cx, op, tr, logical, g.logical_cols)
    unit = cx.family.col_unit
    tc = padded(logical, unit)
    if tc != logical and logical != g.logical_cols:
        raise fail(f"tlc build ({cx.arch.name}): the tile's {logical} columns are padded to {tc} in the kernel "
                   f"({unit}-element rows), which reads past the tile only where that is past the "
                   f"tensor's end, but '{op.operands[0].base}' has {g.logical_cols} columns; copy tiles as wide "
                   f"as the tensor, or {unit} columns (or a multiple) wide", op.loc)
    return tr, tc, logical, r, c


def view_here(cx: TileOpLowering, g: Slot, op: CopyOp, out: list[K.Op], direct: bool) -> Slot:
    """`g`, or — for a tensor whose head offset reads a loop's variable — its view at this copy, the offset
    evaluated here (`direct`: a copy straight between registers and global memory; the staged and cp.async
    copies declare their partitions once per kernel, before any loop, so they take no such view yet)."""
    if g.kind != "global" or g.deferred is None:
        return g
    if not direct:
        raise fail(f"tlc build: '{op.operands[0].base if op.src_space == 'global' else op.operands[1].base}' is at "
                   f"head `{g.deferred.offset}`, which reads a loop's variable; such a tensor is copied straight "
                   "between registers and global memory (an fp32 tile or vector) only", op.loc)
    from tlc.lowering.tile_alloc import global_tensor
    view = global_tensor(cx, g.deferred, cx.names.fresh(g.name))
    out.append(view)
    return Slot("global", view.name, cols=g.cols, region=-1, logical_cols=g.logical_cols)


def is_gathered(cx: TileOpLowering, g: Slot) -> bool:
    """Global tensor `g` is read through a row map: its GlobalTensorOp, declared once or made at a copy (a head
    offset reading a loop's variable), has `rows_at`; a deferred slot whose Allocate has one is too."""
    return g.name in cx.gathered or (g.deferred is not None and g.deferred.rows_at is not None)


def _load(cx: TileOpLowering, op: CopyOp, out: list[K.Op]) -> None:
    g = view_here(cx, cx.slot(op.operands[0], op), op, out, direct=False)
    if g.kind != "global":
        raise fail("tlc build: a copy from global reads a global tensor", op.loc)
    buf = cx.buffers.get(op.result.base)
    if buf is None:
        raise fail(f"tlc build: no `Allocate {op.result.base} in shared` for this copy to write", op.loc)
    tr, tc, logical, r, c = _copy_tile(cx, op, g, (buf.rows, buf.logical_cols), f"shared '{buf.tl_name}'")
    gathered = is_gathered(cx, g)
    if gathered and op.from_end:
        raise fail(f"tlc build: '{op.operands[0].base}' is read through a row map; its tiles are counted from the "
                   "start (not 'from end')", op.loc)
    copy, thr = _copy_atom(cx, tc, buf.dtype, CP_ASYNC, tr, op.loc, gathered)
    r, shift, limit, first = _row_tiles(cx, op, g, tr, r)
    gt = _global_tile(cx, g, tr, tc, shift)
    src = cx.partition(("S", gt, copy), f"t{buf.tl_name}{gt}", thr, "partition_S", Var(gt))
    dst = cx.partition(("D", buf.name, copy), f"t{buf.tl_name}{buf.name}", thr, "partition_D", Var(buf.name))
    ident = cx.identity(tr, tc)
    pred = cx.partition(("S", ident, copy), f"t{buf.tl_name}{ident}", thr, "partition_S", Var(ident))
    tile = Index(Var(src), (ALL, ALL, ALL, r, c))
    full, part = cx.names.fresh(f"tok_{buf.tl_name}"), cx.names.fresh(f"tok_{buf.tl_name}_edge")
    if gathered:   # each row from its storage row: every load reads its rows' coordinates
        out += [K.AsyncCopyOp(token=part, copy=copy, src=tile, dst=Var(dst), pred=Var(pred), row_limit=limit,
                              col_limit=Const(logical) if tc != logical else None, buffer=buf.name,
                              gather=g.name, gather_row0=BinOp("*", r, Const(tr)), loc=op.loc),
                K.CommitOp(name=cx.names.fresh(f"grp_{buf.tl_name}"), tokens=(part,), loc=op.loc)]
    elif tc != logical:  # padded columns: every load checks them (zero-filled past `logical`)
        out += [K.AsyncCopyOp(token=part, copy=copy, src=tile, dst=Var(dst), pred=Var(pred), row_limit=limit,
                              col_limit=Const(logical), row_first=first, buffer=buf.name, loc=op.loc),
                K.CommitOp(name=cx.names.fresh(f"grp_{buf.tl_name}"), tokens=(part,), loc=op.loc)]
    else:
        whole = BinOp("<=", first, Const(0)) if first is not None else BinOp(">=", limit, Const(tr))
        edge = BinOp(">", first, Const(0)) if first is not None else BinOp("<", limit, Const(tr))
        out += [K.IfOp(cond=whole, loc=op.loc, body=(
                K.AsyncCopyOp(token=full, copy=copy, src=tile, dst=Var(dst), buffer=buf.name, loc=op.loc),)),
            K.IfOp(cond=edge, loc=op.loc, body=(
                K.AsyncCopyOp(token=part, copy=copy, src=tile, dst=Var(dst), pred=Var(pred), row_limit=limit,
                              row_first=first, buffer=buf.name, loc=op.loc),)),
                K.CommitOp(name=cx.names.fresh(f"grp_{buf.tl_name}"), tokens=(full, part), loc=op.loc)]
    buf.last_write = op.result.uid
    for _, written in cx.loops:
        written.add(buf.name)
    cx.bind(op.result, Slot("smem", buf.name, tr, tc, region=cx.region, buffer=buf, uid=op.result.uid,
                            logical_cols=logical))


def _store_rows(cx: TileOpLowering, op: CopyOp, src: Slot, g: Slot, out: list[K.Op]) -> None:
    """A row vector (the block's rows: a softmax statistic, a log-sum-exp) into a global vector: the lanes that
    hold column 0 of the row layout write their rows, those past the vector's end skipped (RowStoreOp)."""
    if g.cols:
        raise fail(f"tlc build: '{op.operands[0].base}' is a row vector; store it into a global vector "
                   f"(`Allocate {op.operands[1].base} in global (rows) as fp32`), not a (rows, cols) tensor", op.loc)
    tile = [cx.x.int_value(d, op.loc, "the copied tile") for d in (op.tile or ())]
    if tile != [src.rows]:
        raise fail(f"tlc build: the copied tile is {tuple(tile)} but row vector '{op.operands[0].base}' has "
                   f"{src.rows} rows; copy ({src.rows}) at [L = …]", op.loc)
    coord = dict(op.coord)
    if set(coord) - {"L"} or op.from_end:
        raise fail("tlc build: a row vector is stored at [L = …] (tiles counted from the start); other "
                   "coordinates are not supported yet", op.loc)
    if cx.warp_plan.replicas > 1:
        raise fail(f"tlc build: row vector '{op.operands[0].base}' is computed by every warp group alike (a block "
                   f"of {src.rows} rows on {cx.warps} warps); storing it is not supported — use more rows per "
                   "block or fewer warps", op.loc)
    r = cx.x.lower(coord.get("L", A.Num(0)), op.loc)
    mma, cols = cx.warp_plan.row_layout()
    ident = cx.identity(src.rows, cols)
    rc = cx.partition(("C", ident, mma), f"tR{ident}", cx.warp_plan.slice_of(mma), "partition_C", Var(ident))
    tile_view = cx.names.fresh("g" + g.name[1:] + "_rows")
    out += [K.GlobalTileOp(name=tile_view, src=g.name, tile=(src.rows,), coord=(r,), loc=op.loc),
            K.RowStoreOp(dst=tile_view, vec=src.name, coord=rc,
                         row_limit=BinOp("-", cx.global_rows[g.name], BinOp("*", r, Const(src.rows))), loc=op.loc)]
    cx.bind(op.result, Slot("global", g.name, cols=0, region=-1, logical_cols=0))


def _store(cx: TileOpLowering, op: CopyOp, out: list[K.Op]) -> None:
    src = cx.slot(op.operands[0], op)
    g = cx.slot(op.operands[1], op)
    if g.kind != "global":
        raise fail("tlc build: a copy to global writes a global tensor", op.loc)
    t = next(t for t in cx.abi.tensors if t.ptr == f"{op.operands[1].base}_ptr")
    g = view_here(cx, g, op, out, direct=src.kind == "row" or t.dtype == "fp32" or op.add)
    if src.kind == "row":
        return _store_rows(cx, op, src, g, out)
    if src.kind != "frag":
        raise fail(f"tlc build: '{op.operands[0].base}' is not an accumulator tile; the lowering stores "
                   "fp32 register tiles (GEMM results) to global", op.loc)
    tr, tc, logical, r, c = _copy_tile(cx, op, g, (src.rows, src.logical_cols), f"'{op.operands[0].base}'")
    t = next(t for t in cx.abi.tensors if t.ptr == f"{op.operands[1].base}_ptr")
    gathered = is_gathered(cx, g)
    if gathered and (t.dtype == "fp32" or op.add or op.from_end):
        raise fail(f"tlc build: '{t.name}' is stored through a row map, which the lowering scatters from the staged "
                   "bf16/fp16 store only (an fp32 or added tile, or tiles counted from the end, not yet)", op.loc)
    if t.dtype == "fp32" or op.add:
        return _store_elements(cx, op, src, g, (tr, tc, logical, r, c), out)
    stage = Buffer(f"{t.name}_out", cx.names.fresh(f"s{t.name}_out"), tr, tc, t.dtype, op.loc, reuse=True)
    cx.buffers[stage.tl_name] = stage
    rname = cx.names.fresh(f"r{t.name}_out")
    if cx.warp_plan.replicas > 1 and src.mma != "tiled_mma_n":
        raise fail(f"tlc build: '{op.operands[0].base}' is computed by every warp group alike (a block of "
                   f"{src.rows} rows on {cx.warps} warps); storing it is not supported — store a GEMM "
                   "accumulator you allocated in registers, or use more rows per block", op.loc)
    r2s = mma_copy(cx, ("r2s", t.dtype, src.mma), "r2s_copy", "UniversalCopy<uint32_t>", t.dtype, "C", src.mma)
    s2g, thr = _copy_atom(cx, tc, t.dtype, "UniversalCopy<cute::uint128_t>", tr, op.loc)
    r, shift, limit, first = _row_tiles(cx, op, g, tr, r)
    gt = _global_tile(cx, g, tr, tc, shift)
    ident = cx.identity(tr, tc)
    r_view = cx.names.fresh(f"t{t.name}r{t.name}")
    s_dst = cx.partition(("D", stage.name, r2s), f"t{t.name}s{t.name}", f"{r2s}_thr", "partition_D", Var(stage.name))
    s_src = cx.partition(("S", stage.name, s2g), f"t{t.name}s{t.name}_out", thr, "partition_S", Var(stage.name))
    g_dst = cx.partition(("D", gt, s2g), f"t{t.name}{gt}", thr, "partition_D", Var(gt))
    pred = cx.partition(("D", ident, s2g), f"t{t.name}{ident}", thr, "partition_D", Var(ident))
    out += [K.ConvertOp(name=rname, src=src.name, dtype=t.dtype, loc=op.loc),
            K.PartitionOp(name=r_view, slice=f"{r2s}_thr", method="retile_S", src=Var(rname), loc=op.loc),
            K.CopyOp(copy=r2s, src=Var(r_view), dst=Var(s_dst), writes=(stage.name,), loc=op.loc),
            K.CopyOp(copy=s2g, src=Var(s_src), dst=Index(Var(g_dst), (ALL, ALL, ALL, r, c)), pred=Var(pred),
                     row_limit=limit, col_limit=Const(logical) if tc != logical else None, row_first=first,
                     reads=(stage.name,), gather=g.name if gathered else "",
                     gather_row0=BinOp("*", r, Const(tr)) if gathered else None, loc=op.loc)]
    cx.bind(op.result, Slot("global", g.name, cols=g.cols, region=-1))


def _store_elements(cx: TileOpLowering, op: CopyOp, src: Slot, g: Slot, tile: tuple, out: list[K.Op]) -> None:
    """An fp32 register tile into an fp32 tensor, each lane its own elements at their C-coordinates, in-range
    ones only (FragStoreOp): no conversion and no staging; `and add` adds them atomically (a reduce-store)."""
    tr, tc, logical, r, c = tile
    if cx.warp_plan.replicas > 1 and src.mma != "tiled_mma_n":
        raise fail(f"tlc build: '{op.operands[0].base}' is computed by every warp group alike (a block of "
                   f"{src.rows} rows on {cx.warps} warps); storing it is not supported — store a GEMM "
                   "accumulator you allocated in registers, or use more rows per block", op.loc)
    r, shift, limit, first = _row_tiles(cx, op, g, tr, r)
    ident = cx.identity(tr, tc)
    coord = cx.partition(("C", ident, src.mma), f"tC{ident}", cx.warp_plan.slice_of(src.mma), "partition_C",
                         Var(ident))
    view = cx.names.fresh("g" + g.name[1:] + ("_add" if op.add else "_tile"))
    out += [K.GlobalTileOp(name=view, src=g.name, tile=(tr, tc), coord=(r, c), row_shift=shift, loc=op.loc),
            K.FragStoreOp(dst=view, src=src.name, coord=coord, row_limit=limit,
                          col_limit=Const(logical) if tc != logical else None, row_first=first, add=op.add,
                          loc=op.loc)]
    cx.bind(op.result, Slot("global", g.name, cols=g.cols, region=-1))


def mma_copy(cx: TileOpLowering, key: tuple, base: str, atom: str, dtype: str, kind: str,
             mma: str = "tiled_mma") -> str:
    """A tiled copy laid out like operand `kind` of TiledMMA `mma` (memoised under `key`)."""
    return cx.declare_once(key, base, lambda n: K.TiledCopyOp(name=n, atom=atom, dtype=dtype, kind=kind, mma=mma,
                                                              thread_slice=f"{n}_thr"))
