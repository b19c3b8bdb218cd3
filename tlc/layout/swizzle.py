"""CuTe's decay of a sliced swizzled layout, in Python. Slicing `Swizzle∘L` at a thread leaves
`swizzle(offset + V(i))`; when the values V never move a Y bit and its paired Z bit together,
CuTe rewrites it as a plain layout: base `swizzle(offset)`, and per Y/Z bit of V a stride whose
sign depends on the thread's partner bit (its make_swizzle_strides). tlc emits the same, so
fragment orders and address arithmetic stay CuTe's.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pycute import Layout, flatten, is_tuple

from tlc.layout.algebra import map_leaves

Swz = tuple[int, int, int]


def swizzle(x: int, sw: Swz) -> int:
    b, m, s = sw
    return x ^ ((x & (((1 << b) - 1) << (m + s))) >> s) if b else x


def swizzle_bits(sw: Swz) -> tuple[list[int], list[int]]:
    b, m, s = sw
    return [m + j for j in range(b)], [m + s + j for j in range(b)]


def _split_leaf(shape: int, stride: int, special: set[int]):
    """A leaf over one bit per mode where it crosses the swizzle's Z/Y bits, else itself."""
    if shape == 1 or stride == 0 or stride & (stride - 1) or shape & (shape - 1):
        return shape, stride
    lo, width = stride.bit_length() - 1, shape.bit_length() - 1
    if not any(lo + k in special for k in range(width)):
        return shape, stride
    parts, run = [], 0  # consecutive ordinary bits stay one mode, each special bit its own
    for k in range(width + 1):
        if k == width or lo + k in special:
            if run:
                parts.append((1 << run, 1 << (lo + k - run)))
                run = 0
            if k < width:
                parts.append((2, 1 << (lo + k)))
        else:
            run += 1
    if len(parts) == 1:
        return parts[0]
    return tuple(p[0] for p in parts), tuple(p[1] for p in parts)


def split_bits(layout: Layout, sw: Swz) -> Layout:
    z, y = swizzle_bits(sw)
    special = set(z) | set(y)
    return map_leaves(layout, lambda shape, stride: _split_leaf(shape, stride, special))


@dataclass(frozen=True)
class Decayed:
    """values: V split per swizzle bit; dynamic[k] = ("z"|"y", j) for flat leaf k whose stride
    depends on the thread's offset (its Y bit j for a Z leaf, its Z bit j for a Y leaf)."""

    values: Layout
    dynamic: dict[int, tuple[str, int]]
    sw: Swz

    def stride_terms(self) -> list[tuple[int, int, int | None]]:
        """Per flat leaf (base, step, bit): its stride is base − step · (the thread offset's bit `bit`),
        or base where bit is None. A Z leaf flips sign with its Y partner bit (d − 2d·y); a Y leaf adds
        or subtracts its Z partner as the thread's Z bit is clear or set (d + z − 2z·zbit)."""
        z, y = swizzle_bits(self.sw)
        out: list[tuple[int, int, int | None]] = []
        for k, d in enumerate(flatten(self.values.stride)):
            kind = self.dynamic.get(k)
            if kind is None:
                out.append((d, 0, None))
            elif kind[0] == "z":
                out.append((d, 2 * d, y[kind[1]]))
            else:
                zb = 1 << z[kind[1]]
                out.append((d + zb, 2 * zb, z[kind[1]]))
        return out

    def strides_at(self, offset: int) -> list[int]:
        return [base if bit is None else base - step * (offset >> bit & 1) for base, step, bit in self.stride_terms()]


def decay(thr: Layout, values: Layout, sw: Swz) -> Decayed | None:
    """The decayed form of `swizzle(thr(t) + values(i))`, or None where CuTe keeps the swizzle
    (values move a Y bit and its Z bit) or the decayed form would address differently."""
    z, y = swizzle_bits(sw)
    split = split_bits(values, sw)
    dynamic: dict[int, tuple[str, int]] = {}
    active = set()
    for k, (s, d) in enumerate(zip(flatten(split.shape), flatten(split.stride))):
        if s == 2 and d > 0 and d & (d - 1) == 0:
            bit = d.bit_length() - 1
            if bit in z:
                dynamic[k] = ("z", z.index(bit))
                active.add(("z", z.index(bit)))
            elif bit in y:
                dynamic[k] = ("y", y.index(bit))
                active.add(("y", y.index(bit)))
    if any(("z", j) in active and ("y", j) in active for j in range(sw[0])):
        return None
    result = Decayed(split, dynamic, sw)
    # Check every thread and value: the decayed form must address exactly what the swizzle does.
    shapes = flatten(split.shape) if is_tuple(split.shape) else (split.shape,)
    digits = _digits_table(split.size(), shapes)
    plain = digits @ np.array(flatten(split.stride) if is_tuple(split.stride) else (split.stride,), dtype=np.int64)
    thr_shapes = flatten(thr.shape) if is_tuple(thr.shape) else (thr.shape,)
    thr_strides = flatten(thr.stride) if is_tuple(thr.stride) else (thr.stride,)
    offsets = _digits_table(thr.size(), thr_shapes) @ np.array(thr_strides, dtype=np.int64)
    for off in sorted(set(offsets.tolist())):
        got = swizzle(off, sw) + digits @ np.array(result.strides_at(off), dtype=np.int64)
        if not np.array_equal(got, _swizzle_array(off + plain, sw)):
            return None
    return result


def _swizzle_array(x: np.ndarray, sw: Swz) -> np.ndarray:
    b, m, s = sw
    return x ^ ((x & (((1 << b) - 1) << (m + s))) >> s) if b else x


def _digits_table(n: int, shapes) -> np.ndarray:
    """Row i: the column-major coordinates of index i over `shapes` (the last one unreduced)."""
    i = np.arange(n, dtype=np.int64)
    cols = []
    for k, s in enumerate(shapes):
        cols.append(i % s if k < len(shapes) - 1 else i)
        i = i // s
    return np.stack(cols, axis=1) if cols else np.zeros((n, 0), dtype=np.int64)


def static_decay(layout: Layout, sw: Swz) -> Layout | None:
    """A swizzled layout sliced at a constant (offset 0) as CuTe decays it (strides fixed), or
    None where CuTe keeps the swizzle."""
    found = decay(Layout(1, 0), layout, sw)
    if found is None:
        return None
    strides = found.strides_at(0)
    it = iter(strides)

    def build(shape):
        return tuple(build(s) for s in shape) if is_tuple(shape) else next(it)
    shape = found.values.shape
    return Layout(shape, build(shape) if is_tuple(shape) else strides[0])
