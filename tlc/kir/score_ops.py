"""Score steps: the elementwise program between the two GEMMs (S = Q·Kᵀ … P·V), as kernel-IR text.

`select-atoms` reads the TL ops on S (multiply by `scale`, divide by `Softcap`, tanh, relu, masks …)
into `TLScoreOp`s; `lower_score_ops` turns them into `ScoreStep`s the flash-forward builder emits as
generic `MapOp`s (or the mask) over the S fragment. Runtime scalars travel in the parameter struct's
`score_s0..score_s3` fields; the launcher evaluates their host expressions (over runtime inputs).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from tlc.diagnostics import Loc, fail
from tlc.kir.expr import BinOp, Call, Const, Expr, Neg, Var, parse_expr

LOG2E = 1.4426950408889634
SCORE_SLOTS = 4
SCORE_FIELDS = tuple(f"score_s{i}" for i in range(SCORE_SLOTS))


@dataclass(frozen=True)
class TLScoreOp:
    """One TL op on S, in program order. `fn`: the TL elementwise function (mul, div, add, sub, max,
    min, tanh, relu, exp, exp2, log, neg, abs, square) or `mask`. `scalar`: the second operand as a
    kernel-IR expression text over runtime inputs, compile-time Params already substituted
    (`scale`, `30.0`); None for unary ops. Masks: `kind` causal | bounds and `alignment`."""

    fn: str
    scalar: str | None = None
    kind: str = ""
    alignment: str = ""
    loc: Loc | None = None


@dataclass(frozen=True)
class ScoreStep:
    """One kernel step on the S fragment: `map` S = fn(S) (`fn` is kernel-IR expression text in x0,
    constants and `p.<field>`), or `mask` (sequence bounds and, when causal, the diagonal)."""

    kind: str
    fn: str = ""
    loc: Loc | None = None

    def same_code(self, other: "ScoreStep") -> bool:
        return (self.kind, self.fn) == (other.kind, other.fn)


# TL function → kernel-IR expression of x0 (the score) and s (the scalar operand, if any).
_UNARY = {"tanh": "tanh(x0)", "relu": "max(x0, 0.0)", "exp": f"exp2(x0 * {LOG2E!r})", "exp2": "exp2(x0)",
          "log": "log(x0)", "neg": "-x0", "abs": "abs(x0)", "square": "x0 * x0"}
_BINARY = {"mul": "x0 * s", "div": "x0 / s", "add": "x0 + s", "sub": "x0 - s", "max": "max(x0, s)",
           "min": "min(x0, s)"}


def substitute(e: Expr, name: str, value: Expr) -> Expr:
    """`e` with every `Var(name)` replaced by `value`."""
    if isinstance(e, Var):
        return value if e.name == name else e
    if isinstance(e, Neg):
        return Neg(substitute(e.arg, name, value))
    if isinstance(e, BinOp):
        return BinOp(e.op, substitute(e.lhs, name, value), substitute(e.rhs, name, value))
    if isinstance(e, Call):
        return Call(e.fn, tuple(substitute(a, name, value) for a in e.args))
    return e


def _names(e: Expr) -> set[str]:
    if isinstance(e, Var):
        return {e.name}
    if isinstance(e, Neg):
        return _names(e.arg)
    if isinstance(e, BinOp):
        return _names(e.lhs) | _names(e.rhs)
    if isinstance(e, Call):
        return set().union(*(_names(a) for a in e.args))
    return set()


def _const_value(e: Expr) -> float | None:
    """The value of a constant expression (no names), else None."""
    from tlc.kir.evaluate import evaluate

    if _names(e):
        return None
    try:
        return float(evaluate(e, {}))
    except (ZeroDivisionError, ValueError, OverflowError):
        return None


class _Slots:
    """Runtime scalars → `p.scale`, `p.scale_log2` or a `p.score_s<i>` field (at most SCORE_SLOTS)."""

    def __init__(self) -> None:
        self.exprs: list[str] = []

    def ref(self, e: Expr, loc: Loc | None) -> Expr:
        value = _const_value(e)
        if value is not None:
            return Const(value)
        if e == Var("scale"):  # the launcher's own `scale` argument
            return Var("p.scale")
        if e == BinOp("*", Var("scale"), Const(LOG2E)):
            return Var("p.scale_log2")
        text = str(e)
        if text not in self.exprs:
            if len(self.exprs) == SCORE_SLOTS:
                raise fail(f"tlc build: more than {SCORE_SLOTS} runtime scalars act on the scores "
                           f"(the parameter struct has {', '.join(SCORE_FIELDS)}); fold some into Params", loc)
            self.exprs.append(text)
        return Var(f"p.{SCORE_FIELDS[self.exprs.index(text)]}")


def _fold_factors(ops: list[TLScoreOp]) -> list[tuple[TLScoreOp, Expr | None]]:
    """Runs of multiplies/divides by scalars become one multiply (one runtime scalar, not several):
    S·scale/Softcap → S·(scale / Softcap). The folded op keeps the first op's location."""
    out: list[tuple[TLScoreOp, Expr | None]] = []
    for op in ops:
        s = parse_expr(op.scalar) if op.scalar is not None else None
        if op.fn in ("mul", "div") and s is not None:
            factor = s if op.fn == "mul" else BinOp("/", Const(1.0), s)
            if out and out[-1][0].fn == "mul" and out[-1][1] is not None:
                first, prev = out[-1]
                out[-1] = (first, BinOp("*", prev, factor))
                continue
            out.append((TLScoreOp("mul", op.scalar, loc=op.loc), factor))
            continue
        out.append((op, s))
    return out


