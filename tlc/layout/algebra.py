"""Layout algebra missing from pycute, written to CuTe's definitions: by-mode composition,
`zip`, `with_shape`, `upcast`, compact orders and fragment layouts. Used by the thread-value
engine (`tlc.layout.tiled_mma`, `tlc.layout.tiled_copy`); CuTe itself checks it in tests/nvrtc.
"""
from __future__ import annotations

import math

from pycute import Layout, coalesce, composition, flatten, is_tuple, make_layout, product


def modes(layout: Layout) -> list[Layout]:
    """The top-level modes of `layout` (a rank-1 layout is its own only mode)."""
    return [layout[i] for i in range(len(layout))] if is_tuple(layout.shape) else [layout]


def compose_first(layout: Layout, inner: Layout) -> Layout:
    """CuTe's `layout.compose(inner, _)`: mode 0 composed with `inner`, the other modes kept."""
    rest = modes(layout)[1:]
    return make_layout([composition(modes(layout)[0], inner), *rest])


def zip2(layout: Layout) -> Layout:
    """((a, b), (c, d)) → ((a, c), (b, d)), CuTe's `zip` of a rank-2 layout of rank-2 modes."""
    (a, b), (c, d) = (modes(m) for m in modes(layout))
    return make_layout(make_layout(a, c), make_layout(b, d))


def with_shape(layout: Layout, shape) -> Layout:
    return composition(layout, Layout(shape))


def _upcast_leaf(shape: int, stride: int, n: int) -> tuple[int, int]:
    if stride == 0:
        return shape, 0
    a = abs(stride)
    assert a % n == 0 or n % a == 0, f"upcast<{n}> of stride {stride}"
    per = -(-n // a)
    sign = 1 if stride > 0 else -1
    return -(-shape // per), sign * -(-a // n)


def map_leaves(layout: Layout, leaf) -> Layout:
    """`layout` with each (shape, stride) leaf replaced by `leaf(shape, stride)` (a new pair, which
    may itself be nested), the nesting kept."""
    def walk(shape, stride):
        if is_tuple(shape):
            pairs = [walk(s, d) for s, d in zip(shape, stride)]
            return tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)
        return leaf(shape, stride)
    return Layout(*walk(layout.shape, layout.stride))


def upcast(layout: Layout, n: int) -> Layout:
    """CuTe's `upcast<N>`: N values become one (strides divided by N, stride-1 shapes shrink)."""
    return map_leaves(layout, lambda shape, stride: _upcast_leaf(shape, stride, n))


def _leaf_pairs(shape, order):
    """(sub-shape, order leaf) pairs: `order` is weakly congruent to `shape`."""
    if is_tuple(order):
        return [p for s, o in zip(shape, order) for p in _leaf_pairs(s, o)]
    return [(shape, order)]


def _col_major(shape, start: int):
    if is_tuple(shape):
        strides, cur = [], start
        for s in shape:
            st, cur = _col_major(s, cur)
            strides.append(st)
        return tuple(strides), cur
    return start, start * shape


def compact_order(shape, order):
    """CuTe's `compact_order`: compact strides whose ranks follow `order` (equal orders share a start)."""
    pairs = _leaf_pairs(shape, order)

    def build(s, o):
        if is_tuple(o):
            return tuple(build(si, oi) for si, oi in zip(s, o))
        start = math.prod(product(ps) for ps, po in pairs if po < o)
        return _col_major(s, start)[0]
    return build(shape, order)


def fragment_like(layout: Layout, dynamic: frozenset[int] = frozenset()) -> Layout:
    """CuTe's `make_fragment_like` of a static-shaped layout: mode 0 compact column-major (zero
    strides kept), the other modes compact in the order of their strides, laid out after mode 0.
    `dynamic`: flat positions (among the other modes' leaves) of runtime strides, which CuTe
    orders after every static one, by position."""
    ms = modes(layout)
    if len(ms) == 1:
        return Layout(layout.shape)
    first = ms[0]
    flat_s, flat_d = flatten(first.shape), flatten(first.stride)
    if not is_tuple(first.shape):
        flat_s, flat_d = (first.shape,), (first.stride,)
    strides0, cur = [], 1
    for s, d in zip(flat_s, flat_d):  # compact over the non-zero modes only
        strides0.append(cur if d != 0 else 0)
        cur *= s if d != 0 else 1
    stride0 = _unflatten(tuple(strides0), first.shape)
    rest_shape = tuple(m.shape for m in ms[1:])
    rest_order = tuple(m.stride for m in ms[1:])
    if dynamic:
        flat = flatten(rest_order)
        top = max((o for k, o in enumerate(flat) if k not in dynamic), default=0)
        rest_order = _unflatten(tuple(top + 1 + k if k in dynamic else o for k, o in enumerate(flat)), rest_order)
    rest_stride = compact_order(rest_shape, rest_order)
    return Layout((first.shape, *rest_shape), (stride0, *_scale(rest_stride, cur)))


def _scale(stride, k: int):
    return tuple(_scale(s, k) for s in stride) if is_tuple(stride) else stride * k


def _unflatten(flat: tuple, profile):
    it = iter(flat)

    def build(p):
        return tuple(build(x) for x in p) if is_tuple(p) else next(it)
    return build(profile)


def same_function(a: Layout, b: Layout) -> bool:
    """Equal sizes and equal values at every linear index (the layouts' structure may differ)."""
    return a.size() == b.size() and all(a(i) == b(i) for i in range(a.size()))


def top_sizes(layout: Layout) -> tuple[int, ...]:
    return tuple(m.size() for m in modes(layout))


def right_inverse(layout: Layout) -> Layout:
    """CuTe's right_inverse: follow strides 1, s0, s0·s1, … through the coalesced modes; stride-0
    (broadcast) modes are skipped, where pycute's version stops at them."""
    flat = coalesce(layout)
    shapes = flatten(flat.shape) if is_tuple(flat.shape) else (flat.shape,)
    strides = flatten(flat.stride) if is_tuple(flat.stride) else (flat.stride,)
    rstrides, acc = [], 1
    for s in shapes:
        rstrides.append(acc)
        acc *= s
    out_shape, out_stride, current = [], [], 1
    while True:
        nxt = next((i for i, d in enumerate(strides) if abs(d) == current and shapes[i] != 1), None)
        if nxt is None:
            break
        out_shape.append(shapes[nxt])
        out_stride.append(rstrides[nxt])
        current *= shapes[nxt]
    if not out_shape:
        return Layout(1, 0)
    return coalesce(Layout(tuple(out_shape), tuple(out_stride)))
