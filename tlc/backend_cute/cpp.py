"""C++ spelling of kernel-IR expressions, dtypes and static shapes."""
from __future__ import annotations

import math

from tlc.diagnostics import fail
from tlc.kir.expr import BINOPS, BinOp, Call, Const, Expr, Index, Neg, Var

CPP_DTYPE = {"bf16": "cute::bfloat16_t", "fp16": "cute::half_t", "fp32": "float"}
CPP_SCALAR = {"i32": "int", "i64": "int64_t", "f32": "float", "bool": "bool"}
CPP_PARAM = {"ptr<bf16>": "cute::bfloat16_t*", "ptr<fp16>": "cute::half_t*", "ptr<f32>": "float*",
             "i32": "int", "i64": "int64_t", "f32": "float"}
_FUNCS = {"min": "min", "max": "max", "ceil_div": "tlc::ceil_div", "floor_div": "tlc::floor_div",
          "exp2": "exp2f", "log": "logf", "tanh": "tanhf", "abs": "fabsf", "isnan": "isnan"}


def cpp_const(v: int | float | bool) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if math.isinf(v):
        return "INFINITY" if v > 0 else "-INFINITY"
    text = repr(float(v))
    return f"{text}f"


def cpp_expr(e: Expr, parent_prec: int = 0) -> str:
    if isinstance(e, Var):
        return e.name
    if isinstance(e, Const):
        text = cpp_const(e.value)
        return f"({text})" if text.startswith("-") and parent_prec else text
    if isinstance(e, Neg):
        return f"-{cpp_expr(e.arg, 7)}"
    if isinstance(e, Call):
        args = [cpp_expr(a) for a in e.args]
        if e.fn == "isnan":
            return f"({args[0]} != {args[0]})"
        if e.fn == "select":
            return f"({args[0]} ? {args[1]} : {args[2]})"
        return f"{_FUNCS[e.fn]}({', '.join(args)})"
    if isinstance(e, Index):
        return f"{e.base.name}({', '.join(cpp_expr(a) for a in e.indices)})"
    if isinstance(e, BinOp):
        prec = BINOPS[e.op]
        text = f"{cpp_expr(e.lhs, prec)} {e.op} {cpp_expr(e.rhs, prec + 1)}"
        return f"({text})" if prec < parent_prec else text
    raise fail(f"emitter: not a kernel-IR expression: {e!r}")


def static_shape(dims: tuple[int, ...]) -> str:
    return f"Shape<{', '.join(f'Int<{d}>' for d in dims)}>"


def static_stride(dims: tuple[int, ...]) -> str:
    return f"Stride<{', '.join(f'Int<{d}>' for d in dims)}>"
