"""`lazy-rescale`: the online softmax's running max moves only when a row's scores outgrow it by more
than 2^8 after exp2, and the output is rescaled only when some row of the warp moved.

Online softmax (tlc/passes/online_softmax.py) rescales the output accumulator by
alpha = exp2((m_old - m_new)·scale) every trip: one multiply per accumulator register, 64 per thread
per trip at d = 128 and 128 at d = 256 on sm_90a, on the path between one P·V and the next. Any
reference point m works for the softmax as long as the exponentials stay in range and the sum l
uses the same m: keeping a stale m while the tile's max exceeds it by at most 8/scale bounds every
exp2 by 2^8 = 256 (P stays well inside bf16/fp16 range, O and l are fp32), and a row whose m did
not move has alpha = 1 exactly, so its rescale is the identity. Per matched block:

    MapOp(m_2, (m, m_1), max(x0, x1))         →  select((x1 - x0) * s > 8.0, x1, x0)
    MapOp(alpha, (m, m_2), exp2(…))           →  select(x0 == x1, 1.0, exp2(…))
    RowBroadcastOp(rO, alpha, x * r)          →  WarpAnyOp(rO_rescale, alpha, x != 1.0)
                                                 IfOp(rO_rescale, [RowBroadcastOp(rO, alpha, x * r)])

s is the Exp2ScaleOp's scale (scores·s is the exp2 domain). The vote makes the branch warp-uniform:
a warp whose rows all kept their max skips the multiplies; one that did not runs them all, alpha = 1
rows included. A block of another shape is left as it was. `Param LazyRescale = false` turns it off.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from tlc.kir import ops as K
from tlc.kir.expr import BinOp, Call, Const, Var, parse_expr, substitute
from tlc.kir.ops_sm90 import WarpSpecializeOp
from tlc.kir.transforms.base import Facts, KernelTransform, Notes
from tlc.kir.transforms.schedule import Schedule
from tlc.names import FreshNames

THRESHOLD = 8.0   # log2 of the largest exp2 a stale max allows (FA4's rescaling threshold)


def _alpha_fn(scale):
    """Online softmax's rescale factor exp2((m_old − m_new)·s), −inf maxes as 0 (tlc/passes/online_softmax.py)."""
    return substitute(parse_expr("exp2(x0 * s - select(x1 == -inf, 0.0, x1 * s))"), "s", scale)


def _block(ops: tuple[K.Op, ...], notes: list[str], names: FreshNames) -> tuple[K.Op, ...]:
    ops = tuple(dataclasses.replace(op, **{r: _block(getattr(op, r), notes, names) for r in op.regions})
                if op.regions else op for op in ops)
    exp2 = {op.row_max: op for op in ops if isinstance(op, K.Exp2ScaleOp)}
    maxes = {op.target: op for op in ops if isinstance(op, K.MapOp) and len(op.srcs) == 2
             and op.fn == parse_expr("max(x0, x1)") and op.target in exp2}
    alphas = {op.target: op for op in ops if isinstance(op, K.MapOp) and len(op.srcs) == 2
              and op.srcs[1] in maxes and op.srcs[0] == maxes[op.srcs[1]].srcs[0]
              and op.fn == _alpha_fn(exp2[op.srcs[1]].scale_log2)}
    rescales = [op for op in ops if isinstance(op, K.RowBroadcastOp) and op.vec in alphas
                and op.fn == parse_expr("x * r")]
    if not rescales:
        return ops
    out: list[K.Op] = []
    for op in ops:
        if op in maxes.values() and any(alphas[r.vec].srcs[1] == op.target for r in rescales):
            scale = exp2[op.target].scale_log2
            grew = BinOp(">", BinOp("*", BinOp("-", Var("x1"), Var("x0")), scale), Const(THRESHOLD))
            op = dataclasses.replace(op, fn=Call("select", (grew, Var("x1"), Var("x0"))))
        elif op in alphas.values() and any(r.vec == op.target for r in rescales):
            op = dataclasses.replace(op, fn=Call("select", (BinOp("==", Var("x0"), Var("x1")), Const(1.0), op.fn)))
        elif op in rescales:
            flag = names.fresh(f"{op.target}_rescale")
            out.append(K.WarpAnyOp(name=flag, vec=op.vec, fn=BinOp("!=", Var("x"), Const(1.0)), loc=op.loc))
            op = K.IfOp(cond=Var(flag), body=(op,), loc=op.loc)
            notes.append(f"lazy-rescale: {op.body[0].target} rescaled only when a row of the warp moved its max "
                         f"(by more than 2^{THRESHOLD:g} after exp2)")
        out.append(op)
    return tuple(out)


def lazy_rescale(kernel: K.KernelOp) -> tuple[K.KernelOp, list[str]]:
    notes: list[str] = []
    names = FreshNames(K.names_defined((kernel,)), first=2)
    return dataclasses.replace(kernel, body=_block(kernel.body, notes, names)), notes


@dataclass(frozen=True)
class LazyRescaleTransform(KernelTransform):
    """On by default in warp-specialised kernels; `Param LazyRescale = true` (schedule.lazy_rescale) asks
    for it elsewhere, `false` turns it off everywhere. Precondition (facts.stale_max, proved on the TL
    graph by tlc.lowering.stale_max): a running max that lags the true one leaves the result unchanged;
    where it would not, the kernel is kept and the note says why."""

    name: ClassVar[str] = "lazy-rescale"

    def rewrite(self, kernel: K.KernelOp, schedule: Schedule, facts: Facts) -> tuple[K.KernelOp, Notes]:
        wanted = schedule.lazy_rescale
        specialised = any(isinstance(op, WarpSpecializeOp) for op in K.walk(kernel))
        if wanted is False or (wanted is None and not specialised):
            return kernel, []
        if facts.stale_max is not None:
            return kernel, [f"lazy-rescale: not applied: {facts.stale_max} (a stale running max would change the "
                            "result)"]
        kernel, notes = lazy_rescale(kernel)
        return kernel, list(dict.fromkeys(notes))
