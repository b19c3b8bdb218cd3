"""Kernel-IR views that `fold-partitions` (tlc/kir/transforms/fold_partitions.py) leaves in place of
CuTe's partitioning calls: each thread's share of a tile as a flat layout tlc computed
(tlc/layout), so NVRTC instantiates one small layout type instead of CuTe's layout algebra.

Each view op subclasses the op it replaces and keeps its fields (the tile evaluator, which does
not model threads, treats it as that op); the added fields are what the emitter spells:
`layout_shape` / `layout_stride` (nested tuples, congruent) and, for memory, the thread's offset.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from tlc.kir.expr import Expr
from tlc.kir.ops_decl import (FragmentOp, GlobalTileOp, PartitionOp, SmemLayoutOp, SmemTransposeLayoutOp, TiledCopyOp,
                              TiledMmaOp)
from tlc.kir.ops_exec import AsyncCopyOp, CopyOp, MmaOp
from tlc.kir.ops_sm90 import WgmmaFragmentOp


def refine(cls: type, op, **extra):
    """`op` as its view subclass `cls`: every field it had, plus the view's `extra` fields."""
    return cls(**{f.name: getattr(op, f.name) for f in fields(op)}, **extra)


def _congruent(shape, stride, leaf) -> bool:
    if isinstance(shape, tuple):
        return isinstance(stride, tuple) and len(shape) == len(stride) and all(
            _congruent(s, d, leaf) for s, d in zip(shape, stride))
    return isinstance(shape, int) and shape > 0 and leaf(stride)


def _int_stride(d) -> bool:
    return isinstance(d, int) and not isinstance(d, bool)


class _LayoutFields:
    """Checks shared by the views: a congruent (shape, stride) pair of the given leaf kind."""

    def _check_layout(self, leaf, what: str) -> None:
        ok = isinstance(self.layout_shape, tuple) and _congruent(self.layout_shape, self.layout_stride, leaf)
        self._need(ok, f"layout_shape {self.layout_shape} and layout_stride {self.layout_stride} are not "
                       f"congruent ({what} strides)")


class _StaticLayout(_LayoutFields):
    """A view whose layout is all static (int strides)."""

    def check(self) -> None:
        super().check()
        self._check_layout(_int_stride, "static")


@dataclass(frozen=True, kw_only=True)
class ThreadViewOp(_LayoutFields, PartitionOp):
    """A thread's share of a shared or global tile: `make_tensor(src.data() + offset, layout)`; for
    a swizzled shared tile the base is `Swizzle<B,M,S>{}(offset)` and the strides that cross a
    swizzle bit depend on the thread (CuTe's decayed slice). Strides are ints or expressions; the
    last `keep` modes of `src` (a global tile's tile indices) follow as they are.

        ThreadViewOp(name=tAsQ, slice=s2r_A_thr, method=partition_S, src=`sQ`, offset=`...`,
                     layout_shape=((8, 1), 2, ((2, 2), 2)), layout_stride=((1, 0), 4096,
                     ((`32 - 64 * (... / 128 % 2)`, ...), 8192)), swizzle=(3, 3, 3), keep=0)
    """

    offset: Expr
    layout_shape: tuple
    layout_stride: tuple
    swizzle: tuple[int, int, int] = (0, 0, 0)
    keep: int = 0

    def check(self) -> None:
        super().check()
        self._check_layout(lambda d: _int_stride(d) or isinstance(d, Expr), "int or expression")
        self._need(len(self.swizzle) == 3 and all(_int_stride(v) and v >= 0 for v in self.swizzle), "bad swizzle")
        self._need(_int_stride(self.keep) and self.keep >= 0, "keep must be >= 0")
        self._need(not any(self.swizzle) or self.keep == 0, "a swizzled view keeps no modes of its source")


