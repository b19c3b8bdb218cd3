"""`defer-reductions`: keep a loop's running row sum thread-partial; reduce across lanes once, after.

A row sum lowers to a per-thread reduction and a shuffle across the 4 lanes holding the row. When
the reduced value only feeds a running sum `l = l·a + x` whose rescale `a` is the same on every
lane of the row, the shuffles commute with the loop: each lane accumulates its own columns and one
cross-lane sum after the loop gives the same `l` (FlashAttention-2 does this for its softmax sum).

    for n: x = rowsum(P); allreduce(x); l = l·α; l = l + x          for n: x = rowsum(P); l = l·α; l = l + x
    use(l)                                                     →    allreduce(l); use(l)

Conditions, checked here: `l` starts at 0 before the loop, is written in the loop only by those
two forms, and `α` is lane-uniform (computed from all-reduced values only).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from tlc.kir import ops as K
from tlc.kir import ops_sm90 as H
from tlc.kir.expr import E
from tlc.kir.transforms.base import Facts, KernelTransform, Notes
from tlc.kir.transforms.schedule import Schedule

_ADD, _MUL = E("x0 + x1"), E("x0 * x1")


def _writes(op: K.Op) -> set[str]:
    """What `op` itself writes in place or defines (the ops inside it are walked by the callers)."""
    return op.effects().writes | set(op.defined_names())


def _reads(op: K.Op) -> frozenset[str]:
    """What `op` itself reads."""
    return op.effects().reads


def _uniform(body: tuple[K.Op, ...], outer_uniform: set[str]) -> set[str]:
    """Row vectors whose every write in `body` makes all lanes of a row agree."""
    uni = set(outer_uniform)
    for i, op in enumerate(body):
        if isinstance(op, K.RowVectorOp):
            uni.add(op.name)
        elif isinstance(op, K.AllReduceOp):
            uni.add(op.target)
        elif isinstance(op, K.RowReduceOp):
            follows = i + 1 < len(body) and isinstance(body[i + 1], K.AllReduceOp) and body[i + 1].target == op.dst
            if not follows:
                uni.discard(op.dst)
        elif isinstance(op, K.MapOp) and op.target in uni and not set(op.srcs) <= uni:
            uni.discard(op.target)
    return uni


def _defer_in(loop: K.ForOp, before: list[K.Op]) -> tuple[K.ForOp, list[str]]:
    body = loop.body
    zero_init = {op.name for op in before if isinstance(op, K.RowVectorOp) and op.init == E(0.0)}
    written_before = {w for op in before if not isinstance(op, K.RowVectorOp) for x in K.walk(op) for w in _writes(x)}
    outer_uniform = {op.name for op in before if isinstance(op, K.RowVectorOp)}
    uni = _uniform(body, outer_uniform)
    deferred: list[str] = []
    drop: set[int] = set()
    for i, op in enumerate(body):
        if not (isinstance(op, K.AllReduceOp) and op.kind == "sum" and i > 0):
            continue
        x = op.target
        red = body[i - 1]
        if not (isinstance(red, K.RowReduceOp) and red.dst == x and red.kind == "sum" and not red.accumulate):
            continue
        users = [u for u in body if x in K.nested_effects(u).reads and u is not op]
        if len(users) != 1 or not isinstance(users[0], K.MapOp) or users[0].fn != _ADD:
            continue
        acc = users[0].target
        if users[0].srcs != (acc, x) or acc not in zero_init or acc in written_before:
            continue
        ok = True
        for u in K.walk(dataclasses.replace(loop, body=body)):
            if u is users[0] or u is loop:
                continue
            if acc in _writes(u) and not (isinstance(u, K.MapOp) and u.fn == _MUL and u.srcs[0] == acc
                                          and len(u.srcs) == 2 and u.srcs[1] in uni):
                ok = False
            if acc in _reads(u) and not (isinstance(u, K.MapOp) and u.target == acc):
                ok = False
        if ok:
            drop.add(i)
            deferred.append(acc)
    new = tuple(op for i, op in enumerate(body) if i not in drop)
    return dataclasses.replace(loop, body=new), deferred


def defer_reductions(kernel: K.KernelOp) -> tuple[K.KernelOp, list[str]]:
    body, notes = _defer_body(kernel.body)
    return dataclasses.replace(kernel, body=body), notes


def _defer_body(body: tuple[K.Op, ...]) -> tuple[tuple[K.Op, ...], list[str]]:
    """Defer in the loops of `body`, and of a warp-specialised kernel's consumer region."""
    out: list[K.Op] = []
    notes: list[str] = []
    for op in body:
        if isinstance(op, H.WarpSpecializeOp):
            consumer, inner = _defer_body(op.consumer)
            out.append(dataclasses.replace(op, consumer=consumer))
            notes += inner
            continue
        if isinstance(op, K.ForOp) and not op.unroll:
            loop, deferred = _defer_in(op, out)
            out.append(loop)
            for acc in deferred:
                out.append(K.AllReduceOp(target=acc, kind="sum", width=4, loc=op.loc))
                notes.append(f"loop {op.var}: running sum {acc} kept per lane, reduced across lanes after the loop")
            continue
        out.append(op)
    return tuple(out), notes


@dataclass(frozen=True)
class DeferReductionsTransform(KernelTransform):
    """Running row sums `l = l·a + x` stay per lane in the loop; one cross-lane sum after; no schedule knob."""

    name: ClassVar[str] = "defer-reductions"

    def rewrite(self, kernel: K.KernelOp, schedule: Schedule, facts: Facts) -> tuple[K.KernelOp, Notes]:
        return defer_reductions(kernel)
