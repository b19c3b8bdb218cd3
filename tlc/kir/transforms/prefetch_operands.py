"""`prefetch-operands`: each GEMM's shared→register loads run one k-block ahead of its MMAs.

`lower-tile-ops` writes a GEMM as an unrolled loop over its k-blocks: load k-block kb of the
shared operands (ldmatrix), then the MMAs of kb, which wait for those loads. This pass issues
k-block 0's loads before the loop and k-block kb + 1's at the top of trip kb, so the ldmatrix
latency hides behind the MMAs of kb, as FlashAttention-2 does, for one more k-block of operand
registers (`check-resources` counts it). The rule: every k-block loop that loads an operand
from shared memory. It runs after `insert-sync`: the loads stay between the waits and barriers
that guard the whole loop, and after the shared tile they read was last written.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from tlc.kir import ops as K
from tlc.kir.expr import BinOp, Const, Var
from tlc.kir.transforms.base import Facts, KernelTransform, Notes
from tlc.kir.transforms.schedule import Schedule


def _prefetched(loop: K.ForOp) -> list[K.Op]:
    loads = [op for op in loop.body if isinstance(op, K.CopyOp) and op.kblock == Var(loop.var)]
    if not loads or loop.prefetch:
        return [loop]
    nxt = BinOp("+", Var(loop.var), Const(1))
    ahead = K.IfOp(cond=BinOp("<", nxt, loop.stop), body=tuple(dataclasses.replace(c, kblock=nxt) for c in loads),
                   loc=loop.loc)
    rest = tuple(op for op in loop.body if op not in loads)
    first = [dataclasses.replace(c, kblock=loop.start) for c in loads]
    return [*first, dataclasses.replace(loop, body=(ahead, *rest), prefetch=True)]


def _region(ops: tuple[K.Op, ...], counted: list[int]) -> tuple[K.Op, ...]:
    out: list[K.Op] = []
    for op in ops:
        if isinstance(op, K.ForOp) and op.unroll:
            new = _prefetched(op)
            counted[0] += len(new) > 1
            out += new
        elif isinstance(op, (K.ForOp, K.IfOp)):
            out.append(dataclasses.replace(op, body=_region(op.body, counted)))
        else:
            out.append(op)
    return tuple(out)


def prefetch_operands(kernel: K.KernelOp) -> tuple[K.KernelOp, list[str]]:
    counted = [0]
    kernel = dataclasses.replace(kernel, body=_region(kernel.body, counted))
    notes = [f"{counted[0]} GEMM(s): each k-block's shared operands loaded during the previous k-block's MMAs"]
    return kernel, notes if counted[0] else []


@dataclass(frozen=True)
class PrefetchOperandsTransform(KernelTransform):
    """Each GEMM's shared→register loads one k-block ahead of its MMAs; no schedule knob."""

    name: ClassVar[str] = "prefetch-operands"

    def rewrite(self, kernel: K.KernelOp, schedule: Schedule, facts: Facts) -> tuple[K.KernelOp, Notes]:
        return prefetch_operands(kernel)
