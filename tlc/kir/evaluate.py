"""Evaluate kernel-IR scalar expressions on the host (grid formulas, tests) with the kernel's C
semantics (truncating `/` and `%`); the evaluator itself is `tlc.expr.evaluate`."""
from __future__ import annotations

from typing import Mapping

from tlc.diagnostics import fail
from tlc.expr import C, Expr, ExprError
from tlc.expr import evaluate as _evaluate


def evaluate(e: Expr, env: Mapping[str, int | float]) -> int | float:
    """C semantics for integers (truncating `/`, `%`); what has no value is a `TlcError`."""
    try:
        return _evaluate(e, env, C)
    except ExprError as exc:
        raise fail(f"cannot evaluate `{e}`: {exc}") from None
