"""`unroll-register-loops`: a loop that only loads global memory into registers and computes on them is
emitted unrolled `by` times (`#pragma unroll 4`), so several trips' loads are in flight together.

A loop whose body loads a tile from global memory into registers each trip and folds it into a running
value (split-KV's combine: each split's partial O and log-sum-exp, rescaled into the sum) waits a whole
memory latency per trip when its trips run one at a time: the loads of trip n + 1 do not depend on trip
n's arithmetic, but without unrolling ptxas cannot issue them before trip n's use of its own. Unrolled,
the loads of `by` trips issue back to back. Nothing changes in what the loop computes: the trips run in
the same order, each as written.

Taken only by loops that synchronise with nothing — no shared memory, barriers, async copies, TMA,
wgmma or loop exits, no loop inside — and load global memory into registers (FragLoadOp, RowLoadOp);
every other loop keeps `#pragma unroll 1` (its trips are long, or pipelined by the schedule already).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from tlc.kir import ops as K
from tlc.kir.effects import Effect
from tlc.kir.ops import rewrite_ops
from tlc.kir.transforms.base import Facts, KernelTransform, Notes
from tlc.kir.transforms.schedule import Schedule

_ALLOWED = Effect.WARP_COLLECTIVE | Effect.GLOBAL_WRITE   # what a trip may do besides registers and global loads


def register_only(loop: K.ForOp) -> bool:
    """Whether every op of `loop`'s body works on registers and global memory alone, with at least one
    load from global memory into registers."""
    loads = False
    for op in K.walk(loop):
        if op is loop:
            continue
        if isinstance(op, K.ForOp) and not op.unroll:
            return False
        e = op.effects()
        if (e.shared_reads or e.shared_writes or e.cp_async_writes or e.tma_writes or e.tokens_used
                or e.tokens_defined or e.kinds & ~_ALLOWED):
            return False
        loads |= isinstance(op, (K.FragLoadOp, K.RowLoadOp))
    return loads


@dataclass(frozen=True)
class UnrollRegisterLoopsTransform(KernelTransform):
    """Loops of register work over global loads unrolled `by` times (option `by`, 4 by default)."""

    name: ClassVar[str] = "unroll-register-loops"
    by: int = 4

    def rewrite(self, kernel: K.KernelOp, schedule: Schedule, facts: Facts) -> tuple[K.KernelOp, Notes]:
        if self.by < 2:
            return kernel, []
        taken: list[str] = []

        def visit(op: K.Op) -> K.Op:
            if isinstance(op, K.ForOp) and not op.unroll and not op.unroll_by and register_only(op):
                taken.append(op.var)
                return dataclasses.replace(op, unroll_by=self.by)
            return op

        body = rewrite_ops(kernel.body, visit)
        if not taken:
            return kernel, []
        return dataclasses.replace(kernel, body=body), [
            f"unroll-register-loops: loop {', '.join(taken)} unrolled {self.by}× (its trips' global loads in "
            "flight together)"]
