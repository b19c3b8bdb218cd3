"""`lower-tile-ops`: the TL graph → kernel IR. Each TL op lowers by the rule the rule table
(tlc.lowering.rules) registers for its class and the target's family (mma.sync for the sm_80
family, wgmma for sm_90a), in program order, into the region it sits in:

    Allocate … in global    → a global tensor view (pointer + the program's head offset)   tile_alloc
    Allocate … in shared    → a shared buffer           Allocate … in register → a cleared fragment
    Copy global → shared    → cp.async of the tile at the program's coordinate (zero-fill past the end)
    Copy shared → register  → the GEMM operand's ldmatrix source (a hint, LANGUAGE.md §5)    tile_copies
    Copy register → global  → convert, stage in shared memory, 16-byte stores of in-range rows
    GEMM                    → mma.sync (tile_gemm) or wgmma (tile_wgmma) over the operands named
    elementwise, mask, row reductions, scaled exp2, Reshape → fragment ops (tile_math); loops → ForOp

This module is the context the rules share: the values' storage, the memoised declarations, the
driver and the kernel's shared-memory layout. Nothing else is generated: no barrier or wait
(`insert-sync`), no second stage (`pipeline`), no swizzle (`infer-layouts`). An op whose class has
no rule for the target is refused at its line.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tlc.arch import ArchInfo
from tlc.diagnostics import Loc, fail
from tlc.ir.graph import Graph
from tlc.ir.ops import CopyOp, LoopOp, Op
from tlc.ir.types import Value
from tlc.kir import ops as K
from tlc.kir import ops_sm90 as H
from tlc.kir.expr import BinOp, Const, E, Expr, Var
from tlc.lowering.abi import LaunchABI, derive_abi
from tlc.lowering.exprs import BUILTINS, ExprLowering
from tlc.lowering.rules import UNLOWERED, family_for, rule_for
from tlc.lowering.storage import Buffer, Namer, Slot, last_uses
from tlc.lowering.tile_copies import kblock
from tlc.lowering.tile_math import LOG2E

__all__ = ["LOG2E", "SHARED_LAYOUTS", "TileOpLowering", "lower_tile_ops", "smem_extent"]

# Ops that give a shared buffer its layout (shape = rows, cols[, stages]).
SHARED_LAYOUTS = (K.SmemLayoutOp, K.SmemTransposeLayoutOp, H.GmmaSmemLayoutOp)


class TileOpLowering:
    """Lower one TL program (after the TL passes) to a `ProgramOp` for `arch`: the state every rule
    reads and writes. Target facts come from `self.family` (tlc.lowering.rules.Family), never from a
    test of the arch's name."""

    def __init__(self, graph: Graph, arch: ArchInfo, name: str) -> None:
        self.g, self.arch, self.name = graph, arch, name
        self.family = family_for(arch, graph)
        self.dtype = str(graph.params.get("dtype", "bf16"))
        self.warps = self._int_param("Warps", 4)
        self.names = Namer(reserved=(*BUILTINS, *graph.axes, "p", "tidx", "smem_"))
        self.fields = {n: n for n in graph.inputs}
        self.x = ExprLowering(graph.params, graph.inputs, self.fields, graph.tensor_inputs)
        self.x.scalars.update({a: a for a in graph.axes})   # a kernel's own grid axes: LetOps from blockIdx.z
        self.abi: LaunchABI = derive_abi(graph, name, self.x.int_value)
        self.layouts: list[K.Op] = []
        self.decls: list[K.Op] = []
        self.memo: dict[tuple, str] = {}
        self.slots: dict[int, Slot] = {}
        self.buffers: dict[str, Buffer] = {}
        self.m_rows: int | None = None
        self.region = 0
        self.loops: list[tuple[str, set[str]]] = []   # enclosing loops: (kernel var, buffers written)
        self.row_refs: dict[int, str] = {}
        self.global_rows: dict[str, Expr] = {}
        self.register_allocs: dict[str, tuple[str, Loc | None]] = {}
        self._regions = 0
        self._last: dict[int, int] = {}
        self._index = 0
        self.mma_decls: list[K.Op] = []            # TiledMMAs a GEMM rule declares (wgmma: one per GEMM)
        self.gmma_major: dict[str, str] = {}       # wgmma: operand buffer → "k" | "mn" (its GMMA layout)
        # tiled copies whose tile rows are not whole passes, (name, why, loc), on a family whose copies
        # TMA may replace: legal only if warp-specialize replaces every copy through them (passes.py)
        self.partial_copies: list[tuple[str, str, Loc | None]] = []
        self.gathered: set[str] = set()            # GlobalTensorOps with a row map (tile_alloc.global_tensor)

    # ------------------------------------------------------------------ driver
    def run(self) -> K.ProgramOp:
        if self.dtype not in ("bf16", "fp16"):
            raise fail(f"tlc build: dtype {self.dtype} has no {self.arch.mma_path} path (bf16 or fp16)")
        body: list[K.Op] = []
        declared = self.warps if "Warps" in self.g.params else None
        self.warp_plan = self.family.plan(self.g, declared, self.x, self.names)
        self.warps = self.warp_plan.warps
        self.lower_region(self.g, body)
        if self.m_rows is None:
            raise fail("tlc build: the program computes no register tile (no GEMM and no tile loaded into "
                       "registers): nothing fixes the block's thread layout")
        # a loop whose trips grow with block_idx (causal): its longest tiles first, the hardware's launch order;
        # rows counted from the end put them first already
        rev = any(isinstance(op, LoopOp) and op.stop is not None and "block_idx" in str(op.stop)
                  for _, op in self.g.walk()) and not self._rows_from_end()
        # grid z: the batch, times each of the kernel's own axes (`over [split_idx = Splits]`), the last fastest
        extents = [(a, self.x.lower(e, None)) for a, e in self.g.axes.items()]
        z: Expr = Var("blockIdx.z")
        axis_lets = []
        for a, extent in reversed(extents):
            axis_lets.insert(0, K.LetOp(name=a, type="i32", value=BinOp("%", z, extent)))
            z = BinOp("/", z, extent)
        lets = [K.LetOp(name="block_idx", type="i32", value=E("gridDim.x - 1 - blockIdx.x" if rev else "blockIdx.x")),
                K.LetOp(name="head_idx", type="i32", value=E("blockIdx.y")),
                K.LetOp(name="batch_idx", type="i32", value=z), *axis_lets,
                K.LetOp(name="group", type="i32", value=Var("p.group"))]
        mmas = self.mma_decls + self.warp_plan.decls((self.family.mma_atoms or self.arch.mma_atoms)[self.dtype])
        smem = self._smem_decls()
        rows = Var(f"p.{self.abi.grid_rows}") if not self.abi.grid_rows.isdigit() else Const(int(self.abi.grid_rows))
        batches: Expr = Var("p.batch")
        for _, extent in extents:
            batches = BinOp("*", batches, extent)
        grid = (E(f"ceil_div({rows}, {self.abi.grid_tile})"), Var("p.heads"), batches)
        kernel = self.family.kernel_op(name=self.name, params=self.abi.params_op().name, threads=32 * self.warps,
                                       min_blocks=1, grid=grid, smem_bytes=smem_extent(smem),
                                       body=tuple(lets + mmas + smem + self.layouts + self.decls + body))
        program = K.ProgramOp(name=self.name, body=(self.abi.params_op(), kernel))
        program.verify()
        return program

    def _rows_from_end(self) -> bool:
        return any(isinstance(op, CopyOp) and op.from_end for _, op in self.g.walk())

    def _int_param(self, name: str, default: int) -> int:
        v = self.g.params.get(name, default)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise fail(f"tlc build: Param {name} must be a positive integer, not {v!r}")
        return v

    def lower_region(self, region: Graph, out: list[K.Op], yields: tuple[Value, ...] = ()) -> None:
        """Each op of `region` by its rule (tlc.lowering.rules), appending the kernel IR to `out`."""
        ops = region.ops()
        self._last = last_uses(region, ops, yields)
        for i, op in enumerate(ops):
            self._index = i
            rule = rule_for(type(op), self.family.path) or UNLOWERED
            rule(self, op, region, out)

    @contextmanager
    def nested_region(self) -> Iterator[int]:
        """A fresh region number for a loop body, current while the body lowers; the enclosing
        region's liveness and position come back afterwards."""
        outer = (self.region, self._last, self._index)
        self._regions += 1
        self.region = self._regions
        try:
            yield self.region
        finally:
            self.region, self._last, self._index = outer

    # ------------------------------------------------------------------ slots and storage
    def slot(self, v: Value, op: Op) -> Slot:
        s = self.slots.get(v.uid)
        if s is None:
            raise fail(f"tlc build: '{v.name}' has no storage in the kernel here (read before it is defined?)", op.loc)
        return s

    def dies_here(self, v: Value) -> bool:
        s = self.slots.get(v.uid)
        return (s is not None and s.region == self.region and s.kind in ("frag", "row")
                and self._last.get(v.uid, -1) <= self._index)

    def bind(self, v: Value, s: Slot) -> Slot:
        self.slots[v.uid] = s
        return s

    def row_reference(self, rows: int) -> str:
        """The fragment whose row layout the block's `rows`-long row vectors take (declared once)."""
        if rows not in self.row_refs:
            name = self.names.fresh(f"row_layout_{rows}")
            self.decls.append(self.warp_plan.row_reference(name, rows))
            self.row_refs[rows] = name
        return self.row_refs[rows]

    def fresh_like(self, s: Slot, base: str, out: list[K.Op], loc: Loc | None, init: float | None = None) -> Slot:
        """New storage shaped like `s` (a row vector or an accumulator of the same TiledMMA)."""
        name = self.names.fresh(base)
        if s.kind == "row":
            out.append(K.RowVectorOp(name=name, like=self.row_reference(s.rows),
                                     init=Const(0.0 if init is None else init), loc=loc))
        else:
            out.append(self.warp_plan.accumulator(name, s.mma, (s.rows, s.cols), loc))
        return Slot(s.kind, name, s.rows, s.cols, region=self.region, logical_cols=s.logical_cols, mma=s.mma)

    def in_place(self, v: Value, result: Value, out: list[K.Op], loc: Loc | None) -> Slot:
        """Storage for `result` computed from `v` by an in-place op: v's own if v dies here."""
        src = self.slots[v.uid]
        if self.dies_here(v):
            return self.bind(result, dataclasses.replace(src, region=self.region))
        dst = self.fresh_like(src, result.base, out, loc)
        out.append(K.MapOp(target=dst.name, srcs=(src.name,), fn=E("x0"), loc=loc))
        return self.bind(result, dst)

    def register_tile(self, v: Value, op: Op) -> Slot:
        """`v`'s slot, which must be an fp32 register tile or a row vector."""
        s = self.slot(v, op)
        if s.kind not in ("frag", "row"):
            what = {"smem": "a shared-memory tile", "global": "a global tensor", "afrag": "a GEMM A-operand fragment",
                    "scalar": "a scalar"}[s.kind]
            raise fail(f"tlc build: '{v.base}' is {what} here; this operation needs an fp32 register tile (an "
                       "accumulator) or a row vector", op.loc)
        return s

    def tile_shape(self, shape, loc: Loc, what: str) -> tuple[int, int]:
        """(rows, cols) of a 2-D tile shape, as constants."""
        if len(shape) != 2:
            raise fail(f"tlc build: {what} must be a 2-D tile (rows, cols)", loc)
        return self.x.int_value(shape[0], loc, "a tile extent"), self.x.int_value(shape[1], loc, "a tile extent")

    # ------------------------------------------------------------------ declarations, each made once
    def declare_once(self, key: tuple, base: str, make: Callable[[str], K.Op]) -> str:
        """The name of the declaration memoised under `key`, made by `make(fresh name)` the first time."""
        if key not in self.memo:
            name = self.names.fresh(base)
            self.decls.append(make(name))
            self.memo[key] = name
        return self.memo[key]

    def partition(self, key: tuple, base: str, slice_: str, method: str, src: Expr) -> str:
        return self.declare_once(key, base, lambda n: K.PartitionOp(name=n, slice=slice_, method=method, src=src))

    def identity(self, rows: int, cols: int) -> str:
        """A rows × cols tile of (row, col) coordinates, partitioned like the data for predicates and masks."""
        return self.declare_once(("ident", rows, cols), f"c{rows}x{cols}",
                                 lambda n: K.IdentityTileOp(name=n, shape=(rows, cols)))

    # ------------------------------------------------------------------ shared memory
    def _smem_decls(self) -> list[K.Op]:
        out: list[K.Op] = []
        offset = 0
        for buf in self.buffers.values():
            out += self._buffer_layout(buf)
        # GMMA's swizzle is by address: its tiles start 1024-byte aligned (wgmma operands only).
        align = 1024 if self.gmma_major else 128
        for buf in self.buffers.values():
            at = 0 if buf.reuse else offset
            out.append(K.SharedBufferOp(name=buf.name, dtype=buf.dtype, layout=f"{buf.name}_layout", offset_bytes=at,
                                        reuse=buf.reuse, loc=buf.loc))
            if not buf.reuse:
                offset += -(-buf.bytes // align) * align
        return out

    def _buffer_layout(self, buf: Buffer) -> list[K.Op]:
        """`<buf>_layout`, (rows, cols) as copies write it: swizzled atoms (infer-layouts picks the swizzle), or
        for a wgmma operand GMMA's 128-byte K-major atoms as stored; an operand read MN-major (V of P·V) is
        stored the same way and seen transposed (`<buf>_layout_mn`), so every 64 columns of it are one
        contiguous swizzled box, as a TMA load writes them."""
        major = self.gmma_major.get(buf.name)
        if major in ("k", "mn"):
            out: list[K.Op] = [H.GmmaSmemLayoutOp(name=f"{buf.name}_layout", dtype=buf.dtype, swizzle=128,
                                                  shape=(buf.rows, buf.cols), k_major=True, loc=buf.loc)]
            if major == "mn":
                out.append(K.SmemTransposeLayoutOp(name=f"{buf.name}_layout_mn", of=f"{buf.name}_layout",
                                                   shape=(buf.cols, buf.rows), loc=buf.loc))
            return out
        return [K.SmemLayoutOp(name=f"{buf.name}_layout", swizzle=(0, 0, 0), atom=(8, kblock(buf.cols)),
                               shape=(buf.rows, buf.cols), loc=buf.loc)]


def smem_extent(ops: list[K.Op]) -> int:
    """Bytes of dynamic shared memory the buffers among `ops` span (layout shapes × element size)."""
    layouts = {op.name: op for op in ops if isinstance(op, SHARED_LAYOUTS)}
    end = 0
    for op in ops:
        if isinstance(op, K.SharedBufferOp):
            n = 1
            for d in layouts[op.layout].shape:
                n *= d
            end = max(end, op.offset_bytes + n * (4 if op.dtype == "fp32" else 2))
    return end


def lower_tile_ops(graph: Graph, arch: ArchInfo, name: str) -> K.ProgramOp:
    return TileOpLowering(graph, arch, name).run()
