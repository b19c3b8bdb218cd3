"""Copy rules of `lower-tile-ops`: global→shared cp.async tiles, shared→register hints, and the
register→global epilogue (convert, stage in shared memory, 16-byte stores of in-range rows).

A mixin of `TileOpLowering` (tlc.lowering.tile_ops): the methods share its slots, names and memo.
"""
from __future__ import annotations

from tlc.diagnostics import Loc, fail
from tlc.frontend import ast as A
from tlc.ir.graph import Graph
from tlc.ir.ops import CopyOp, GemmOp, LoopOp
from tlc.kir import ops as K
from tlc.kir.expr import BinOp, Call, Const, Expr, Index, Var
from tlc.lowering.storage import Buffer, Slot

CP_ASYNC = "SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>"
ALL = Var("_")


def padded(cols: int, unit: int = 32) -> int:
    """Columns a tile occupies in the kernel: a multiple of 32 (FlashAttention pads head dims the
    same way), so copies move 16-byte chunks and mma.sync's k16/n16 steps tile it; on sm_90a a
    multiple of 64, the 128-byte swizzle atom GMMA and TMA read (96 → 128, 160 → 192); the padding is
    zero-filled on load and never stored."""
    return cols if cols % unit == 0 else -(-cols // unit) * unit


def kblock(cols: int) -> int:
    """Row atom of a shared tile: 64 elements (128 bytes) where the width allows."""
    for kb in (64, 32, 16, 8):
        if cols % kb == 0:
            return kb
    return 0


class CopyRules:
    def _CopyOp(self, op: CopyOp, region: Graph, out: list[K.Op]) -> None:
        route = (op.src_space, op.dst_space)
        if route == ("global", "shared"):
            return self._load(op, out)
        if route == ("shared", "register"):
            src = self.slot(op.operands[0], op)
            if src.kind != "smem":
                raise fail("tlc build: a copy from shared to register reads a shared tile", op.loc)
            users = [u for _, u in self.g.walk() if not isinstance(u, LoopOp)
                     and any(x is op.result for x in u.operands)]
            for user in users:
                if not isinstance(user, GemmOp):
                    raise fail(f"tlc build: '{op.result.base}' is copied to registers for a {user.mnemonic}; the "
                               "lowering loads shared tiles into registers only as GEMM operands (ldmatrix)", user.loc)
            self._bind(op.result, Slot("smem", src.name, src.rows, src.cols, region=self.region, buffer=src.buffer,
                                       uid=src.uid))
            return
        if route == ("register", "global"):
            return self._store(op, out)
        raise fail(f"tlc build: a copy from {op.src_space} to {op.dst_space} has no lowering (supported: "
                   "global→shared, shared→register for a GEMM operand, register→global)", op.loc)

    def _coords(self, op: CopyOp, rows_tile: int, cols_tile: int, cols: int) -> tuple[Expr, Expr]:
        coord = dict(op.coord)
        unknown = sorted(set(coord) - {"L", "C"})
        if unknown:
            raise fail(f"tlc build: coordinate '{unknown[0]}' is not a tile axis (L: rows, C: columns)", op.loc)
        r = self.x.lower(coord.get("L", A.Num(0)), op.loc)
        c = self.x.lower(coord.get("C", A.Num(0)), op.loc)
        if cols % cols_tile:
            raise fail(f"tlc build: the tile's {cols_tile} columns do not divide the tensor's {cols}; a partial "
                       "column tile is not supported", op.loc)
        return r, c

    def _copy_atom(self, cols: int, dtype: str, atom: str, rows: int, loc: Loc) -> tuple[str, str]:
        """A thread-cooperative copy of 16-byte chunks for tiles `cols` wide (memoised)."""
        key = ("gmem_copy", cols, dtype, atom)
        if key not in self.memo:
            tpr = kblock(cols) // 8
            threads = 32 * self.warps
            name = self.names.fresh(f"gmem_copy_{cols}" if "ASYNC" in atom else f"store_copy_{cols}")
            self.decls.append(K.TiledCopyOp(name=name, atom=atom, dtype=dtype, kind="threads",
                                            thread_slice=f"{name}_thr", thread_layout=(threads // tpr, tpr),
                                            value_layout=(1, 8)))
            self.memo[key] = name
        name = self.memo[key]
        per_pass = 32 * self.warps // (kblock(cols) // 8)
        if rows % per_pass:
            why = (f"tlc build: a {rows}-row tile cannot be copied by {32 * self.warps} threads moving "
                   f"{per_pass} rows per pass; make the tile rows a multiple of {per_pass}")
            if not self.hopper:
                raise fail(why, loc)
            self.partial_copies.append((name, why, loc))   # TMA boxes (warp-specialize) take any rows
        return name, f"{name}_thr"

    def _partition(self, key: tuple, base: str, slice_: str, method: str, src: Expr) -> str:
        if key not in self.memo:
            name = self.names.fresh(base)
            self.decls.append(K.PartitionOp(name=name, slice=slice_, method=method, src=src))
            self.memo[key] = name
        return self.memo[key]

    def _global_tile(self, g: Slot, rows: int, cols: int, shift: Expr | None = None) -> str:
        key = ("gtile", g.name, rows, cols, str(shift))
        if key not in self.memo:
            name = self.names.fresh("g" + g.name[1:] + ("_end" if shift is not None else ""))
            self.decls.append(K.GlobalTileOp(name=name, src=g.name, tile=(rows, cols), coord=(ALL, ALL),
                                             row_shift=shift))
            self.memo[key] = name
        return self.memo[key]

    def _row_tiles(self, op: CopyOp, g: Slot, tr: int, r: Expr) -> tuple[Expr, Expr | None, Expr, Expr | None]:
        """(tile index, row shift, row limit, first row) of the copy's row tile `r`, in the tile's own rows.
        Counted from the end (`[L = block_idx from end]`), tile r is tile T − 1 − r of a tiling that starts
        T·tr − rows rows before the tensor (T = cdiv(rows, tr)): its rows before (r + 1)·tr − rows are absent."""
        rows = self.global_rows[g.name]
        if not op.from_end:
            return r, None, BinOp("-", rows, BinOp("*", r, Const(tr))), None
        tiles = Call("ceil_div", (rows, Const(tr)))
        index = BinOp("-", BinOp("-", tiles, Const(1)), r)
        shift = BinOp("-", BinOp("*", tiles, Const(tr)), rows)
        first = BinOp("-", BinOp("*", BinOp("+", r, Const(1)), Const(tr)), rows)
        return index, shift, Const(tr), first

    def _identity(self, rows: int, cols: int) -> str:
        key = ("ident", rows, cols)
        if key not in self.memo:
            name = self.names.fresh(f"c{rows}x{cols}")
            self.decls.append(K.IdentityTileOp(name=name, shape=(rows, cols)))
            self.memo[key] = name
        return self.memo[key]

    def _copy_tile(self, op: CopyOp, g: Slot, want: tuple[int, int], what: str):
        """(rows, padded cols, cols, row coord, col coord) of a copy's tile, which must match `want`."""
        tr, logical = self._shape2(op.tile or (), op.loc, "the copied tile")
        if (tr, logical) != want:
            raise fail(f"tlc build: the copied tile is {tr}×{logical} but {what} is {want[0]}×{want[1]}", op.loc)
        r, c = self._coords(op, tr, logical, g.logical_cols)
        tc = padded(logical, self.col_unit)
        if tc != logical and logical != g.logical_cols:
            raise fail(f"tlc build ({self.arch.name}): the tile's {logical} columns are padded to {tc} in the kernel "
                       f"({self.col_unit}-element rows), which reads past the tile only where that is past the "
                       f"tensor's end, but '{op.operands[0].base}' has {g.logical_cols} columns; copy tiles as wide "
                       f"as the tensor, or {self.col_unit} columns (or a multiple) wide", op.loc)
        return tr, tc, logical, r, c

    def _load(self, op: CopyOp, out: list[K.Op]) -> None:
        g = self.slot(op.operands[0], op)
        if g.kind != "global":
            raise fail("tlc build: a copy from global reads a global tensor", op.loc)
        buf = self.buffers.get(op.result.base)
        if buf is None:
            raise fail(f"tlc build: no `Allocate {op.result.base} in shared` for this copy to write", op.loc)
        tr, tc, logical, r, c = self._copy_tile(op, g, (buf.rows, buf.logical_cols), f"shared '{buf.tl_name}'")
        copy, thr = self._copy_atom(tc, buf.dtype, CP_ASYNC, tr, op.loc)
        r, shift, limit, first = self._row_tiles(op, g, tr, r)
        gt = self._global_tile(g, tr, tc, shift)
        src = self._partition(("S", gt, copy), f"t{buf.tl_name}{gt}", thr, "partition_S", Var(gt))
        dst = self._partition(("D", buf.name, copy), f"t{buf.tl_name}{buf.name}", thr, "partition_D", Var(buf.name))
        ident = self._identity(tr, tc)
        pred = self._partition(("S", ident, copy), f"t{buf.tl_name}{ident}", thr, "partition_S", Var(ident))
        tile = Index(Var(src), (ALL, ALL, ALL, r, c))
        full, part = self.names.fresh(f"tok_{buf.tl_name}"), self.names.fresh(f"tok_{buf.tl_name}_edge")
        if tc != logical:  # padded columns: every load checks them (zero-filled past `logical`)
            out += [K.AsyncCopyOp(token=part, copy=copy, src=tile, dst=Var(dst), pred=Var(pred), row_limit=limit,
                                  col_limit=Const(logical), row_first=first, buffer=buf.name, loc=op.loc),
                    K.CommitOp(name=self.names.fresh(f"grp_{buf.tl_name}"), tokens=(part,), loc=op.loc)]
        else:
            whole = BinOp("<=", first, Const(0)) if first is not None else BinOp(">=", limit, Const(tr))
            edge = BinOp(">", first, Const(0)) if first is not None else BinOp("<", limit, Const(tr))
            out += [K.IfOp(cond=whole, loc=op.loc, body=(
                    K.AsyncCopyOp(token=full, copy=copy, src=tile, dst=Var(dst), buffer=buf.name, loc=op.loc),)),
                K.IfOp(cond=edge, loc=op.loc, body=(
                    K.AsyncCopyOp(token=part, copy=copy, src=tile, dst=Var(dst), pred=Var(pred), row_limit=limit,
                                  row_first=first, buffer=buf.name, loc=op.loc),)),
                    K.CommitOp(name=self.names.fresh(f"grp_{buf.tl_name}"), tokens=(full, part), loc=op.loc)]
        buf.last_write = op.result.uid
        for _, written in self.loops:
            written.add(buf.name)
        self._bind(op.result, Slot("smem", buf.name, tr, tc, region=self.region, buffer=buf, uid=op.result.uid,
                                   logical_cols=logical))

    def _store(self, op: CopyOp, out: list[K.Op]) -> None:
        src = self.slot(op.operands[0], op)
        g = self.slot(op.operands[1], op)
        if g.kind != "global":
            raise fail("tlc build: a copy to global writes a global tensor", op.loc)
        if src.kind != "frag":
            raise fail(f"tlc build: '{op.operands[0].base}' is not an accumulator tile; the lowering stores "
                       "fp32 register tiles (GEMM results) to global", op.loc)
        tr, tc, logical, r, c = self._copy_tile(op, g, (src.rows, src.logical_cols), f"'{op.operands[0].base}'")
        t = next(t for t in self.abi.tensors if t.ptr == f"{op.operands[1].base}_ptr")
        stage = Buffer(f"{t.name}_out", self.names.fresh(f"s{t.name}_out"), tr, tc, t.dtype, op.loc, reuse=True)
        self.buffers[stage.tl_name] = stage
        rname = self.names.fresh(f"r{t.name}_out")
        if self.warp_plan.replicas > 1 and src.mma != "tiled_mma_n":
            raise fail(f"tlc build: '{op.operands[0].base}' is computed by every warp group alike (a block of "
                       f"{src.rows} rows on {self.warps} warps); storing it is not supported — store a GEMM "
                       "accumulator you allocated in registers, or use more rows per block", op.loc)
        r2s = self._memo_copy(("r2s", t.dtype, src.mma), "r2s_copy", "UniversalCopy<uint32_t>", t.dtype, "C", src.mma)
        s2g, thr = self._copy_atom(tc, t.dtype, "UniversalCopy<cute::uint128_t>", tr, op.loc)
        r, shift, limit, first = self._row_tiles(op, g, tr, r)
        gt = self._global_tile(g, tr, tc, shift)
        ident = self._identity(tr, tc)
        r_view = self.names.fresh(f"t{t.name}r{t.name}")
        s_dst = self._partition(("D", stage.name, r2s), f"t{t.name}s{t.name}", f"{r2s}_thr", "partition_D",
                                Var(stage.name))
        s_src = self._partition(("S", stage.name, s2g), f"t{t.name}s{t.name}_out", thr, "partition_S", Var(stage.name))
        g_dst = self._partition(("D", gt, s2g), f"t{t.name}{gt}", thr, "partition_D", Var(gt))
        pred = self._partition(("D", ident, s2g), f"t{t.name}{ident}", thr, "partition_D", Var(ident))
        out += [K.ConvertOp(name=rname, src=src.name, dtype=t.dtype, loc=op.loc),
                K.PartitionOp(name=r_view, slice=f"{r2s}_thr", method="retile_S", src=Var(rname), loc=op.loc),
                K.CopyOp(copy=r2s, src=Var(r_view), dst=Var(s_dst), writes=(stage.name,), loc=op.loc),
                K.CopyOp(copy=s2g, src=Var(s_src), dst=Index(Var(g_dst), (ALL, ALL, ALL, r, c)), pred=Var(pred),
                         row_limit=limit, col_limit=Const(logical) if tc != logical else None, row_first=first,
                         reads=(stage.name,), loc=op.loc)]
        self._bind(op.result, Slot("global", g.name, cols=g.cols, region=-1))

    def _memo_copy(self, key: tuple, base: str, atom: str, dtype: str, kind: str, mma: str = "tiled_mma") -> str:
        if key not in self.memo:
            name = self.names.fresh(base)
            self.decls.append(K.TiledCopyOp(name=name, atom=atom, dtype=dtype, kind=kind, mma=mma,
                                            thread_slice=f"{name}_thr"))
            self.memo[key] = name
        return self.memo[key]

