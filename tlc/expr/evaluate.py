"""Evaluate an expression on the host under the rules of one level of the pipeline.

The levels differ only in what `/` and `%` do to two integers: the TL interpreter floors (and
rounds a loop bound's trip count up), the kernel's C++ truncates. Everything else is shared,
including the functions `floor_div` and `floor_mod`, which floor at every level: they are how the
kernel IR spells TL's `/` and `%`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping

from tlc.expr.nodes import BinOp, Call, Const, Expr, Index, Neg, Var, call_problem

Number = int | float | bool


class ExprError(Exception):
    """An expression could not be evaluated (unbound name, division by zero, a slice)."""


def _floor_div(a: int, b: int) -> int:
    return a // b


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _trunc_mod(a: int, b: int) -> int:
    return a - b * _trunc_div(a, b)


@dataclass(frozen=True)
class Rules:
    """What `/` and `%` do when both operands are integers (floats always divide exactly)."""

    name: str
    int_div: Callable[[int, int], int]
    int_mod: Callable[[int, int], int]


TL = Rules("tl", _floor_div, lambda a, b: a % b)            # the TL interpreter
TL_BOUND = Rules("tl-bound", _ceil_div, lambda a, b: a % b)  # a TL loop bound: a partial trip counts
C = Rules("c", _trunc_div, _trunc_mod)                       # the kernel's C++


def _both_int(a: Number, b: Number) -> bool:
    return isinstance(a, int) and isinstance(b, int)


def _divide(a: Number, b: Number, rules: Rules) -> Number:
    return rules.int_div(a, b) if _both_int(a, b) else a / b


def _modulo(a: Number, b: Number, rules: Rules) -> Number:
    return rules.int_mod(a, b) if _both_int(a, b) else math.fmod(a, b) if rules is C else a % b


_ARITH: dict[str, Callable[[Number, Number], Number]] = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
    "<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b, "&&": lambda a, b: bool(a and b),
    "||": lambda a, b: bool(a or b)}


def _ceil_div_checked(a: Number, b: Number) -> Number:
    if b == 0:
        raise ExprError("cdiv by zero")
    return -(-a // b)


def _floor_div_checked(a: Number, b: Number) -> Number:
    if b == 0:
        raise ExprError("division by zero")
    return a // b


def _floor_mod_checked(a: Number, b: Number) -> Number:
    if b == 0:
        raise ExprError("floor_mod by zero")
    return a % b  # Python's `%` floors: the result has the divisor's sign


def _extremum(pick: Callable[..., Number]) -> Callable[..., Number]:
    """min/max with C++'s common type: one float argument makes the result a float (Python's min(3, 3.0)
    would return the int 3, and a `/` on it would then round where the kernel divides exactly)."""
    def call(*args: Number) -> Number:
        value = pick(args)
        return float(value) if any(isinstance(a, float) for a in args) else value
    return call


_FUNCS: dict[str, Callable[..., Number]] = {
    "cdiv": _ceil_div_checked, "ceil_div": _ceil_div_checked, "floor_div": _floor_div_checked,
    "floor_mod": _floor_mod_checked, "min": _extremum(min), "max": _extremum(max),
    "select": lambda c, a, b: a if c else b,
    "exp2": lambda x: 2.0 ** x, "exp": math.exp, "sqrt": math.sqrt, "log": math.log, "tanh": math.tanh,
    "abs": abs, "isnan": math.isnan, "load": lambda ptr, at, inside: _load(ptr, at, inside)}


def _load(ptr: object, at: int, inside: bool) -> Number:
    """The kernel IR's `load(p.x_ptr, i, inside)`: element i of the tensor bound to the pointer, 0 outside."""
    floating = bool(getattr(ptr, "is_floating_point", lambda: False)())
    if not inside:
        return 0.0 if floating else 0
    flat = ptr.reshape(-1)  # type: ignore[attr-defined]
    if not 0 <= at < flat.numel():
        raise ExprError(f"load at {at} of a tensor of {flat.numel()} elements")
    value = flat[at].item()
    return float(value) if floating else int(value)


def evaluate(e: Expr, env: Mapping[str, Number], rules: Rules = C) -> Number:
    """The value of `e` with the names of `env`; raises `ExprError` for what has no value."""
    if isinstance(e, Const):
        return e.value
    if isinstance(e, Var):
        if e.name not in env:
            raise ExprError(f"'{e.name}' has no value here")
        return env[e.name]
    if isinstance(e, Neg):
        return -evaluate(e.arg, env, rules)
    if isinstance(e, BinOp):
        a, b = evaluate(e.lhs, env, rules), evaluate(e.rhs, env, rules)
        if e.op in ("/", "%") and b == 0:
            raise ExprError(f"division by zero in '{e}'")
        if e.op == "/":
            return _divide(a, b, rules)
        if e.op == "%":
            return _modulo(a, b, rules)
        return _ARITH[e.op](a, b)
    if isinstance(e, Call):
        problem = call_problem(e.fn, len(e.args))
        if problem:
            raise ExprError(problem)
        return _FUNCS[e.fn](*(evaluate(a, env, rules) for a in e.args))
    if isinstance(e, Index):
        return _element(e, env, rules)
    raise ExprError(f"not an expression: {e!r}")


def _element(e: Index, env: Mapping[str, object], rules: Rules) -> Number:
    """`seqlens[batch_idx]`: one element of a tensor in `env` (anything with `shape` and item indexing, a
    torch tensor); an index outside its dimension reads 0 (LANGUAGE.md §2, tensor Inputs)."""
    tensor = env.get(e.base.name)
    shape = getattr(tensor, "shape", None)
    if shape is None:
        raise ExprError(f"the slice '{e}' has no scalar value" if e.base.name not in env else
                        f"'{e.base.name}' is not a tensor, so '{e}' has no value")
    if len(e.indices) != len(shape):
        raise ExprError(f"'{e}' gives {len(e.indices)} index(es) to a tensor of {len(shape)} dimension(s)")
    at = []
    inner = TL if rules is TL_BOUND else rules   # a loop stop rounds its own `/` up, not the position it reads
    for i in e.indices:
        if isinstance(i, Var) and i.name == "_":
            raise ExprError(f"the slice '{e}' has no scalar value")
        v = evaluate(i, env, inner)
        if not isinstance(v, int) or isinstance(v, bool):
            raise ExprError(f"an index of '{e}' is {v!r}, not an integer")
        at.append(v)
    floating = bool(getattr(tensor, "is_floating_point", lambda: False)())
    if any(not 0 <= v < int(n) for v, n in zip(at, shape)):
        return 0.0 if floating else 0
    value = tensor[tuple(at)]
    value = value.item() if hasattr(value, "item") else value
    return float(value) if floating else int(value)


def eval_expr(e: Expr, env: Mapping[str, Number], *, ceil_div: bool = False) -> Number:
    """TL semantics: `/` on integers rounds down, or up when `ceil_div` (loop bounds)."""
    return evaluate(e, env, TL_BOUND if ceil_div else TL)