@dataclass(frozen=True, kw_only=True)
class CoordViewOp(_LayoutFields, PartitionOp):
    """A thread's share of a coordinate tile (bounds predicates): the first coordinate is
    (`row`, `col`); each stride is (axis, step), axis 0 rows, 1 columns.

        CoordViewOp(name=tSc, slice=thr_mma, method=partition_C, src=`c128x64`, row=`threadIdx.x % 32 / 4`,
                    col=`threadIdx.x % 4 * 2`, layout_shape=((2, 2), 2, 8), layout_stride=(((1, 1), (0, 8)), ...))
    """

    row: Expr
    col: Expr
    layout_shape: tuple
    layout_stride: tuple

    def check(self) -> None:
        super().check()
        basis = (lambda d: isinstance(d, tuple) and len(d) == 2 and d[0] in (0, 1) and _int_stride(d[1]))
        ok = isinstance(self.layout_shape, tuple) and _congruent(self.layout_shape, self.layout_stride, basis)
        self._need(ok, f"layout_stride {self.layout_stride} is not (axis, step) per mode of {self.layout_shape}")


@dataclass(frozen=True, kw_only=True)
class RetileViewOp(_StaticLayout, PartitionOp):
    """retile_S/D: the same registers as `src` in the copy's value order, `make_tensor(src.data(), layout)`."""

    layout_shape: tuple
    layout_stride: tuple


@dataclass(frozen=True, kw_only=True)
class RegisterFragmentOp(_StaticLayout, FragmentOp):
    """A register fragment with the layout CuTe's partition_fragment_A/B/C would give it:
    `make_tensor<T>(layout)`."""

    layout_shape: tuple
    layout_stride: tuple


@dataclass(frozen=True, kw_only=True)
class WgmmaRegisterFragmentOp(_StaticLayout, WgmmaFragmentOp):
    """A wgmma accumulator (role C) with the layout CuTe's partition_fragment_C gives it:
    `make_tensor<float>(layout)` (equal to CuTe's mode by mode, so cute::gemm and every reader index it as before)."""

    layout_shape: tuple
    layout_stride: tuple

    def check(self) -> None:
        super().check()
        self._need(self.role == "C", "only accumulators (role C) fold")


@dataclass(frozen=True, kw_only=True)
class WgmmaDescriptorFragmentOp(_StaticLayout, WgmmaFragmentOp):
    """A wgmma shared operand (A of an SS MMA, or B) as CuTe's make_fragment_A/B gives it, without its
    partition: GMMA descriptors, `make_tensor(GMMA::DescriptorIterator{desc}, layout)`. `src` is the
    shared tile; the descriptor starts at its element `offset` (the warp group's first, a function of the
    thread index) with the static halves `desc_lo` / `desc_hi` make_gmma_desc derives from the layout
    (tlc/layout/gmma.py); `layout` is the partition's rest modes in 16-byte units after one descriptor.

        WgmmaDescriptorFragmentOp(name=tSrQ, mma=wgmma_S, role=A, src=`sQ`, offset=`threadIdx.x / 128 * 4096`,
                                  desc_lo=65536, desc_hi=1073741888, layout_shape=(1, 1, (4, 2)),
                                  layout_stride=(0, 0, (2, 1024)))
    """

    offset: Expr
    desc_lo: int
    desc_hi: int
    layout_shape: tuple
    layout_stride: tuple

    def check(self) -> None:
        super().check()
        self._need(self.role in ("A", "B"), "only shared operands (roles A, B) are descriptors")
        self._need(isinstance(self.offset, Expr), "offset must be an expression")
        self._need(all(_int_stride(v) and 0 <= v < 1 << 32 for v in (self.desc_lo, self.desc_hi)),
                   "desc_lo and desc_hi must be 32-bit unsigned")


@dataclass(frozen=True, kw_only=True)
class CopyAtomOp(TiledCopyOp):
    """The copy instruction alone, `Copy_Atom<atom, T> name{}`: every partition by this copy was
    folded into a view, so copies need the atom, not the TiledCopy."""


@dataclass(frozen=True, kw_only=True)
class MmaAtomOp(TiledMmaOp):
    """The MMA instruction alone, `using name_t = MMA_Atom<atom>`: every fragment and partition of
    this MMA was folded, and cute::gemm over those fragments needs only the atom."""


