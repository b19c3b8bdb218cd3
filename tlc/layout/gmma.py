"""CuTe's GMMA shared layouts and descriptors in Python: the layout `tile_to_shape` gives a
`GMMA::Layout_{K,MN}_{INTER,SW32,SW64,SW128}_Atom<T>` tiled to a shape, and the static fields of the
descriptor `make_gmma_desc` builds for a wgmma operand (layout type, leading and stride byte
offsets), so `fold-partitions` can spell a shared operand's descriptors without CuTe's partition.

A descriptor is 64 bits: start address >> 4 (bits 0-13), leading byte offset >> 4 (16-29), stride
byte offset >> 4 (32-45), base offset (49-51, always 0 here) and layout type (62-63); `lo` and `hi`
below are its two 32-bit halves without the start address, which depends on the thread.
"""
from __future__ import annotations

from pycute import Layout, flatten, logical_divide

from tlc.layout.algebra import modes, upcast
from tlc.layout.kir_tensors import smem_layout_of_atom

# GMMA::LayoutType by swizzle width in bytes, and the atom's width in 16-byte units (CuTe's W)
LAYOUT_TYPE = {0: 0, 128: 1, 64: 2, 32: 3}
UNITS = {0: 1, 32: 2, 64: 4, 128: 8}


def gmma_layout(dtype_bytes: int, swizzle: int, shape: tuple[int, ...], k_major: bool
                ) -> tuple[Layout, tuple[int, int, int]]:
    """(layout, element swizzle) of CuTe's tile_to_shape of the GMMA atom: a K-major atom is 8 rows
    of one swizzle width, row-major; an MN-major one the transpose (column-major). The swizzle acts on
    byte addresses (Swizzle<B, 4, 3>); on element offsets of a 1024-byte aligned tile it is
    Swizzle<B, 4 - log2(bytes), 3>."""
    span = max(swizzle, 16) // dtype_bytes
    atom = (8, span) if k_major else (span, 8)
    layout = smem_layout_of_atom(atom, shape, row_major=k_major)
    b = {0: 0, 32: 1, 64: 2, 128: 3}[swizzle]
    return layout, ((b, 4 - (dtype_bytes.bit_length() - 1), 3) if b else (0, 0, 0))


def descriptor_fields(value_mode: Layout, k_major: bool, swizzle: int, dtype_bytes: int) -> tuple[int, int] | None:
    """(lo, hi) of make_gmma_desc for the partition whose value mode (the atom's (rows, K) tile, in
    element offsets before the swizzle) is `value_mode`, or None where it is not one of the canonical
    layouts make_gmma_desc accepts."""
    per = 16 // dtype_bytes
    ms = modes(value_mode)
    if len(ms) != 2:
        return None
    w = UNITS[swizzle]
    u = Layout(*zip(*[(m.shape, m.stride) for m in (upcast(m, per) for m in ms)]))
    if k_major:   # ((8, n), 2) : ((W, SBO), LBO)
        canon = logical_divide(u, (Layout(8, 1), Layout(2, 1)))
        s = _mode_strides(canon)
        if s is None or s[0][0] != w or (swizzle and s[1][0] != 1):
            return None
        sbo, lbo = s[0][1], s[1][0]
    else:         # ((W, n), (8, k)) : ((1, LBO), (W, SBO))
        canon = logical_divide(u, (Layout(w, 1), Layout(8, 1)))
        s = _mode_strides(canon)
        if s is None or (swizzle and s[0][0] != 1) or s[1][0] != w:
            return None
        sbo, lbo = (s[0][1], s[1][1]) if swizzle == 0 else (s[1][1], s[0][1])
    if not (0 <= sbo < 1 << 14 and 0 <= lbo < 1 << 14):
        return None
    return lbo << 16, (LAYOUT_TYPE[swizzle] << 30) | sbo


def _mode_strides(canon: Layout) -> list[tuple[int, int]] | None:
    """The (first, second) strides of each of the two modes of a logical_divide result (a mode of
    one element in its second part has stride 0 here, as CuTe reads an empty mode)."""
    out = []
    for m in modes(canon):
        inner = modes(m)
        if len(inner) != 2:
            return None
        first = flatten(inner[0].stride)
        second = flatten(inner[1].stride) if inner[1].size() > 1 else [0]
        if len(first) != 1:
            return None
        out.append((first[0], second[0]))
    return out


def descriptor_layout(rest: list[Layout], dtype_bytes: int) -> Layout:
    """make_fragment_A/B's layout: one descriptor for the atom's tile (mode 0 = (1):(0)), then the
    partition's other modes in 16-byte units (what a descriptor's start address counts)."""
    units = [upcast(m, 16 // dtype_bytes) for m in rest]
    return Layout((1, *(u.shape for u in units)), (0, *(u.stride for u in units)))
