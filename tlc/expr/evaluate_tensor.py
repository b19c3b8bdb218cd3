"""Evaluate an expression elementwise over torch tensors under TL's rules (`evaluate.TL`).

The interpreter's mask predicates read per-element positions: `q_idx` and `kv_idx` are a tile's global
rows and columns as tensors that broadcast together (`rows[:, None]`, `cols[None, :]`), every other name
is a number. Integer tensors stay integers, so `/` and `%` on two integers floor exactly as the host
evaluator's TL rules do on numbers; a float operand divides exactly. Comparisons, `&&` and `||` give
bool tensors.
"""
from __future__ import annotations

from typing import Callable, Mapping

import torch

from tlc.expr.evaluate import ExprError
from tlc.expr.nodes import BinOp, Call, Const, Expr, Index, Neg, Var, call_problem

TensorEnvValue = torch.Tensor | int | float | bool


def _tensor(v: TensorEnvValue) -> torch.Tensor:
    if isinstance(v, torch.Tensor):
        return v
    if isinstance(v, bool):
        return torch.tensor(v, dtype=torch.bool)
    if isinstance(v, int):
        return torch.tensor(v, dtype=torch.int64)
    return torch.tensor(float(v), dtype=torch.float64)


def _is_int(t: torch.Tensor) -> bool:
    return not t.is_floating_point() and t.dtype != torch.bool


def _nonzero_divisor(e: BinOp | Call, b: torch.Tensor) -> None:
    if bool((b == 0).any()):
        raise ExprError(f"division by zero in '{e}'")


def _floor_div(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if _is_int(a) and _is_int(b):
        return torch.div(a, b, rounding_mode="floor")
    return torch.floor(a.double() / b.double())


def _ceil_div(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return -_floor_div(-a, b)


_COMPARE: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "<": torch.lt, "<=": torch.le, ">": torch.gt, ">=": torch.ge, "==": torch.eq, "!=": torch.ne,
    "&&": torch.logical_and, "||": torch.logical_or}


def _binop(e: BinOp, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if e.op in _COMPARE:
        return _COMPARE[e.op](a, b)
    if e.op == "+":
        return a + b
    if e.op == "-":
        return a - b
    if e.op == "*":
        return a * b
    _nonzero_divisor(e, b)
    if e.op == "/":
        return torch.div(a, b, rounding_mode="floor") if _is_int(a) and _is_int(b) else a.double() / b.double()
    return torch.remainder(a, b)   # `%`: floored, the result takes the divisor's sign (Python's `%`)


def _call(e: Call, args: list[torch.Tensor]) -> torch.Tensor:
    if e.fn in ("min", "max"):
        pick = torch.minimum if e.fn == "min" else torch.maximum
        out = args[0]
        for x in args[1:]:
            if out.dtype != x.dtype:   # one float argument makes the result a float, as on the host
                out, x = out.double(), x.double()
            out = pick(out, x)
        return out
    a, b = args
    _nonzero_divisor(e, b)
    if e.fn in ("cdiv", "ceil_div"):
        return _ceil_div(a, b)
    if e.fn == "floor_div":
        return _floor_div(a, b)
    if e.fn == "floor_mod":
        return torch.remainder(a, b)
    raise ExprError(f"'{e.fn}' has no elementwise meaning here")


def evaluate_tensor(e: Expr, env: Mapping[str, TensorEnvValue]) -> torch.Tensor:
    """The value of `e` elementwise (a 0-d tensor when no name of `env` is a tensor); raises `ExprError`
    for a name without a value, a zero divisor, or what has no elementwise value (a slice)."""
    if isinstance(e, Const):
        return _tensor(e.value)
    if isinstance(e, Var):
        if e.name not in env:
            raise ExprError(f"'{e.name}' has no value here")
        return _tensor(env[e.name])
    if isinstance(e, Neg):
        return -evaluate_tensor(e.arg, env)
    if isinstance(e, BinOp):
        return _binop(e, evaluate_tensor(e.lhs, env), evaluate_tensor(e.rhs, env))
    if isinstance(e, Call):
        problem = call_problem(e.fn, len(e.args))
        if problem:
            raise ExprError(problem)
        return _call(e, [evaluate_tensor(a, env) for a in e.args])
    if isinstance(e, Index):
        return _gather(e, env)
    raise ExprError(f"not an expression: {e!r}")


def _gather(e: Index, env: Mapping[str, TensorEnvValue]) -> torch.Tensor:
    """`doc[batch_idx, q_idx]` per element: the tensor in `env` read at each element's indices; an index outside
    its dimension reads 0 (as tlc.expr.evaluate reads one element)."""
    tensor = env.get(e.base.name)
    if not isinstance(tensor, torch.Tensor) or tensor.dim() == 0:
        raise ExprError(f"'{e.base.name}' is not a tensor, so '{e}' has no value")
    if len(e.indices) != tensor.dim():
        raise ExprError(f"'{e}' gives {len(e.indices)} index(es) to a tensor of {tensor.dim()} dimension(s)")
    at = torch.broadcast_tensors(*(evaluate_tensor(i, env) for i in e.indices))
    if not all(_is_int(i) for i in at):
        raise ExprError(f"an index of '{e}' is not an integer")
    inside = torch.ones(at[0].shape, dtype=torch.bool)
    for i, n in zip(at, tensor.shape):
        inside &= (i >= 0) & (i < n)
    clamped = tuple(torch.where(inside, i, torch.zeros_like(i)).long() for i in at)
    values = tensor[clamped] if tensor.numel() else torch.zeros(at[0].shape, dtype=tensor.dtype)
    values = values.double() if tensor.is_floating_point() else values.long()
    return torch.where(inside, values, torch.zeros_like(values))
