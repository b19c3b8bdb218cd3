"""C++ spelling of engine layouts: a static pycute layout as a CuTe `Layout<Shape<…>, Stride<…>>`
type, and a layout of the thread index as an integer expression (the thread's offset)."""
from __future__ import annotations

from pycute import Layout, coalesce, flatten, is_tuple, prefix_product


def _tuple_type(kind: str, value) -> str:
    if is_tuple(value):
        return f"{kind}<{', '.join(_tuple_type(kind, v) for v in value)}>"
    return f"Int<{int(value)}>"


def layout_type(layout: Layout) -> str:
    """`Layout<Shape<…>, Stride<…>>` with every extent and stride static."""
    shape, stride = layout.shape, layout.stride
    if not is_tuple(shape):
        shape, stride = (shape,), (stride,)
    return f"Layout<{_tuple_type('Shape', shape)}, {_tuple_type('Stride', stride)}>"


def index_expr(layout: Layout, index: str, extent: int, scale=str) -> str:
    """`layout(index)` as C++ arithmetic on an int `index` in [0, extent): one term per mode, each
    multiplied by `scale(stride)` (text, or None to leave the mode out). As CuTe's integral
    coordinate, the last mode takes the quotient unreduced."""
    flat = coalesce(layout)
    shapes, strides = flatten(flat.shape), flatten(flat.stride)
    if not is_tuple(flat.shape):
        shapes, strides = (flat.shape,), (flat.stride,)
    terms = []
    last = max((i for i, s in enumerate(shapes) if s != 1), default=-1)
    for i, (shape, stride, below) in enumerate(zip(shapes, strides, flatten(prefix_product(tuple(shapes))))):
        factor = scale(stride) if stride != 0 and shape != 1 and below < extent else None
        if factor is None:
            continue
        part = index if below == 1 else f"{index} / {below}"
        if i != last and below * shape < extent:
            part = f"({part}) % {shape}" if below != 1 else f"{index} % {shape}"
        terms.append(part if factor == "1" else f"({part}) * {factor}")
    return " + ".join(terms) or "0"
