"""`overlap-gemms` (sm_90a, warp-specialised loops): the next tile's first GEMM overlaps this tile's second.

A consumer loop of two wgmma GEMMs — G1 (fresh accumulator S, SS) and G2 (acc O += P·B, RS, P the
converted S) with the row statistics between them — runs each trip's ops in order, so the tensor
cores idle during the softmax. Rotated, G2 of trip n−1 is issued right after G1 of trip n, and the
softmax of trip n runs while both are in flight (FlashAttention-3's intra-warpgroup overlap):

    first trip (peeled): G1; wait<0>; release; softmax; P_keep = convert(S); O *= alpha; tail
    for n = start+1 …: G1(n) issue; G2(n−1) issue with P_keep and the stage of n−1;
                       wait<1>; release G1's tiles; softmax(n);
                       wait<0>; release G2's tiles of n−1; P_keep = convert(S); O *= alpha; tail
    last G2 after the loop (its tiles' stage from stop − 1)

P lives across trips in `P_keep`, a register fragment declared before the loop; ops between the
GEMMs that write O (the rescale) move after the wait that retires G2. A loop of another shape is
left as it is, with the reason in the schedule notes.

Ping-pong (`pingpong`, two or more consumer warp groups): each trip's GEMM issues are bracketed by
named barriers passed round the warp groups in turn (group w waits on barrier 1 + w, then arrives on
the next group's), so one group's GEMMs run on the tensor cores while the others do their softmax.
The last group opens the round once before the first trip and skips its arrival on the last trip, so
no barrier is left half-arrived.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from tlc.kir import ops as K
from tlc.kir import ops_sm90 as H
from tlc.kir.base import substitute_op
from tlc.kir.expr import BinOp, Const, Expr, Var, substitute
from tlc.kir.transforms.base import Facts, KernelTransform, Notes
from tlc.kir.transforms.schedule import Schedule

_ISSUE = (H.WgmmaFenceOperandOp, H.WgmmaArriveOp)


class Declined(Exception):
    """The loop keeps its order; the message says why."""


def _names_read(op: K.Op) -> set[str]:
    return K.names_used((op,))


def _writes(op: K.Op) -> frozenset[str]:
    """What `op` and the ops inside it write in place."""
    return K.nested_effects(op).writes


class _Loop:
    """The parts of one warp-specialised consumer loop around its two wgmma GEMMs."""

    def __init__(self, loop: K.ForOp, outer: set[str]) -> None:
        body = list(loop.body)
        gemms = [i for i, op in enumerate(body) if isinstance(op, H.WgmmaOp)]
        if len(gemms) != 2:
            raise Declined(f"loop {loop.var} runs {len(gemms)} wgmma GEMMs, not two")
        self.loop = loop
        i1, i2 = gemms
        g1, g2 = body[i1], body[i2]
        if not g1.zero_init or g2.zero_init or g2.acc not in outer:
            raise Declined(f"loop {loop.var}: the first GEMM must start a fresh accumulator and the second "
                           "accumulate into one declared before the loop")
        issue1, retire1 = self._around(body, i1, loop.var)
        issue2, retire2 = self._around(body, i2, loop.var)
        self.head = body[:issue1[0]]
        self.g1_issue = body[issue1[0]:issue1[1]]
        self.g1_retire = [op for op in body[retire1[0]:retire1[1]] if not isinstance(op, H.WgmmaWaitOp)]
        mid = body[retire1[1]:issue2[0]]
        self.g2_issue = body[issue2[0]:issue2[1]]
        self.g2_retire = [op for op in body[retire2[0]:retire2[1]] if not isinstance(op, H.WgmmaWaitOp)]
        self.tail = body[retire2[1]:]
        self.g1, self.g2 = g1, g2
        # P: G2's A operand, a retile of a conversion of G1's accumulator.
        defs = {n: op for op in mid for n in op.defined_names()}
        a = g2.a.name if isinstance(g2.a, Var) else ""
        retile = defs.get(a)
        convert = defs.get(retile.src) if isinstance(retile, K.RetileAccToAOp) else None
        if not (isinstance(convert, K.ConvertOp) and convert.src == g1.acc):
            raise Declined(f"loop {loop.var}: the second GEMM's A operand is not the first GEMM's result in registers")
        self.convert, self.retile = convert, retile
        rest = [op for op in mid if op is not convert and op is not retile]
        self.rescale = [op for op in rest if g2.acc in _writes(op)]
        self.softmax = [op for op in rest if op not in self.rescale]
        late = {n for op in self.rescale for n in op.defined_names()} | {convert.name, retile.name}
        if any(late & _names_read(op) for op in self.softmax):
            raise Declined(f"loop {loop.var}: the ops between the GEMMs read what the rescale or P defines")
        if any(g2.acc in _names_read(op) for op in self.softmax):
            raise Declined(f"loop {loop.var}: the ops between the GEMMs read {g2.acc} while the second GEMM writes it")
        # Rotated, a trip ends with O short of its own P·V (added next trip): nothing else may see O then.
        outside = [op for op in [*self.head, *self.tail] if not isinstance(op, H.WgmmaFragmentOp)]
        if any(g2.acc in _names_read(op) | _writes(op) for op in outside):
            raise Declined(f"loop {loop.var}: {g2.acc} is used outside the two GEMMs and the rescale between them")

    @staticmethod
    def _around(body: list[K.Op], i: int, var: str) -> tuple[tuple[int, int], tuple[int, int]]:
        """(issue span, retire span) of the wgmma at `i`: mbarrier waits and operand fences before it
        through its commit; its wait<0>, the tiles' releases and the fences after."""
        start = i
        while start and isinstance(body[start - 1], (*_ISSUE, H.MbarrierWaitOp)):
            start -= 1
        if i + 2 >= len(body) or not isinstance(body[i + 1], H.WgmmaCommitOp) \
                or not isinstance(body[i + 2], H.WgmmaWaitOp) or body[i + 2].pending != 0:
            raise Declined(f"loop {var}: a wgmma is not committed and retired by wait<0> right after it")
        end = i + 3
        while end < len(body) and (isinstance(body[end], H.WgmmaFenceOperandOp) or _is_release(body[end])):
            end += 1
        return (start, i + 2), (i + 2, end)


