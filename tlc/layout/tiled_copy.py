"""CuTe's TiledCopy in Python: a copy atom tiled by thread and value layouts (`make_tiled_copy`)
or matched to a TiledMMA operand (`make_tiled_copy_A/B/C`); `tidfrg_S/D`, the TV layouts, each
thread's partition of a tile, and `retile` of a register fragment to the copy's value order.
"""
from __future__ import annotations

from dataclasses import dataclass

from pycute import Layout, coalesce, complement, composition, logical_product, make_layout, product, zipped_divide

from tlc.layout.algebra import compose_first, modes, right_inverse, upcast, with_shape, zip2
from tlc.layout.atoms import CopyAtom
from tlc.layout.tiled_mma import TiledMma


@dataclass(frozen=True)
class TiledCopy:
    atom: CopyAtom
    layout_tv: Layout          # (thread index, value) → m + M·n of the tiler
    tiler: tuple[int, int]     # (M, N)

    @classmethod
    def of_threads(cls, atom: CopyAtom, threads: tuple[int, int], values: tuple[int, int]) -> "TiledCopy":
        """make_tiled_copy(atom, row-major thread layout, column-major value layout)."""
        thr = Layout(threads, (threads[1], 1))
        val = Layout(values)
        layout_mn = _raked_product(thr, val)
        layout_tv = with_shape(right_inverse(layout_mn), (thr.size(), val.size()))
        return cls(atom, layout_tv, tuple(product(s) for s in layout_mn.shape))

    @classmethod
    def of_mma(cls, atom: CopyAtom, mma: TiledMma, role: str) -> "TiledCopy":
        """make_tiled_copy_A/B/C: the atom over the MMA's operand TV layout and tile."""
        dims = {"A": (0, 2), "B": (1, 2), "C": (0, 1)}[role]
        return cls(atom, mma.layout_tv(role), (mma.tile[dims[0]], mma.tile[dims[1]]))

    @property
    def threads(self) -> int:
        return self.layout_tv[0].size()

    def _tile2thrfrg(self, tensor: Layout, ref2trg: Layout) -> Layout:
        """(thread, values, (Rest...)) of a zipped ((TileM, TileN), (Rest...)) tensor."""
        atom_tv = zipped_divide(self.layout_tv, (Layout(self.atom.threads), Layout(self.atom.values)))
        trg_tv = compose_first(atom_tv, ref2trg)
        thrval2mn = coalesce(zip2(trg_tv), (1, (1, 1)))
        tv = compose_first(tensor, thrval2mn)
        (thr, val), rest = modes(modes(tv)[0]), modes(tv)[1]
        return make_layout(thr, val, rest)

    def _ref2trg(self, side: str) -> Layout:
        return composition(right_inverse(self.atom.ref), self.atom.src if side == "S" else self.atom.dst)

    def tidfrg(self, side: str, layout: Layout) -> Layout:
        tiler = (Layout(self.tiler[0]), Layout(self.tiler[1]))
        return self._tile2thrfrg(zipped_divide(layout, tiler), self._ref2trg(side))

    def layout_side_tv(self, side: str) -> Layout:
        """CuTe's get_layoutS_TV / get_layoutD_TV: (thread, value) → m + M·n."""
        full = self._tile2thrfrg(Layout((self.tiler, 1)), self._ref2trg(side))
        return make_layout(full[0], full[1])

    def partition(self, side: str, layout: Layout) -> tuple[Layout, Layout]:
        """A thread's share: (thread → offset, (values, Rest0, Rest1, ...) → offset)."""
        full = self.tidfrg(side, layout)
        return full[0], make_layout([full[1], *modes(full[2])])

    def retile(self, layout: Layout) -> Layout:
        """retile_S/D: a (V, Rest...) register fragment regrouped by the copy's value order."""
        ms = modes(layout)
        v = ms[0].size()
        nthr = self.threads
        frg_mn = upcast(with_shape(right_inverse(self.layout_tv), self.tiler), nthr * v)
        frg_v = zipped_divide(logical_product(Layout(v), right_inverse(frg_mn)), Layout(self.atom.values))
        tile = (v, *(product(s) for s in frg_mn.shape)) if isinstance(frg_mn.shape, tuple) else (v, frg_mn.shape)
        t = zipped_divide(layout, tuple(Layout(x) for x in tile))
        vt = compose_first(t, frg_v)
        return make_layout([modes(vt)[0], *modes(modes(vt)[1])[1:]])


def _raked_product(a: Layout, b: Layout) -> Layout:
    """CuTe's raked_product of rank-2 layouts: ((b'0, a0), (b'1, a1)), b' = b laid after a."""
    rest = composition(complement(a, a.size() * b.cosize()), b)
    return make_layout(make_layout(rest[0], a[0]), make_layout(rest[1], a[1]))
