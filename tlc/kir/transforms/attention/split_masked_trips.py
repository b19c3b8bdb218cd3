"""`split-masked-trips`: a loop whose masks apply only from some trip on runs as two loops, the
first without the mask code.

The `mask` pass (tlc/passes/mask.py) guards each mask with the first trip it can change
(`from_iteration`): causal masks from the diagonal tile, bounds masks from the partial last tile.
Lowered, the guard is an `IfOp(n >= E)` around the `MaskOp`s in every trip, and the C++ compiler
turns it into predicated selects that issue on every trip (64 FSEL, 32 ISETP and their index
arithmetic per trip of the sm_90a d = 128 kernel, a fifth of its loop). Split:

    before                                          after
    ForOp(n, s, e, [                                LetOp(n_masked_from, i32, max(s, min(e, E1, E2)))
      …                                             ForOp(n, s, n_masked_from, [… the guards dropped …])
      IfOp(n >= E1, [MaskOp(causal)])               ForOp(n, n_masked_from, e, [… as before …])
      IfOp(n >= E2, [MaskOp(bounds)])
      …])

A trip before min(E…) satisfies no guard, so dropping them there changes nothing; the second loop
keeps every guard (a trip past one threshold may be short of another). Both loops run the same
body on the same trip numbers in the same order, so stages, phases, carried registers and ring
counters are untouched. Covered: a guard is an `IfOp` directly in the loop body whose body is only
`MaskOp`s and whose condition is `var >= E` with E free of the names the loop defines or advances; a loop with a
`BreakOp` or an unrolled k-block loop is left alone. `Param SplitMasked = false` keeps one loop.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from tlc.kir import ops as K
from tlc.kir.expr import BinOp, Call, Expr, Var, free_names, print_expr
from tlc.kir.ops_sm90 import WarpSpecializeOp
from tlc.kir.transforms.base import Facts, KernelTransform, Notes
from tlc.kir.transforms.schedule import Schedule
from tlc.names import FreshNames


def _threshold(op: K.Op, var: str, local: set[str]) -> Expr | None:
    """E of a mask guard `IfOp(var >= E, [MaskOp…])`, else None."""
    if not (isinstance(op, K.IfOp) and op.body and all(isinstance(b, K.MaskOp) for b in op.body)):
        return None
    cond = op.cond
    if not (isinstance(cond, BinOp) and cond.op == ">=" and cond.lhs == Var(var)):
        return None
    return None if free_names(cond.rhs) & (local | {var}) else cond.rhs


def _local_names(body: tuple[K.Op, ...]) -> set[str]:
    """Names the loop body defines or writes (a counter advanced in it, too): a threshold reading one is
    not loop-invariant."""
    return K.names_defined(body) | {w for op in body for x in K.walk(op) for w in x.effects().writes}


class _Splitter:
    def __init__(self, kernel: K.KernelOp) -> None:
        self.names = FreshNames(K.names_defined((kernel,)), first=2)
        self.notes: list[str] = []

    def block(self, ops: tuple[K.Op, ...]) -> tuple[K.Op, ...]:
        out: list[K.Op] = []
        for op in ops:
            if op.regions:
                op = dataclasses.replace(op, **{r: self.block(getattr(op, r)) for r in op.regions})
            out.extend(self.split(op) if isinstance(op, K.ForOp) else (op,))
        return tuple(out)

    def split(self, loop: K.ForOp) -> tuple[K.Op, ...]:
        if loop.unroll or loop.step != 1:
            return (loop,)
        local = _local_names(loop.body)
        guards = {i: e for i, op in enumerate(loop.body) if (e := _threshold(op, loop.var, local)) is not None}
        if not guards:
            return (loop,)
        if any(isinstance(x, K.BreakOp) for op in loop.body for x in K.walk(op)):
            self.notes.append(f"split-masked-trips: loop '{loop.var}' kept whole (it breaks off)")
            return (loop,)
        first = self.names.fresh(f"{loop.var}_masked_from")
        bounds = list(dict.fromkeys(guards.values()))
        value = Call("max", (loop.start, Call("min", (loop.stop, *bounds))))
        plain = tuple(op for i, op in enumerate(loop.body) if i not in guards)
        self.notes.append(f"split-masked-trips: loop '{loop.var}' runs trips below {first} = "
                          f"max(start, min(stop, {', '.join(map(print_expr, bounds))})) without its "
                          f"{len(guards)} mask guard(s)")
        return (K.LetOp(name=first, type="i32", value=value, loc=loop.loc),
                dataclasses.replace(loop, stop=Var(first), body=plain),
                dataclasses.replace(loop, start=Var(first)))


def split_masked_trips(kernel: K.KernelOp) -> tuple[K.KernelOp, list[str]]:
    splitter = _Splitter(kernel)
    body = splitter.block(kernel.body)
    return dataclasses.replace(kernel, body=body), splitter.notes


@dataclass(frozen=True)
class SplitMaskedTripsTransform(KernelTransform):
    """On by default in warp-specialised kernels, whose consumers have registers to spare; the sm_80-family
    kernels run at the register limit, where the second loop cost spills and 2-9 % on an H200, so they
    keep one loop unless `Param SplitMasked = true` (schedule.split_masked). `false` keeps one loop
    everywhere."""

    name: ClassVar[str] = "split-masked-trips"

    def rewrite(self, kernel: K.KernelOp, schedule: Schedule, facts: Facts) -> tuple[K.KernelOp, Notes]:
        wanted = schedule.split_masked
        if wanted is None and not any(isinstance(op, WarpSpecializeOp) for op in K.walk(kernel)):
            return kernel, ["split-masked-trips: not warp-specialised, one loop (the second costs registers at the "
                            "limit; Param SplitMasked = true splits)"]
        if wanted is False:
            return kernel, []
        return split_masked_trips(kernel)
