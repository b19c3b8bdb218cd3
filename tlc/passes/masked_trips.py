"""Whether a trip whose scores are all masked leaves a loop's carried values as they were.

The `mask` pass stops a causal loop at the diagonal and `skip-masked-trips` lets a warp group skip the
trips its rows mask: both drop trips whose scores are all −inf. That is exact only if such a trip is the
identity on everything the loop carries, which the online softmax's own update is (the running max
does not move, alpha = exp2(m − m) is 1, P = exp2(−inf) is 0, so l·1 + 0 and O·1 + 0·V) but an op of the
program's own on the carried values is not (`Compute Multiply O, 0.5` in the loop halves O in every
trip, masked or not).

`masked_trip_changes(loop, masked)` interprets the loop body abstractly with the scores of the masks
`masked` picks as all −inf and answers None when every carried value comes out as it went in, else
the reason (the first op that may change one).
"""
from __future__ import annotations

from typing import Callable

from tlc.ir.ops import CopyOp, ElementwiseOp, GemmOp, LoopOp, MaskOp, Op, ReshapeOp, RowReduceOp, ScaledExpOp

NEG_INF, ZERO, ONE, OTHER = "-inf", "0", "1", "other"   # abstract values; ("arg", i): carried value i unchanged
_KEEPS_ZERO = ("neg", "abs", "relu")


def masked_trip_changes(loop: LoopOp, masked: Callable[[MaskOp], bool]) -> str | None:
    body = loop.body
    assert body is not None
    state: dict[int, object] = {a.uid: ("arg", i) for i, a in enumerate(loop.args[1:])}
    for op in body.ops():
        value = _step(op, [state.get(v.uid) for v in op.operands], masked)
        if value is None:
            continue  # reads nothing carried or masked: the same in every trip, whatever it is
        for r in op.results:
            state[r.uid] = value
    for i, y in enumerate(loop.yields[: len(loop.operands)]):
        if state.get(y.uid) != ("arg", i):
            op = body.producer(y)
            what = f"'{op.mnemonic}' at line {op.loc.line}" if op is not None and op.loc.line > 0 else "the loop"
            return f"a trip whose scores are all masked still changes '{y.base}' ({what})"
    return None


def _step(op: Op, args: list, masked: Callable[[MaskOp], bool]):
    """The abstract result of `op`, or None when it reads nothing abstract."""
    if isinstance(op, MaskOp) and masked(op):
        return NEG_INF
    if all(a is None for a in args):
        return None
    if isinstance(op, MaskOp):
        return NEG_INF if args[0] == NEG_INF else OTHER
    if isinstance(op, RowReduceOp):
        if op.fn == "max" and args[0] == NEG_INF:
            return NEG_INF
        return ZERO if op.fn == "sum" and args[0] == ZERO else OTHER
    if isinstance(op, ScaledExpOp):
        x, m = args[0], args[1]
        if x == NEG_INF:
            return ZERO                      # exp2(−inf − m) = 0, also where m = −inf (taken as 0 there)
        if isinstance(x, tuple) and x == m:
            return ONE                       # alpha = exp2(m_old − m_new) with the max unmoved
        return OTHER
    if isinstance(op, (ReshapeOp, CopyOp)):
        return args[0] if args[0] in (ZERO, NEG_INF) or isinstance(args[0], tuple) else OTHER
    if isinstance(op, ElementwiseOp):
        return _elementwise(op.fn, args)
    if isinstance(op, GemmOp):
        a, b = args[0], args[1]
        product_zero = a == ZERO or b == ZERO
        if op.accumulate:
            return args[2] if product_zero and args[2] is not None else OTHER
        return ZERO if product_zero else OTHER
    return OTHER


def _elementwise(fn: str, args: list):
    a = args[0]
    b = args[1] if len(args) > 1 else None
    if fn == "max" and isinstance(a, tuple) and b == NEG_INF or fn == "max" and a == NEG_INF and isinstance(b, tuple):
        return a if isinstance(a, tuple) else b      # the running max against a masked tile's −inf
    if fn == "mul":
        if ZERO in (a, b):
            return ZERO
        if a == ONE:
            return b if b is not None else OTHER
        if b == ONE:
            return a if a is not None else OTHER
    if fn == "div" and a == ZERO:
        return ZERO
    if fn in ("add", "sub"):
        if b == ZERO and a is not None and a != OTHER:
            return a
        if a == ZERO and fn == "add" and b is not None and b != OTHER:
            return b
    if fn in _KEEPS_ZERO and a == ZERO:
        return ZERO
    return OTHER
