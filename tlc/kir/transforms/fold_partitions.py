"""`fold-partitions`: each thread's share of a tile, computed by tlc's layout engine (tlc/layout)
instead of by CuTe's layout algebra in the C++ front end (docs/compile_time.md).

Runs last, on the final schedule and buffers. A partition of a shared, global or coordinate tile
becomes a view (thread offset + flat static layout), a retile a register view, a fragment a
register tensor with CuTe's layout, and a TiledCopy (TiledMMA) all of whose partitions folded its bare atom:

    before  PartitionOp(name=tQsQ, slice=gmem_copy_128_thr, method=partition_D, src=`sQ`)
    after   ThreadViewOp(name=tQsQ, slice=gmem_copy_128_thr, method=partition_D, src=`sQ`,
                         offset=`threadIdx.x * 8`, layout_shape=((8, 1), 8, 2),
                         layout_stride=((1, 0), 1024, 8192), swizzle=(3, 3, 3), keep=0)

What the engine does not model stays as it was (notes name it). The ldmatrix sources (shared→register
partitions of an MMA operand copy) fold with their decayed strides spelled as CuTe spells them, a select of
two constants on one bit of the thread's offset (an arithmetic `d − 2d·bit` cost registers and up to 6 %);
`Param FoldLdmatrix = false` keeps CuTe's partitions, which tlc.attention.tuning binds at d = 64, where the folded
kernels ran 3 % slower on an H200 (docs/compile_time.md). In the sm_90a (wgmma) kernels the
engine models the epilogue's store (a thread-layout copy of the staged tile) and, with CuTe's GMMA layouts
(checked by NVRTC), the wgmma accumulators (register tensors of partition_fragment_C's layout), their
coordinates for the masks, the copy matched to them and the shared operands' GMMA descriptors (make_fragment_A/B
without the partition: the warp group's start address and make_gmma_desc's static fields, tlc/layout/gmma.py),
except under TLC_FOLD_PARTITIONS=no-wgmma. On by default; TLC_FOLD_PARTITIONS=0 or
`fold-partitions{enable=false}` turns it off.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

from pycute import Layout

from tlc.kir import ops as K
from tlc.kir import ops_sm90 as H
from tlc.kir.expr import Var, print_expr
from tlc.kir.ops_sm90 import ELEMENT_BYTES
from tlc.kir.ops_views import (CoordViewOp, CopyAtomOp, GlobalTileViewOp, MmaAtomOp,
                               RegisterFragmentOp, RetileViewOp, StaticSmemLayoutOp, StaticTransposeLayoutOp,
                               ThreadViewOp, WgmmaDescriptorFragmentOp, WgmmaRegisterFragmentOp, refine)
from tlc.kir.transforms.base import Facts, KernelTransform, Notes
from tlc.kir.transforms.schedule import Schedule
from tlc.layout.algebra import modes
from tlc.layout.gmma import descriptor_fields, descriptor_layout, gmma_layout
from tlc.layout.kir_atoms import atom_calls
from tlc.layout.kir_tensors import TileLayout, TileLayouts, engine_copy, engine_mma, smem_layout, transpose_layout
from tlc.layout.kir_views import coord_fields, global_strides, nested, offset_expr, swizzled_strides
from tlc.layout.swizzle import decay
from tlc.lowering.switches import fold_partitions_enabled, fold_wgmma_enabled


class _Folder:
    """One kernel's rewrite: the tile layouts, the thread slices and what was (not) folded."""

    def __init__(self, kernel: K.KernelOp, wgmma: bool = False, ldsm: bool = True) -> None:
        self.ldsm = ldsm
        self.tiles = TileLayouts(kernel)
        self.slices: dict[str, K.Op] = {}
        self.unmodelled: dict[str, str] = {}   # MMA name → why copies matched to it stay CuTe's
        self.mmas: dict[str, K.TiledMmaOp] = {}
        for op in K.walk(kernel):
            if isinstance(op, K.TiledMmaOp):
                self.mmas[op.name] = op
                self.slices[op.thread_slice] = op
            elif isinstance(op, H.WgmmaTiledMmaOp):   # folded unless TLC_FOLD_PARTITIONS=no-wgmma
                if wgmma:
                    self.mmas[op.name] = op
                    self.slices[op.thread_slice] = op
                else:
                    self.unmodelled[op.name] = "matched to a wgmma accumulator (left to CuTe by TLC_FOLD_PARTITIONS=no-wgmma)"
            elif isinstance(op, K.TiledCopyOp):
                self.slices[op.thread_slice] = op
        self.kept: list[str] = []
        self.folded = 0
        self.descriptor_sources: set[str] = set()   # wgmma operand partitions whose fragments folded

    def _index(self, mma: K.TiledMmaOp | None) -> str:
        """A replicated MMA's threads act as threads 0 … size-1 of each group."""
        replicated = isinstance(mma, K.TiledMmaOp) and mma.replicas > 1
        return f"threadIdx.x % {mma.threads}" if replicated else "threadIdx.x"

    # ------------------------------------------------------------------ the ops
    def fragment(self, op: K.FragmentOp) -> K.Op:
        mma = self.mmas.get(op.mma)
        if mma is None:
            return self._keep(op, "its MMA is not a TiledMMA")
        if op.role == "C":
            layout = engine_mma(mma).fragment("C", Layout(op.shape))
        else:
            tile = self.tiles.of(op.src)
            if tile is None or tile.space != "shared":
                return self._keep(op, f"its shape comes from `{op.src}`")
            layout = engine_mma(mma).fragment(op.role, tile.layout, tile.swizzle)
            if layout is None:
                return self._keep(op, "CuTe keeps the swizzle of its partition")
        self.tiles.registers[op.name] = layout
        return self._fold(RegisterFragmentOp, op, layout_shape=nested(layout.shape),
                          layout_stride=nested(layout.stride))

    def partition(self, op: K.PartitionOp) -> K.Op:
        owner = self.slices.get(op.slice)
        tile = self.tiles.of(op.src)
        if isinstance(owner, K.TiledCopyOp) and owner.mma in self.unmodelled:
            return self._keep(op, self.unmodelled[owner.mma])
        if isinstance(owner, H.WgmmaTiledMmaOp) and op.method in ("partition_A", "partition_B"):
            return op   # read by its fragment: dropped when that folds into descriptors (noted at the end)
        if owner is None or tile is None:
            return self._keep(op, f"`{op.src}` is not a tile the engine models")
        if isinstance(owner, H.WgmmaTiledMmaOp):
            return self._wgmma_coords(op, owner, tile)
        if isinstance(owner, K.TiledMmaOp):
            engine, mma, side = engine_mma(owner), owner, op.method[-1]
            if op.method not in ("partition_A", "partition_B", "partition_C"):
                return self._keep(op, f"{op.method} of a TiledMMA")
        else:
            mma = self.mmas.get(owner.mma)
            engine, side = engine_copy(owner, mma), op.method[-1]
            if engine is None:
                return self._keep(op, f"the copy atom {owner.atom} is not modelled")
        if op.method.startswith("retile"):
            if tile.space != "registers":
                return self._keep(op, "a retile of memory")
            layout = engine.retile(tile.layout)
            return self._fold(RetileViewOp, op, layout_shape=nested(layout.shape),
                              layout_stride=nested(layout.stride))
        if tile.space == "registers":
            return self._keep(op, "a partition of registers")
        ldsm = isinstance(owner, K.TiledCopyOp) and owner.kind in ("A", "B") and tile.space == "shared"
        if ldsm and not self.ldsm:   # Param FoldLdmatrix = false (docs/compile_time.md)
            return self._keep(op, "an ldmatrix source, by Param FoldLdmatrix = false")
        thr, values = engine.partition(side, tile.layout)
        index = self._index(mma if isinstance(owner, K.TiledMmaOp) or owner.kind != "threads" else None)
        if tile.space == "coords":
            return self._coords(op, thr, values, tile, index)
        offset = offset_expr(thr, index, tile.row_stride)
        if not any(tile.swizzle):
            return self._fold(ThreadViewOp, op, offset=offset, layout_shape=nested(values.shape),
                              layout_stride=global_strides(values, tile.row_stride), keep=tile.keep)
        found = decay(thr, values, tile.swizzle)  # CuTe's decayed slice of a swizzled tile
        if found is None:
            return self._keep(op, "its values move a swizzle bit and its partner")
        return self._fold(ThreadViewOp, op, offset=offset, layout_shape=nested(found.values.shape),
                          layout_stride=swizzled_strides(found, offset, select=ldsm), swizzle=tuple(tile.swizzle))

    def _wgmma_coords(self, op: K.PartitionOp, mma: H.WgmmaTiledMmaOp, tile: TileLayout) -> K.Op:
        """A wgmma's accumulator coordinates (masks) fold; its shared operands are GMMA descriptors CuTe builds."""
        if op.method != "partition_C" or tile.space != "coords":   # an operand: its fragment folds, or keeps it
            return op
        thr, values = engine_mma(mma).partition("C", tile.layout)
        return self._coords(op, thr, values, tile, print_expr(mma.thread_index))

    def wgmma_fragment(self, op: H.WgmmaFragmentOp) -> K.Op:
        """An accumulator: a register tensor of CuTe's partition_fragment_C layout (NVRTC checks the type)."""
        layout = engine_mma(self.mmas[op.mma]).fragment("C", Layout(op.shape))
        self.tiles.registers[op.name] = layout
        return self._fold(WgmmaRegisterFragmentOp, op, layout_shape=nested(layout.shape),
                          layout_stride=nested(layout.stride))

    def wgmma_descriptors(self, op: H.WgmmaFragmentOp) -> K.Op:
        """A shared operand: its GMMA descriptors from the engine's partition of the GMMA tile (the
        start as the warp group's offset, the static fields as make_gmma_desc derives them)."""
        part = self.tiles.defs.get(op.src.name) if isinstance(op.src, Var) else None
        mma = self.mmas[op.mma]
        if not (type(part) is K.PartitionOp and part.slice == mma.thread_slice and isinstance(part.src, Var)):
            return self._keep(op, "its source is not a partition of a shared tile by its wgmma")
        found = self._gmma_tile(part.src.name)
        if found is None:
            return self._keep(op, f"`{part.src.name}` is not a GMMA shared layout the engine models")
        layout, gmma = found
        thr, values = engine_mma(mma).partition(op.role, layout)
        first, *rest = modes(values)
        k_major = mma.a_k_major if op.role == "A" else mma.b_k_major
        size = ELEMENT_BYTES[gmma.dtype]
        fields = descriptor_fields(first, k_major, gmma.swizzle, size)
        if fields is None:
            return self._keep(op, "its layout is not one make_gmma_desc describes")
        frag = descriptor_layout(rest, size)
        self.descriptor_sources.add(part.name)
        return dataclasses.replace(
            self._fold(WgmmaDescriptorFragmentOp, op, offset=offset_expr(thr, print_expr(mma.thread_index), None),
                       desc_lo=fields[0], desc_hi=fields[1], layout_shape=nested(frag.shape),
                       layout_stride=nested(frag.stride)), src=part.src)

    def _gmma_tile(self, name: str) -> tuple[Layout, H.GmmaSmemLayoutOp] | None:
        """(layout, GMMA atom op) of a shared buffer in a GMMA layout, or a transposed view of one."""
        buf = self.tiles.defs.get(name)
        lay = self.tiles.defs.get(buf.layout) if isinstance(buf, (K.SharedBufferOp, K.SharedViewOp)) else None
        view = None
        if type(lay) is K.SmemTransposeLayoutOp and not lay.strip_swizzle:
            view, lay = lay, self.tiles.defs.get(lay.of)
        if not isinstance(lay, H.GmmaSmemLayoutOp):
            return None
        layout, _ = gmma_layout(ELEMENT_BYTES[lay.dtype], lay.swizzle, lay.shape, lay.k_major)
        return (transpose_layout(layout, view) if view is not None else layout), lay

    def _coords(self, op: K.PartitionOp, thr: Layout, values: Layout, tile: TileLayout, index: str) -> K.Op:
        fields = coord_fields(thr, values, tile.layout.shape[0], index)
        if fields is None:
            return self._keep(op, "a coordinate step crosses rows and columns")
        row, col, basis = fields
        return self._fold(CoordViewOp, op, row=row, col=col, layout_shape=nested(values.shape),
                          layout_stride=basis)

    def _fold(self, cls, op: K.Op, **extra) -> K.Op:
        self.folded += 1
        return refine(cls, op, **extra)

    def _keep(self, op: K.Op, why: str) -> K.Op:
        self.kept.append(f"{op.defined_names()[0]}: kept ({why})")
        return op

    def rewrite(self, ops: tuple[K.Op, ...]) -> tuple[K.Op, ...]:
        out = []
        for op in ops:
            if type(op) is K.FragmentOp:
                op = self.fragment(op)
            elif type(op) is K.PartitionOp:
                op = self.partition(op)
            elif type(op) is H.WgmmaFragmentOp and op.role == "C" and op.mma in self.mmas:
                op = self.wgmma_fragment(op)
            elif type(op) is H.WgmmaFragmentOp and op.mma in self.mmas and (
                    op.role == "B" or self.mmas[op.mma].kind == "SS"):
                op = self.wgmma_descriptors(op)
            elif isinstance(op, K.ConvertOp) and op.src in self.tiles.registers:
                self.tiles.registers[op.name] = self.tiles.registers[op.src]
            if op.regions:
                op = dataclasses.replace(op, **{r: self.rewrite(getattr(op, r)) for r in op.regions})
            out.append(op)
        return tuple(out)


