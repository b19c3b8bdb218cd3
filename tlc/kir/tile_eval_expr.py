"""Tile evaluator, lowest layer: kernel-IR `Expr`s evaluated elementwise over torch tensors (the
functions of MapOp and RowBroadcastOp), dtype rounding, and the fault every layer raises."""
from __future__ import annotations

from typing import Callable, Mapping

import torch

from tlc.diagnostics import TlcError
from tlc.kir.evaluate import evaluate
from tlc.kir.expr import BinOp, Call, Const, Expr, Index, Neg, Var, free_names

F64 = torch.float64
_TORCH = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class TileFault(Exception):
    """What a kernel-IR op did wrong at tile level; the block runner adds the op and its location."""


def round_to(x: torch.Tensor, dtype: str) -> torch.Tensor:
    """`x` rounded to `dtype` (what registers or memory of that type hold), kept as float64."""
    if dtype not in _TORCH:
        raise TileFault(f"unknown dtype {dtype!r}")
    return x.to(_TORCH[dtype]).to(F64)


Value = torch.Tensor | int | float | bool


def _num(v: Value) -> torch.Tensor:
    return v if isinstance(v, torch.Tensor) else torch.tensor(v, dtype=torch.bool if isinstance(v, bool) else F64)


def _float(v: torch.Tensor) -> torch.Tensor:
    return v.to(F64) if v.dtype == torch.bool else v


def _div(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return _float(a) / _float(b)


def _mod(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.fmod(_float(a), _float(b))


_BIN: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "+": lambda a, b: _float(a) + _float(b), "-": lambda a, b: _float(a) - _float(b),
    "*": lambda a, b: _float(a) * _float(b), "/": _div, "%": _mod,
    "<": torch.lt, "<=": torch.le, ">": torch.gt, ">=": torch.ge, "==": torch.eq, "!=": torch.ne,
    "&&": lambda a, b: torch.logical_and(a, b), "||": lambda a, b: torch.logical_or(a, b)}
# C's fmaxf/fminf (what `max`/`min` on floats compile to) return the non-NaN operand.
_UNARY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "exp2": torch.exp2, "exp": torch.exp, "log": torch.log, "tanh": torch.tanh, "abs": torch.abs,
    "sqrt": torch.sqrt, "isnan": torch.isnan}


def _call(fn: str, args: list[torch.Tensor]) -> torch.Tensor:
    if fn in _UNARY:
        return _UNARY[fn](_float(args[0]))
    if fn == "select":
        return torch.where(args[0].to(torch.bool), _float(args[1]), _float(args[2]))
    if fn in ("min", "max"):
        pick = torch.fmin if fn == "min" else torch.fmax
        out = _float(args[0])
        for x in args[1:]:
            out = pick(out, _float(x))
        return out
    if fn == "load":   # load(tensor, flat index, inside) per element: 0 outside
        ptr, at, inside = args
        inside = inside.to(torch.bool)
        flat = ptr.reshape(-1).to(F64)
        at = torch.where(inside, at.to(F64), torch.zeros_like(at, dtype=F64)).long()
        if flat.numel() == 0 or bool(((at < 0) | (at >= flat.numel())).any()):
            raise TileFault(f"a load reads outside a tensor of {flat.numel()} elements")
        return torch.where(inside, flat[at], torch.zeros((), dtype=F64))
    a, b = (_float(x) for x in args)
    if fn == "floor_div":
        return torch.div(a, b, rounding_mode="floor")
    if fn == "floor_mod":  # torch.remainder, like Python's `%`, takes the divisor's sign
        return torch.remainder(a, b)
    if fn in ("ceil_div", "cdiv"):
        return -torch.div(-a, b, rounding_mode="floor")
    raise TileFault(f"function {fn} has no elementwise meaning")


def eval_tensor_expr(e: Expr, tensors: Mapping[str, torch.Tensor], scalars: Mapping[str, Value]) -> torch.Tensor:
    """`e` elementwise: names in `tensors` are tiles (broadcast together), other names scalars.
    A subexpression over scalars only keeps the host evaluator's C semantics (integer `/`, `%`)."""
    if not (free_names(e) & tensors.keys()):
        try:
            return _num(evaluate(e, scalars))
        except TlcError as exc:
            raise TileFault(exc.diagnostics[0].message) from None
    if isinstance(e, Var):
        return tensors[e.name]
    if isinstance(e, Neg):
        return -_float(eval_tensor_expr(e.arg, tensors, scalars))
    if isinstance(e, BinOp):
        return _BIN[e.op](eval_tensor_expr(e.lhs, tensors, scalars), eval_tensor_expr(e.rhs, tensors, scalars))
    if isinstance(e, Call):
        return _call(e.fn, [eval_tensor_expr(a, tensors, scalars) for a in e.args])
    if isinstance(e, (Index, Const)):
        raise TileFault(f"`{e}` cannot appear in an elementwise function")
    raise TileFault(f"not an expression: {e!r}")
