"""Evaluate kernel-IR scalar expressions on the host (grid formulas, tests)."""
from __future__ import annotations

import math
from typing import Mapping

from tlc.diagnostics import fail
from tlc.kir.expr import BinOp, Call, Const, Expr, Neg, Var


def _floor_div(a: int, b: int) -> int:
    return a // b


def _trunc_div(a, b):
    if isinstance(a, int) and isinstance(b, int):
        q = abs(a) // abs(b)
        return q if (a >= 0) == (b >= 0) else -q
    return a / b


_FUNCS = {"min": min, "max": max, "ceil_div": lambda a, b: -((-a) // b), "floor_div": _floor_div,
          "exp2": lambda x: 2.0 ** x, "exp": math.exp, "sqrt": math.sqrt, "log": math.log, "tanh": math.tanh, "abs": abs, "isnan": math.isnan,
          "select": lambda c, a, b: a if c else b}
_BIN = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "/": _trunc_div,
        "%": lambda a, b: int(math.fmod(a, b)), "<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
        ">": lambda a, b: a > b, ">=": lambda a, b: a >= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
        "&&": lambda a, b: a and b, "||": lambda a, b: a or b}


def evaluate(e: Expr, env: Mapping[str, int | float]) -> int | float:
    """C semantics for integers (truncating `/`, `%`)."""
    if isinstance(e, Const):
        return e.value
    if isinstance(e, Var):
        if e.name not in env:
            raise fail(f"cannot evaluate {e.name!r}: not a known runtime value")
        return env[e.name]
    if isinstance(e, Neg):
        return -evaluate(e.arg, env)
    if isinstance(e, BinOp):
        return _BIN[e.op](evaluate(e.lhs, env), evaluate(e.rhs, env))
    if isinstance(e, Call):
        return _FUNCS[e.fn](*(evaluate(a, env) for a in e.args))
    raise fail(f"cannot evaluate {e!r} on the host")