class _RestModes:
    """Checks the `rest` mode extents an atom-call copy loops over."""

    def check(self) -> None:
        super().check()
        self._need(all(isinstance(n, int) and n > 0 for n in self.rest), f"rest {self.rest} needs positive ints")


@dataclass(frozen=True, kw_only=True)
class AtomCopyOp(_RestModes, CopyOp):
    """A CopyOp between views, as loops over the `rest` modes (after mode 0, once sliced) calling
    the atom on each mode-0 slice: what cute::copy does, without its generic layout algebra.
    `vector` = (bits, values, moves) where the atom is a universal copy and both mode-0 slices are
    `moves` runs of `values` contiguous elements: each call is then `moves` plain `bits`-wide
    moves, element `v · values` of mode 0 to the same of the destination (what the atom's call
    does, without instantiating it)."""

    rest: tuple[int, ...]
    vector: tuple[int, ...] = ()

    def check(self) -> None:
        super().check()
        self._need(self.vector == () or (len(self.vector) == 3 and self.vector[0] in (8, 16, 32, 64, 128)
                                         and all(isinstance(v, int) and v > 0 for v in self.vector[1:])),
                   f"vector {self.vector} must be () or (bits 8..128, values, moves)")


@dataclass(frozen=True, kw_only=True)
class AtomAsyncCopyOp(_RestModes, AsyncCopyOp):
    """An AsyncCopyOp (cp.async) between views, as AtomCopyOp's loops over the `rest` modes."""

    rest: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class AtomMmaOp(MmaOp):
    """An MmaOp on register fragments as cute::gemm's (V,M) × (V,N) → (V,M,N) traversal, spelled out:
    the `m` × `n` atom calls in CuTe's serpentine order (`n_outer`: columns outer, rows reversed on
    odd columns; else the transpose), each `mma.call(acc(_, m, n), a(_, m, kb), b(_, n, kb))`."""

    m: int
    n: int
    n_outer: bool

    def check(self) -> None:
        super().check()
        self._need(isinstance(self.n_outer, bool), "n_outer must be true or false")
        self._need(all(isinstance(v, int) and v > 0 for v in (self.m, self.n)), "m and n need positive ints")


@dataclass(frozen=True, kw_only=True)
class StaticSmemLayoutOp(_StaticLayout, SmemLayoutOp):
    """A shared layout as the static layout tlc computed (the same function as CuTe's
    tile_to_shape of the swizzled atom): `composition(Swizzle<B,M,S>{}, Layout<…>{})`."""

    layout_shape: tuple
    layout_stride: tuple


@dataclass(frozen=True, kw_only=True)
class StaticTransposeLayoutOp(_StaticLayout, SmemTransposeLayoutOp):
    """A transposed shared view's layout as the static layout tlc computed, under `swizzle`
    ((0, 0, 0) where the view strips it)."""

    layout_shape: tuple
    layout_stride: tuple
    swizzle: tuple[int, int, int] = (0, 0, 0)


@dataclass(frozen=True, kw_only=True)
class GlobalTileViewOp(GlobalTileOp):
    """`local_tile(src, tile, (_, _))` spelled as its layout: (tile rows, tile cols, row tiles, col
    tiles) with strides (row stride, 1, tile rows · row stride, tile cols); `col_tiles` is static."""

    col_tiles: int

    def check(self) -> None:
        super().check()
        self._need(len(self.tile) == 2 and isinstance(self.col_tiles, int) and self.col_tiles > 0,
                   "a (rows, cols) tile with a positive col_tiles")


VIEW_OP_CLASSES = (GlobalTileViewOp, StaticSmemLayoutOp, StaticTransposeLayoutOp, AtomMmaOp, AtomCopyOp,
                   AtomAsyncCopyOp, ThreadViewOp, CoordViewOp, RetileViewOp, RegisterFragmentOp,
                   WgmmaRegisterFragmentOp, WgmmaDescriptorFragmentOp, CopyAtomOp, MmaAtomOp)
