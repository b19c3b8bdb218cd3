"""Engine layouts as the fields of fold-partitions' view ops (tlc/kir/ops_views.py): thread offsets
as expressions of the thread index, global strides in the runtime row stride, the decayed
swizzle's thread-dependent strides, coordinate steps as (axis, step) pairs, and the loop extents
of a copy between views."""
from __future__ import annotations

import math

from pycute import Layout, flatten, is_tuple

from tlc.kir.expr import Expr, Index, Var, parse_expr, print_expr
from tlc.layout.cpp import index_expr
from tlc.layout.kir_tensors import ROW
from tlc.layout.swizzle import Decayed


def nested(value) -> tuple:
    return value if is_tuple(value) else (value,)


def unflatten(flat: list, shape):
    it = iter(flat)

    def build(s):
        return tuple(build(x) for x in s) if is_tuple(s) else next(it)
    return build(shape)


def map_strides(stride, fn):
    return tuple(map_strides(d, fn) for d in stride) if is_tuple(stride) else fn(stride)


def _rows_of(d: int) -> tuple[int, int]:
    rows, rest = divmod(d, ROW)
    assert rows == 0 or rest == 0, f"stride {d} mixes rows and columns of a global tile"
    return rows, rest


def offset_expr(thr: Layout, index: str, row_stride: Expr | None) -> Expr:
    """thr(index) where a global tile's ROW stands for `row_stride`."""
    rs = f"({print_expr(row_stride)})" if row_stride is not None else ""

    def scale(d: int) -> str:
        rows, rest = _rows_of(d)
        return str(rest) if rows == 0 else (rs if rows == 1 else f"{rows} * {rs}")
    return parse_expr(index_expr(thr, index, thr.size(), scale))


def global_strides(values: Layout, row_stride: Expr | None) -> tuple:
    def value(d: int):
        rows, rest = _rows_of(d)
        if rows == 0:
            return rest
        return row_stride if rows == 1 else parse_expr(f"{rows} * ({print_expr(row_stride)})")
    return nested(map_strides(values.stride, value))


def swizzled_strides(found: Decayed, offset: Expr, select: bool = False) -> tuple:
    """The decayed slice's strides (Decayed.stride_terms) as expressions of the thread's offset:
    `base − step · bit`, or with `select` as CuTe spells them, one of two constants on the bit."""
    off = print_expr(offset)

    def term(base: int, step: int, bit: int) -> Expr:
        if select:
            return parse_expr(f"select(({off}) / {1 << bit} % 2 == 0, {base}, {base - step})")
        return parse_expr(f"{base} - {step} * (({off}) / {1 << bit} % 2)")
    flat = [base if bit is None else term(base, step, bit) for base, step, bit in found.stride_terms()]
    return nested(unflatten(flat, found.values.shape))


def _splits(layout: Layout, rows: int) -> bool:
    """Every mode moves along rows only (within a column) or along whole columns."""
    return all(d % rows == 0 or (s - 1) * d < rows for s, d in zip(flatten(layout.shape), flatten(layout.stride)))


def coord_fields(thr: Layout, values: Layout, rows: int, index: str) -> tuple[Expr, Expr, tuple] | None:
    """(first row, first column, (axis, step) strides) of a thread's share of a (rows, cols)
    coordinate tile, or None where a step would cross from rows into columns."""
    if not _splits(values, rows) or not _splits(thr, rows):
        return None
    row = index_expr(thr, index, thr.size(), lambda d: str(d) if d < rows else None)
    col = index_expr(thr, index, thr.size(), lambda d: str(d // rows) if d >= rows else None)
    basis = map_strides(values.stride, lambda d: (0, d) if d < rows else (1, d // rows))
    return parse_expr(row), parse_expr(col), nested(basis)


def _leaves(shape, stride):
    if is_tuple(shape):
        for s, d in zip(shape, stride):
            yield from _leaves(s, d)
    else:
        yield shape, stride


def copy_rest(e: Expr, views: dict, dst: bool) -> tuple[int, ...] | None:
    """The static extents of a copy operand's modes after mode 0, once its `_`-indices are applied
    (`t`, `t[_, _, kb]`, `t[_, _, _, n, 0]`), or None where one is dynamic or, for a destination,
    a mode broadcasts (stride 0: cute::copy would write it once, a loop would repeat it)."""
    base, indices = (e, None) if isinstance(e, Var) else (e.base, e.indices) if isinstance(e, Index) else (None, None)
    view = views.get(base.name) if base is not None else None
    if view is None:
        return None
    modes = [(s, d) for s, d in zip(view.layout_shape, view.layout_stride)] + [None] * getattr(view, "keep", 0)
    if indices is not None:
        if len(indices) != len(modes):
            return None
        modes = [m for m, i in zip(modes, indices) if isinstance(i, Var) and i.name == "_"]
    rest = modes[1:]
    if not modes or any(m is None for m in rest):
        return None
    if dst and any(s > 1 and isinstance(d, int) and d == 0 for m in rest for s, d in _leaves(*m)):
        return None
    return tuple(math.prod(s for s, _ in _leaves(*m)) for m in rest)
