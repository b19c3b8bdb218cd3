"""Handlers of the CuTe emitter for fold-partitions' views (tlc.kir.ops_views): each spells the flat
layout the op carries, so NVRTC builds one `Layout<…>` per view instead of CuTe's partitioning.

`CuteEmitter` inherits `ViewEmitter`; subclassing registers these handlers on its `emit` dispatcher.
"""
from __future__ import annotations

import functools
from typing import Callable

from tlc.backend_cute.cpp import CPP_DTYPE, cpp_expr
from tlc.kir.base import Op
from tlc.kir.expr import Expr
from tlc.kir.ops_views import CoordViewOp, CopyAtomOp, MmaAtomOp, RegisterFragmentOp, RetileViewOp, ThreadViewOp

_HANDLERS: dict[type[Op], Callable] = {}


def _handles(cls: type[Op]) -> Callable[[Callable], Callable]:
    def register(fn: Callable) -> Callable:
        _HANDLERS[cls] = fn
        return fn
    return register


def _static(kind: str, value) -> str:
    if isinstance(value, tuple):
        return f"{kind}<{', '.join(_static(kind, v) for v in value)}>"
    return f"Int<{value}>"


def _basis(value) -> str:
    if isinstance(value[0], tuple):
        return f"Stride<{', '.join(_basis(v) for v in value)}>"
    axis, step = value
    return f"ScaledBasis<Int<{step}>, {axis}>"


def static_layout(shape: tuple, stride: tuple) -> str:
    return f"Layout<{_static('Shape', shape)}, {_static('Stride', stride)}>{{}}"


def _dynamic(make: str, value) -> str:
    if isinstance(value, tuple):
        return f"{make}({', '.join(_dynamic(make, v) for v in value)})"
    return f"({cpp_expr(value)})" if isinstance(value, Expr) else f"Int<{value}>{{}}"


def _is_static(value) -> bool:
    return all(_is_static(v) for v in value) if isinstance(value, tuple) else not isinstance(value, Expr)


class ViewEmitter:
    """Mixin of `CuteEmitter` (it provides `w`, `_at` and the `emit` dispatcher)."""

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        dispatcher = cls.__dict__.get("emit")
        if not isinstance(dispatcher, functools.singledispatchmethod):
            raise TypeError(f"{cls.__name__} inherits ViewEmitter but defines no singledispatchmethod `emit`")
        for op_cls, handler in _HANDLERS.items():
            dispatcher.register(op_cls, handler)

    @_handles(ThreadViewOp)
    def _thread_view(self, op: ThreadViewOp) -> None:
        self._at(op)
        src = cpp_expr(op.src)
        if op.keep == 0 and _is_static(op.layout_stride):
            layout = static_layout(op.layout_shape, op.layout_stride)
        else:  # a global tile: runtime row strides, and its own tile-index modes last
            first = len(op.layout_shape)
            kept = range(first, first + op.keep)
            shape = ", ".join([_dynamic("make_shape", s) for s in op.layout_shape] + [f"shape<{k - first + 2}>({src})"
                                                                                     for k in kept])
            stride = ", ".join([_dynamic("make_stride", d) for d in op.layout_stride] +
                               [f"stride<{k - first + 2}>({src})" for k in kept])
            layout = f"make_layout(make_shape({shape}), make_stride({stride}))"
        offset = cpp_expr(op.offset)
        if any(op.swizzle):  # the decayed slice starts at the swizzled offset
            b, m, s = op.swizzle
            offset = f"Swizzle<{b}, {m}, {s}>{{}}(int({offset}))"
        self.w.line(f"Tensor {op.name} = make_tensor({src}.data() + ({offset}), {layout});")

    @_handles(CoordViewOp)
    def _coord_view(self, op: CoordViewOp) -> None:
        self._at(op)
        layout = f"Layout<{_static('Shape', op.layout_shape)}, {_basis(op.layout_stride)}>{{}}"
        self.w.line(f"Tensor {op.name} = make_tensor(make_inttuple_iter(make_coord(int({cpp_expr(op.row)}), "
                    f"int({cpp_expr(op.col)}))), {layout});")

    @_handles(RetileViewOp)
    def _retile_view(self, op: RetileViewOp) -> None:
        self._at(op)
        self.w.line(f"Tensor {op.name} = make_tensor({cpp_expr(op.src)}.data(), "
                    f"{static_layout(op.layout_shape, op.layout_stride)});")

    @_handles(RegisterFragmentOp)
    def _register_fragment(self, op: RegisterFragmentOp) -> None:
        self._at(op)
        self.w.line(f"Tensor {op.name} = make_tensor<{CPP_DTYPE[op.dtype]}>("
                    f"{static_layout(op.layout_shape, op.layout_stride)});")

    @_handles(CopyAtomOp)
    def _copy_atom(self, op: CopyAtomOp) -> None:
        self._at(op)
        self.w.line(f"auto {op.name} = Copy_Atom<{op.atom}, {CPP_DTYPE[op.dtype]}>{{}};")

    @_handles(MmaAtomOp)
    def _mma_atom(self, op: MmaAtomOp) -> None:
        self._at(op)
        self.w.line(f"using {op.name}_t = MMA_Atom<{op.atom}>;")
        self.w.line(f"{op.name}_t {op.name};")
