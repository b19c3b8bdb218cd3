"""C++ spelling of kernel-IR expressions, dtypes and static shapes."""
from __future__ import annotations

import math

from tlc.kir.expr import Expr, format_expr

CPP_DTYPE = {"bf16": "cute::bfloat16_t", "fp16": "cute::half_t", "fp32": "float"}
CPP_SCALAR = {"i32": "int", "i64": "int64_t", "f32": "float", "bool": "bool"}
CPP_PARAM = {"ptr<bf16>": "cute::bfloat16_t*", "ptr<fp16>": "cute::half_t*", "ptr<f32>": "float*", "ptr<i32>": "int*",
             "i32": "int", "i64": "int64_t", "f32": "float"}
_FUNCS = {"min": "tlc::min", "max": "tlc::max", "ceil_div": "tlc::ceil_div", "cdiv": "tlc::ceil_div",
          "floor_div": "tlc::floor_div", "floor_mod": "tlc::floor_mod", "exp2": "exp2f", "exp": "expf",
          "sqrt": "sqrtf", "log": "logf", "tanh": "tanhf", "abs": "fabsf", "isnan": "isnan"}


def cpp_const(v: int | float | bool) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if math.isinf(v):
        return "INFINITY" if v > 0 else "-INFINITY"
    text = repr(float(v))
    return f"{text}f"


def _cpp_call(fn: str, args: list[str]) -> str:
    if fn == "isnan":
        return f"({args[0]} != {args[0]})"
    if fn == "select":
        return f"({args[0]} ? {args[1]} : {args[2]})"
    if fn == "load":   # a tensor Input's element, 0 where an index is outside its dimension
        return f"(({args[2]}) ? {args[0]}[{args[1]}] : 0)"
    if fn in ("min", "max") and len(args) > 2:  # the language's min and max take any number; C++'s two
        return _cpp_call(fn, [_cpp_call(fn, args[:-1]), args[-1]])
    return f"{_FUNCS[fn]}({', '.join(args)})"


def cpp_expr(e: Expr, parent_prec: int = 0) -> str:
    return format_expr(e, cpp_const, _cpp_call, lambda base, idx: f"{base}({', '.join(idx)})", parent_prec,
                       wrap_negative=True)


def static_shape(dims: tuple[int, ...]) -> str:
    return f"Shape<{', '.join(f'Int<{d}>' for d in dims)}>"


def static_stride(dims: tuple[int, ...]) -> str:
    return f"Stride<{', '.join(f'Int<{d}>' for d in dims)}>"


def predicate_limits(row_limit: Expr, col_limit: Expr | None, row_first: Expr | None) -> list[str]:
    """The constants a predicated copy's row (and column) tests read."""
    lines = [f"const int row_limit_ = {cpp_expr(row_limit)};"]
    if col_limit is not None:
        lines.append(f"const int col_limit_ = {cpp_expr(col_limit)};")
    if row_first is not None:
        lines.append(f"const int row_first_ = {cpp_expr(row_first)};")
    return lines


def row_test(coord: str, row_first: Expr | None) -> str:
    """A predicated copy's row test on `coord` (a coordinate tensor element): below `row_limit_`,
    and at or past `row_first_` when the tile starts before the tensor's first row."""
    test = f"get<0>({coord}) < row_limit_"
    return test if row_first is None else f"{test} && get<0>({coord}) >= row_first_"


def shifted_data(op) -> str:
    """A GlobalTileOp's source data, moved back `row_shift` rows when its tiles are counted from the end."""
    if op.row_shift is None:
        return f"{op.src}.data()"
    return f"({op.src}.data() + -({cpp_expr(op.row_shift)}) * stride<0>({op.src}))"   # CuTe's pointers have no `-`


def shifted(op) -> str:
    """A GlobalTileOp's source tensor, starting `row_shift` rows before the tensor's first row."""
    return op.src if op.row_shift is None else f"make_tensor({shifted_data(op)}, {op.src}.layout())"
