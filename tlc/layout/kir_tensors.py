"""The engine's view of kernel-IR ops: the TiledMMA and TiledCopy an op declares, and each shared,
global, coordinate or register tile a partition or fragment names, as a pycute layout from its
coordinate (rows, cols[, stages]) to its element offset, before any swizzle.

A global tile's row stride is a runtime value: it is carried as the integer `ROW` (far larger
than any tile), so a stride of the result is `a·ROW + b` and reads back as `a·row_stride + b`.
"""
from __future__ import annotations

from dataclasses import dataclass

from pycute import Layout, composition

from tlc.kir import ops as K
from tlc.kir import ops_sm90 as H
from tlc.kir.expr import Const, Expr, Index, Var
from tlc.layout.atoms import copy_atom, wgmma_atom
from tlc.layout.swizzle import static_decay
from tlc.layout.tiled_copy import TiledCopy
from tlc.layout.tiled_mma import TiledMma

ROW = 1 << 24


@dataclass(frozen=True)
class TileLayout:
    layout: Layout
    space: str                             # shared | global | coords | registers
    swizzle: tuple[int, int, int] = (0, 0, 0)
    row_stride: Expr | None = None         # global: what ROW stands for
    keep: int = 0                          # global: the tile-index modes that follow the tile's two


def smem_layout(op: K.SmemLayoutOp) -> Layout:
    """CuTe's tile_to_shape of a row-major (r, c) atom: atoms column-major over the shape, stages last."""
    return smem_layout_of_atom(op.atom, op.shape)


def smem_layout_of_atom(atom: tuple[int, int], shape: tuple[int, ...], row_major: bool = True) -> Layout:
    """tile_to_shape of a compact (r, c) atom (row-major, or column-major) over (rows, cols[, stages])."""
    (r, c) = atom
    rows, cols = shape[0] // r, shape[1] // c
    size = r * c
    modes_shape = ((r, rows), (c, cols))
    modes_stride = ((c, size), (1, size * rows)) if row_major else ((1, size), (r, size * rows))
    if len(shape) == 3:
        return Layout((*modes_shape, shape[2]), (*modes_stride, size * rows * cols))
    return Layout(modes_shape, modes_stride)


def transpose_layout(base: Layout, op: K.SmemTransposeLayoutOp) -> Layout:
    """The (cols, rows[, stages]) view: coordinate (c, r, s) reads element (r, c, s) of `base`."""
    cols, rows = op.shape[0], op.shape[1]
    stride = (rows, 1) + ((rows * cols,) if len(op.shape) == 3 else ())
    return composition(base, Layout(op.shape, stride))


class TileLayouts:
    """Name → TileLayout for the tensors a kernel declares; `registers` is filled as fragments fold."""

    def __init__(self, kernel: K.KernelOp) -> None:
        self.defs: dict[str, K.Op] = {}
        for op in K.walk(kernel):
            for name in op.defined_names():
                self.defs.setdefault(name, op)
        self.registers: dict[str, Layout] = {}

    def _layout_op(self, name: str) -> tuple[Layout, tuple[int, int, int]] | None:
        op = self.defs.get(name)
        if isinstance(op, K.SmemLayoutOp):
            return smem_layout(op), op.swizzle
        if isinstance(op, K.SmemTransposeLayoutOp):
            base = self._layout_op(op.of)
            if base is None:
                return None
            return transpose_layout(base[0], op), (0, 0, 0) if op.strip_swizzle else base[1]
        return None

    def of(self, e: Expr) -> TileLayout | None:
        if isinstance(e, Index):
            whole = self.of(e.base)
            if whole is None or whole.space != "shared" or len(e.indices) != len(whole.layout):
                return None
            if not all(isinstance(i, Const) or (isinstance(i, Var) and i.name == "_") for i in e.indices):
                return None
            crd = tuple(None if isinstance(i, Var) else i.value for i in e.indices)
            part = whole.layout(crd)  # offsets do not matter to fragments, the only readers of slices
            plain = static_decay(part, whole.swizzle) if any(whole.swizzle) else part
            if plain is None:  # CuTe keeps the swizzle of this slice
                return TileLayout(part, "shared", whole.swizzle)
            return TileLayout(plain, "shared")  # CuTe decays it to a plain layout
        if not isinstance(e, Var):
            return None
        if e.name in self.registers:
            return TileLayout(self.registers[e.name], "registers")
        op = self.defs.get(e.name)
        if isinstance(op, (K.SharedBufferOp, K.SharedViewOp)):
            found = self._layout_op(op.layout)
            return TileLayout(found[0], "shared", found[1]) if found else None
        if isinstance(op, K.IdentityTileOp):
            return TileLayout(Layout(op.shape), "coords")
        if isinstance(op, K.GlobalTileOp):
            tensor = self.defs.get(op.src)
            whole = all(isinstance(c, Var) and c.name == "_" for c in op.coord)
            if not isinstance(tensor, K.GlobalTensorOp) or not tensor.cols or len(op.tile) != 2 or not whole:
                return None
            return TileLayout(Layout(op.tile, (ROW, 1)), "global", row_stride=tensor.row_stride, keep=2)
        return None


def engine_mma(op: K.TiledMmaOp | H.WgmmaTiledMmaOp) -> TiledMma:
    if isinstance(op, H.WgmmaTiledMmaOp):     # tile = the atom's (64, N, 16), repeated over warp groups
        (m, n, k), w = op.tile, op.warp_groups
        return TiledMma(wgmma_atom(n, op.kind), tuple(w), (m * w[0], n * w[1], k * w[2]))
    return TiledMma.of(op.atom, op.warps, op.tile)


def engine_copy(op: K.TiledCopyOp, mma: K.TiledMmaOp | H.WgmmaTiledMmaOp | None) -> TiledCopy | None:
    atom = copy_atom(op.atom, op.dtype)
    if atom is None:
        return None
    if op.kind == "threads":
        return TiledCopy.of_threads(atom, op.thread_layout, op.value_layout)
    return TiledCopy.of_mma(atom, engine_mma(mma), op.kind) if mma is not None else None