def fold_partitions(kernel: K.KernelOp, wgmma: bool = False, ldsm: bool = True) -> tuple[K.KernelOp, list[str]]:
    """`wgmma`: on sm_90a also the copies matched to a wgmma accumulator (off: TLC_FOLD_PARTITIONS=no-wgmma);
    `ldsm`: the ldmatrix sources too, their decayed strides spelled as CuTe spells them (off: Param
    FoldLdmatrix = false)."""
    folder = _Folder(kernel, wgmma, ldsm)
    body = folder.rewrite(kernel.body)
    used, dropped = K.names_used(body), folder.descriptor_sources
    body = K.rewrite_ops(body, lambda op: None if type(op) is K.PartitionOp and op.name in dropped
                         and op.name not in used else op)   # operand partitions only their descriptors read
    rest = list(K.walk(dataclasses.replace(kernel, body=body)))
    folder.kept += [f"{op.name}: kept (a wgmma operand's partition{' still read' if op.name in dropped else ''})"
                    for op in rest if type(op) is K.PartitionOp and isinstance(folder.slices.get(op.slice), H.WgmmaTiledMmaOp)]
    # A TiledCopy none of whose partitions is left needs only its atom; so does a TiledMMA no
    # fragment, partition or tiled copy refers to any more.
    left = {op.slice for op in rest if type(op) is K.PartitionOp}
    copies = [op for op in body if type(op) is K.TiledCopyOp and op.thread_slice not in left
              and engine_copy(op, folder.mmas.get(op.mma))]
    mma_users = {op.mma for op in rest if type(op) is K.FragmentOp} | {
        op.mma for op in rest if type(op) is K.TiledCopyOp and op not in copies}
    final, atoms = [], 0
    for op in body:
        if op in copies:
            op = refine(CopyAtomOp, op)
            atoms += 1
        elif type(op) is K.GlobalTileOp and _whole_tile(op, folder.tiles.defs.get(op.src)):
            cols = folder.tiles.defs[op.src].cols
            op = refine(GlobalTileViewOp, op, col_tiles=-(-cols // op.tile[1]))
        elif type(op) is K.SmemLayoutOp:
            lay = smem_layout(op)
            op = refine(StaticSmemLayoutOp, op, layout_shape=nested(lay.shape), layout_stride=nested(lay.stride))
        elif type(op) is K.SmemTransposeLayoutOp and type(folder.tiles.defs.get(op.of)) is K.SmemLayoutOp:
            base = folder.tiles.defs[op.of]
            lay = transpose_layout(smem_layout(base), op)
            op = refine(StaticTransposeLayoutOp, op, layout_shape=nested(lay.shape), layout_stride=nested(lay.stride),
                        swizzle=(0, 0, 0) if op.strip_swizzle else base.swizzle)
        elif type(op) is K.TiledMmaOp and op.thread_slice not in left and op.name not in mma_users:
            op = refine(MmaAtomOp, op)
            atoms += 1
        final.append(op)
    body, loops = atom_calls(tuple(final), {op.name: op for op in final if isinstance(op, CopyAtomOp)},
                             {op.name: op for op in final if isinstance(op, MmaAtomOp)})
    notes = [f"fold-partitions: {folder.folded} partitions and fragments as flat views, {atoms} copies and MMAs "
             f"as atoms, {loops} copies and MMAs as atom calls",
             *folder.kept]
    return dataclasses.replace(kernel, body=body), notes


def _whole_tile(op: K.GlobalTileOp, tensor: K.Op | None) -> bool:
    """A (rows, cols) tile of a row-major global tensor with both tile indices kept (`(_, _)`)."""
    return (isinstance(tensor, K.GlobalTensorOp) and tensor.cols > 0 and len(op.tile) == 2
            and all(isinstance(c, Var) and c.name == "_" for c in op.coord))


@dataclass(frozen=True)
class FoldPartitionsTransform(KernelTransform):
    """Partitions, fragments and tiled copies as flat layouts. `enable` (TLC_FOLD_PARTITIONS=0: off) and
    `wgmma` (TLC_FOLD_PARTITIONS=no-wgmma: off) come from the environment unless given as options;
    `Param FoldLdmatrix = false` (schedule.fold_ldmatrix) keeps the ldmatrix sources CuTe's partitions
    (slower to compile, faster at d = 64 on an H200: tlc.attention.tuning binds it there)."""

    name: ClassVar[str] = "fold-partitions"
    enable: bool = field(default_factory=fold_partitions_enabled)
    wgmma: bool = field(default_factory=fold_wgmma_enabled)

    def rewrite(self, kernel: K.KernelOp, schedule: Schedule, facts: Facts) -> tuple[K.KernelOp, Notes]:
        if not self.enable:
            return kernel, []
        return fold_partitions(kernel, wgmma=self.wgmma, ldsm=schedule.fold_ldmatrix)