def lower_score_ops(ops: tuple[TLScoreOp, ...]) -> tuple[tuple[ScoreStep, ...], tuple[str, ...]]:
    """(steps, runtime scalar expressions filling p.score_s0, p.score_s1, …)."""
    slots = _Slots()
    steps: list[ScoreStep] = []
    for op, scalar in _fold_factors(list(ops)):
        if op.fn == "mask":
            if not (steps and steps[-1].kind == "mask"):  # consecutive masks are one MaskOp
                steps.append(ScoreStep("mask", loc=op.loc))
            continue
        if op.fn in _UNARY and scalar is None:
            steps.append(ScoreStep("map", _UNARY[op.fn], op.loc))
            continue
        if op.fn in _BINARY and scalar is not None:
            value = _const_value(scalar)
            if op.fn == "mul" and value == 1.0:
                continue
            fn = substitute(parse_expr(_BINARY[op.fn]), "s", slots.ref(scalar, op.loc))
            steps.append(ScoreStep("map", str(fn), op.loc))
            continue
        raise fail(f"tlc build: the sm_80 backend cannot apply '{op.fn}' to the scores "
                   f"(known: {', '.join(sorted({*_UNARY, *_BINARY, 'mask'}))})", op.loc)
    return tuple(steps), tuple(slots.exprs)


def lower_exp2_scale(scalar: str, loc: Loc | None, taken: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    """The softmax's exp2 scale (log2 e folded in) as kernel-IR text, and the scalar slots after it."""
    slots = _Slots()
    slots.exprs = list(taken)
    e = slots.ref(parse_expr(scalar), loc)
    if isinstance(e, Const) and not (math.isfinite(e.value) and e.value > 0):
        raise fail(f"tlc build: the softmax scale {scalar} must be positive and finite", loc)
    return str(e), tuple(slots.exprs)


def legacy_steps(softcap: bool) -> tuple[ScoreStep, ...]:
    """The chain a hand-written FlashFwdConfig gets: optional softcap (scale/cap folded on the host
    into `p.softcap_scale`, the cap into the exp2 scale), then the mask."""
    maps = (ScoreStep("map", "tanh(x0 * p.softcap_scale)"),) if softcap else ()
    return maps + (ScoreStep("mask"),)
