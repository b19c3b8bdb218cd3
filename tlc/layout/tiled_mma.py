"""CuTe's TiledMMA in Python: an MMA atom repeated over a warp layout (M, N, K), with the
permutation tile the lowering gives; `thrfrg_A/B/C`, `get_layoutA/B/C_TV`, and each thread's
partition of a tile (offset as a function of the thread index + the static layout of its values).
"""
from __future__ import annotations

from dataclasses import dataclass

from pycute import Layout, complement, composition, flatten, is_tuple, make_layout, size, zipped_divide

from tlc.layout.algebra import compose_first, fragment_like, modes
from tlc.layout.atoms import MMA_ATOMS, MmaAtom
from tlc.layout.swizzle import decay

_ROLE_DIMS = {"A": (0, 2), "B": (1, 2), "C": (0, 1)}


@dataclass(frozen=True)
class TiledMma:
    atom: MmaAtom
    warps: tuple[int, int, int]
    tile: tuple[int, int, int]  # permutation tile (M, N, K): sizes only, identity orders

    @classmethod
    def of(cls, atom: str, warps: tuple[int, int, int], tile: tuple[int, int, int]) -> "TiledMma":
        return cls(MMA_ATOMS[atom], tuple(warps), tuple(tile))

    @property
    def threads(self) -> int:
        return self.atom.threads * self.warps[0] * self.warps[1] * self.warps[2]

    def thr_layout_vmnk(self) -> Layout:
        """(ThrV, ThrM, ThrN, ThrK) → thread index: the atom's 32 lanes, then the warps, M fastest."""
        w = self.warps
        t = self.atom.threads
        return Layout((t, *w), (1, t, t * w[0], t * w[0] * w[1]))

    def _atom_tv(self, role: str) -> Layout:
        return {"A": self.atom.a_tv, "B": self.atom.b_tv, "C": self.atom.c_tv}[role]

    def thrfrg(self, role: str, layout: Layout) -> Layout:
        """((ThrV, (Thr0, Thr1)), (FrgV, (Rest0, Rest1, ...))) over `layout`, a (rows, cols, ...) tensor."""
        d0, d1 = _ROLE_DIMS[role]
        t_tensor = _divide_modes(layout, (self.tile[d0], self.tile[d1]))
        atom_tile = (self.atom.shape_mnk[d0], self.atom.shape_mnk[d1])
        c_tensor = zipped_divide(t_tensor, (Layout(atom_tile[0]), Layout(atom_tile[1])))
        tv_tensor = compose_first(c_tensor, self._atom_tv(role))
        vmnk = self.thr_layout_vmnk()
        w0, w1 = (vmnk.shape[1 + d] for d in ((0, 2) if role == "A" else (1, 2) if role == "B" else (0, 1)))
        # zipped_divide(tv_tensor, (_, (w0, w1))): the rest mode splits by the warps
        rest = modes(tv_tensor)[1]
        split = zipped_divide(rest, (Layout(w0), Layout(w1)))
        thr_v, frg_v = modes(modes(tv_tensor)[0])
        return make_layout(make_layout(thr_v, modes(split)[0]), make_layout(frg_v, modes(split)[1]))

    def _thread_to_mode0(self, role: str) -> Layout:
        """thread index → the linear index of thrfrg's mode 0 (ThrV, (Thr0, Thr1)); other warps broadcast."""
        t, (wm, wn, wk) = self.atom.threads, self.warps
        strides = {"A": (1, t, 0, t * wm), "B": (1, 0, t, t * wn), "C": (1, t, t * wm, 0)}[role]
        return Layout((t, wm, wn, wk), strides)

    def layout_tv(self, role: str) -> Layout:
        """CuTe's get_layoutX_TV: (thread index, value) → m + M·k of the (tile) operand."""
        d0, d1 = _ROLE_DIMS[role]
        ref = Layout((self.tile[d0], self.tile[d1]))
        frg = self.thrfrg(role, ref)
        thr = composition(modes(frg)[0], self._thread_to_mode0(role))
        return make_layout(thr, modes(frg)[1])

    def partition(self, role: str, layout: Layout) -> tuple[Layout, Layout]:
        """A thread's share of a tensor: (thread → offset, values (FrgV, Rest0, Rest1, ...) → offset)."""
        frg = self.thrfrg(role, layout)
        thr = composition(modes(frg)[0], self._thread_to_mode0(role))
        frg_v, rest = modes(modes(frg)[1])
        return thr, make_layout([frg_v, *modes(rest)])

    def fragment(self, role: str, layout: Layout, sw: tuple[int, int, int] = (0, 0, 0)) -> Layout | None:
        """The register layout CuTe gives `partition_fragment_X` of such a tensor (under swizzle `sw`:
        ordered by the decayed strides CuTe sees), or None where CuTe's slice keeps the swizzle."""
        if role == "C":
            return Layout(tuple(m.shape for m in modes(self.partition("C", layout)[1])))
        thr, values = self.partition(role, layout)
        if not any(sw):
            return fragment_like(values)
        found = decay(thr, values, sw)
        if found is None:
            return None
        first = len(flatten(modes(found.values)[0].shape)) if is_tuple(modes(found.values)[0].shape) else 1
        return fragment_like(found.values, frozenset(k - first for k in found.dynamic if k >= first))


def _divide_modes(layout: Layout, tile: tuple[int, int]) -> Layout:
    """logical_divide by an identity tile on the first two modes (CuTe's permutation step)."""
    ms = modes(layout)
    out = [composition(ms[i], make_layout(Layout(tile[i]), complement(Layout(tile[i]), size(ms[i]))))
           for i in range(2)]
    return make_layout([*out, *ms[2:]])