def _is_release(op: K.Op) -> bool:
    if isinstance(op, H.MbarrierArriveOp):
        return True
    return isinstance(op, K.IfOp) and len(op.body) == 1 and isinstance(op.body[0], H.MbarrierArriveOp)


class Overlapper:
    def __init__(self, kernel: K.KernelOp, pingpong: bool = True) -> None:
        self.kernel, self.pingpong = kernel, pingpong
        self.notes: list[str] = []
        self.groups, self.group = 0, ""

    def run(self) -> K.KernelOp:
        body = []
        for op in self.kernel.body:
            if isinstance(op, H.WarpSpecializeOp):
                self.groups = (self.kernel.threads - op.producer_threads) // H.WARP_GROUP
                self.group = op.group
                op = dataclasses.replace(op, consumer=tuple(self._region(op.consumer)))
            body.append(op)
        return dataclasses.replace(self.kernel, body=tuple(body))

    def _turns(self, n: str, stop: Expr, loc) -> tuple[list[K.Op], list[K.Op], list[K.Op]]:
        """(open the round, wait for this group's turn, pass it on) — empty without ping-pong."""
        if not (self.pingpong and self.groups >= 2):
            return [], [], []
        group, last = Var(self.group), Const(self.groups - 1)
        mine = BinOp("+", Const(1), group)
        nxt = BinOp("+", Const(1), BinOp("%", BinOp("+", group, Const(1)), Const(self.groups)))
        pair = 2 * H.WARP_GROUP
        start = [K.IfOp(cond=BinOp("==", group, last), loc=loc,
                        body=(H.NamedBarrierOp(id=1, threads=pair, arrive_only=True, loc=loc),))]
        wait = [H.NamedBarrierOp(id=mine, threads=pair, loc=loc)]
        more = BinOp("||", BinOp("<", BinOp("+", Var(n), Const(1)), stop), BinOp("!=", group, last))
        give = [K.IfOp(cond=more, loc=loc, body=(H.NamedBarrierOp(id=nxt, threads=pair, arrive_only=True, loc=loc),))]
        return start, wait, give

    def _region(self, ops: tuple[K.Op, ...]) -> list[K.Op]:
        out: list[K.Op] = []
        outer = {n for op in self.kernel.body for n in op.defined_names()} | \
                {n for op in ops for n in op.defined_names()}
        for op in ops:
            if isinstance(op, K.ForOp) and not op.unroll and any(isinstance(x, H.WgmmaOp) for x in op.body):
                try:
                    out += self._rotate(_Loop(op, outer))
                    continue
                except Declined as why:
                    self.notes.append(f"overlap-gemms: loop {op.var} keeps its order: {why}")
            out.append(op)
        return out

    def _rotate(self, lp: _Loop) -> list[K.Op]:
        loop, n = lp.loop, lp.loop.var
        keep_p, keep_a = f"{lp.convert.name}_keep", f"{lp.retile.name}_keep"
        frag = f"{lp.g1.acc}_like"
        s_frag = next((op for op in lp.head if isinstance(op, H.WgmmaFragmentOp) and op.name == lp.g1.acc), None)
        if s_frag is None:
            raise Declined(f"loop {n}: the first GEMM's accumulator is not declared in the loop")
        loc = loop.loc
        decls = [dataclasses.replace(s_frag, name=frag),
                 dataclasses.replace(lp.convert, name=keep_p, src=frag),
                 dataclasses.replace(lp.retile, name=keep_a, src=keep_p)]
        to_p = [lp.convert, lp.retile, H.CarryOp(target=keep_p, src=lp.convert.name, loc=lp.convert.loc)]
        position = [op for op in lp.head if isinstance(op, K.LetOp)]
        prev_lets = [dataclasses.replace(op, name=f"{op.name}_prev",
                                         value=substitute(op.value, n, BinOp("-", Var(n), Const(1))))
                     for op in position]
        g2_prev = [self._previous_trip(op, position) for op in lp.g2_issue]
        g2_retire_prev = [self._previous_trip(op, position) for op in lp.g2_retire]
        g2_prev = [dataclasses.replace(op, a=Var(keep_a)) if isinstance(op, H.WgmmaOp) else
                   dataclasses.replace(op, targets=tuple(keep_a if t == lp.retile.name else t for t in op.targets))
                   if isinstance(op, H.WgmmaFenceOperandOp) else op for op in g2_prev]
        g2_retire_prev = [dataclasses.replace(op, targets=tuple(keep_a if t == lp.retile.name else t
                                                                for t in op.targets))
                          if isinstance(op, H.WgmmaFenceOperandOp) else op for op in g2_retire_prev]
        start, turn, give = self._turns(n, loop.stop, loc)
        g1_issue = self._bracket(lp.g1_issue, turn)
        first_trip = [*start, *lp.head, *g1_issue, *give, H.WgmmaWaitOp(pending=0, loc=loc), *lp.g1_retire,
                      *lp.softmax, *to_p, *lp.rescale, *lp.tail]
        steady = [*lp.head, *g1_issue, *prev_lets, *g2_prev, *give, H.WgmmaWaitOp(pending=1, loc=loc),
                  *lp.g1_retire, *lp.softmax, H.WgmmaWaitOp(pending=0, loc=loc), *g2_retire_prev, *to_p,
                  *lp.rescale, *lp.tail]
        last_g2 = [substitute_op(op, n, loop.stop) for op in           # trip stop − 1 is n − 1 at n = stop
                   [*prev_lets, *g2_prev, H.WgmmaWaitOp(pending=0, loc=loc), *g2_retire_prev]]
        runs = BinOp("<", loop.start, loop.stop)
        self.notes.append(f"overlap-gemms: loop {n}: {lp.g1.mma} of trip n overlaps {lp.g2.mma} of trip n - 1 "
                          f"and the softmax between them (wait<1>); {keep_p} carries P across trips"
                          + (f"; ping-pong: the {self.groups} consumer warp groups issue their GEMMs in turn "
                             "(named barriers 1..)" if turn else ""))
        return [*decls,
                K.IfOp(cond=runs, body=tuple(substitute_op(op, n, loop.start) for op in first_trip), loc=loc),
                dataclasses.replace(loop, start=BinOp("+", loop.start, Const(1)), body=tuple(steady)),
                K.IfOp(cond=runs, body=tuple(last_g2), loc=loc)]

    @staticmethod
    def _bracket(issue: list[K.Op], turn: list[K.Op]) -> list[K.Op]:
        """G1's issue with this group's turn awaited after its tiles' mbarrier waits, before its fences."""
        at = next((i for i, op in enumerate(issue) if not isinstance(op, H.MbarrierWaitOp)), len(issue))
        return [*issue[:at], *turn, *issue[at:]]

    @staticmethod
    def _previous_trip(op: K.Op, position: list[K.LetOp]) -> K.Op:
        """G2's ops read the tiles of trip n − 1: the ring position's names become their `_prev` twins."""
        for let in position:
            op = substitute_op(op, let.name, Var(f"{let.name}_prev"))
        return op


def overlap_gemms(kernel: K.KernelOp, pingpong: bool = True) -> tuple[K.KernelOp, list[str]]:
    o = Overlapper(kernel, pingpong)
    return o.run(), o.notes


@dataclass(frozen=True)
class OverlapGemmsTransform(KernelTransform):
    """`Param Overlap = false` (schedule.overlap) keeps each trip's order; `Param PingPong = false`
    (schedule.pingpong) lets the consumer warp groups issue freely instead of taking turns."""

    name: ClassVar[str] = "overlap-gemms"

    def rewrite(self, kernel: K.KernelOp, schedule: Schedule, facts: Facts) -> tuple[K.KernelOp, Notes]:
        if not schedule.overlap:
            return kernel, []
        return overlap_gemms(kernel, schedule.pingpong)
