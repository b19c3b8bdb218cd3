"""`pipeline`: multi-stage software pipelining of a loop's global→shared copies (kernel IR).

A copy in a loop whose tile moves with the loop variable, into a buffer only that loop reads,
gets a stage dimension: the tile of trip `start` is issued before the loop, and each trip
issues the tile of the next trip into the other stage before computing on its own, so loads
overlap compute. Before (after `insert-sync`) / after, for K in `for n`:

    for n: barrier; cp.async K[n] → sK; commit g; wait<0>(g); barrier; gemm(sK)
    cp.async K[0] → sK[.., 0]; commit g0
    for n: stage = (n - 0) % 2; barrier; if n + 1 < N: cp.async K[n+1] → sK[.., 1 - stage]; commit g1
           wait<1>(g0); barrier; gemm(sK[.., stage])

Runs after `insert-sync` and rewrites the waits it moved; buffers that would not fit in
shared memory keep one stage (the reason is reported).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from tlc.diagnostics import fail
from tlc.kir import ops as K
from tlc.kir import ops_sm90 as H
from tlc.kir.expr import BinOp, Const, Expr, Index, Var, substitute
from tlc.kir.base import substitute_op
from tlc.kir.transforms.base import Facts, KernelTransform, Notes
from tlc.kir.transforms.schedule import CP_ASYNC_STAGES, Schedule

ALL = Var("_")
_LAYOUTS = (K.SmemLayoutOp, K.SmemTransposeLayoutOp, H.GmmaSmemLayoutOp)


def _staged(e: Expr, rank: dict[str, int], stage: Expr) -> Expr:
    """`t` → `t[_, …, stage]` for tensors derived from a staged buffer."""
    if isinstance(e, Var) and e.name in rank:
        return Index(e, (ALL,) * rank[e.name] + (stage,))
    return e


def _copies(body: tuple[K.Op, ...]) -> dict[str, list[int]]:
    """buffer → indices in `body` of the If-wrapped async copies writing it (and their commit)."""
    out: dict[str, list[int]] = {}
    for i, op in enumerate(body):
        if isinstance(op, K.AsyncCopyOp):
            out.setdefault(op.buffer, []).append(i)
        elif isinstance(op, K.IfOp) and op.body and all(isinstance(c, K.AsyncCopyOp) for c in op.body):
            out.setdefault(op.body[0].buffer, []).append(i)
    return out


class Pipeliner:
    def __init__(self, kernel: K.KernelOp, stages: int, smem_limit: int) -> None:
        self.kernel, self.stages, self.limit = kernel, stages, smem_limit
        self.reports: list[str] = []

    def run(self) -> K.KernelOp:
        body = list(self.kernel.body)
        for i, op in enumerate(list(body)):
            if isinstance(op, K.ForOp) and op.step == 1 and not op.unroll:
                body = self._loop(body, body.index(op))
        return dataclasses.replace(self.kernel, body=tuple(body))

    def _candidates(self, loop: K.ForOp, body: list[K.Op]) -> list[str]:
        writers: dict[str, int] = {}
        readers: dict[str, set[int]] = {}
        for op in K.walk(self.kernel):
            for b in op.effects().cp_async_writes:
                writers[b] = writers.get(b, 0) + 1
        inside = {id(x) for x in K.walk(loop)}
        for op in K.walk(self.kernel):
            for b in op.effects().shared_reads:
                readers.setdefault(b, set()).add(id(op) in inside)
        out = []
        for buf, idx in _copies(loop.body).items():
            copies = [c for i in idx for c in (loop.body[i].body if isinstance(loop.body[i], K.IfOp) else (loop.body[i],))]
            moves = all(loop.var in str(c.src) for c in copies)
            if moves and writers.get(buf) == len(copies) and readers.get(buf) == {True}:
                out.append(buf)
        return out

    def _loop(self, body: list[K.Op], at: int) -> list[K.Op]:
        loop: K.ForOp = body[at]
        bufs = self._candidates(loop, body)
        if not bufs or self.stages < 2:
            if bufs:
                self.reports.append(f"loop {loop.var}: one stage (Stages = {self.stages})")
            return body
        grown = self.grow(bufs)
        from tlc.lowering.tile_ops import smem_extent
        need = smem_extent([op for op in grown if isinstance(op, (*_LAYOUTS, K.SharedBufferOp))])
        if need > self.limit:
            self.reports.append(f"loop {loop.var}: one stage; {self.stages} stages of {', '.join(bufs)} would need "
                                f"{need} > {self.limit} bytes of shared memory")
            return body
        self.reports.append(f"loop {loop.var}: {self.stages} stages for {', '.join(bufs)} ({need} bytes of shared "
                            "memory); the next trip's tiles are issued before this trip's compute")
        rank = self.ranks(bufs)
        S, n = self.stages, loop.var
        stage, nxt = Var(f"{n}_stage"), BinOp("%", BinOp("+", Var(f"{n}_stage"), Const(1)), Const(S))
        copy_idx = sorted(i for b, idx in _copies(loop.body).items() if b in bufs for i in idx)
        commits = {i + 1 for i in copy_idx if i + 1 < len(loop.body) and isinstance(loop.body[i + 1], K.CommitOp)}
        moved = [loop.body[i] for i in copy_idx]
        groups = {loop.body[i].name for i in commits}

        def shifted(ifop: K.Op, value: Expr, st: Expr) -> K.Op:
            if isinstance(ifop, K.AsyncCopyOp):
                return shifted(K.IfOp(cond=Const(True), body=(ifop,), loc=ifop.loc), value, st).body[0]
            # every expression of the copy reads the trip it loads (its tile, limits, a gather's first row); its
            # destination is the stage it fills
            kids = tuple(dataclasses.replace(substitute_op(c, n, value), dst=_staged(c.dst, rank, st))
                         for c in ifop.body)
            return dataclasses.replace(ifop, cond=substitute(ifop.cond, n, value), body=kids)

        pro_grp, next_grp = f"{n}_pipe_first", f"{n}_pipe_next"
        prologue = [K.IfOp(cond=BinOp("<", loop.start, loop.stop), loc=loop.loc,
                           body=tuple(shifted(c, loop.start, Const(0)) for c in moved)),
                    K.CommitOp(name=pro_grp, tokens=(), loc=loop.loc)]
        prefetch = [K.IfOp(cond=BinOp("<", BinOp("+", Var(n), Const(1)), loop.stop), loc=loop.loc,
                           body=tuple(shifted(c, BinOp("+", Var(n), Const(1)), nxt) for c in moved)),
                    K.CommitOp(name=next_grp, tokens=(), loc=loop.loc)]
        new_body: list[K.Op] = [K.LetOp(name=f"{n}_stage", type="i32",
                                        value=BinOp("%", BinOp("-", Var(n), loop.start), Const(S)), loc=loop.loc)]
        # The prefetch goes where the last moved copy was: after every barrier that guarded the
        # copies against the previous trip's reads of the stage it now overwrites.
        last = max(copy_idx)
        for i, op in enumerate(loop.body):
            if i == last:
                new_body += prefetch
            if i in copy_idx or i in commits:
                continue
            new_body.append(self.restage(op, rank, stage))
        new_body = self._rewait(new_body, groups, pro_grp)
        new_loop = dataclasses.replace(loop, body=tuple(new_body), stages=S, prefetch=True)
        after = [self._after(op, groups) for op in body[at + 1:]]
        head = [self._restage_decl(op, rank) for op in body[:at]]
        self.kernel = dataclasses.replace(self.kernel, body=tuple(head + prologue + [new_loop] + after))
        self.apply_growth(grown)
        return list(self.kernel.body)

    # -- buffers and their derived tensors
    def grow(self, bufs: list[str]) -> list[K.Op]:
        """The kernel's layout and buffer ops with a stage mode on `bufs`, offsets reassigned."""
        layouts = {op.layout for op in self.kernel.body if isinstance(op, K.SharedBufferOp) and op.name in bufs}
        # A buffer seen through a transposed view of a GMMA layout (sm_90a's V) grows its base too.
        layouts |= {op.of for op in self.kernel.body if isinstance(op, K.SmemTransposeLayoutOp) and op.name in layouts}
        gmma = any(isinstance(op, H.GmmaSmemLayoutOp) for op in self.kernel.body)
        align = 1024 if gmma else 128   # GMMA's swizzle is by address: its tiles start 1024-byte aligned
        out, offset = [], 0
        sizes = {}
        for op in self.kernel.body:
            if isinstance(op, (K.SmemLayoutOp, H.GmmaSmemLayoutOp)) and op.name in layouts:
                op = dataclasses.replace(op, shape=op.shape + (self.stages,))
            if isinstance(op, K.SmemTransposeLayoutOp) and op.of in layouts:
                op = dataclasses.replace(op, shape=op.shape + (self.stages,))
            if isinstance(op, _LAYOUTS):
                n = 1
                for d in op.shape:
                    n *= d
                sizes[op.name] = n
            if isinstance(op, K.SharedBufferOp):
                nbytes = sizes[op.layout] * (4 if op.dtype == "fp32" else 2)
                op = dataclasses.replace(op, offset_bytes=0 if op.reuse else offset)
                if not op.reuse:
                    offset += -(-nbytes // align) * align
            if isinstance(op, (*_LAYOUTS, K.SharedBufferOp)):
                out.append(op)
        return out

    def apply_growth(self, grown: list[K.Op]) -> None:
        by_name = {op.name: op for op in grown}
        from tlc.lowering.tile_ops import smem_extent
        body = tuple(by_name.get(getattr(op, "name", None), op)
                     if isinstance(op, (*_LAYOUTS, K.SharedBufferOp)) else op
                     for op in self.kernel.body)
        self.kernel = dataclasses.replace(self.kernel, body=body, smem_bytes=smem_extent(list(grown)))

    def ranks(self, bufs: list[str]) -> dict[str, int]:
        rank = {b: 2 for b in bufs}
        for op in self.kernel.body:
            if isinstance(op, K.SharedViewOp) and op.of in rank:
                rank[op.name] = 2
        for op in self.kernel.body:
            if isinstance(op, K.PartitionOp) and isinstance(op.src, Var) and op.src.name in rank \
                    and op.method in ("partition_S", "partition_D", "partition_A", "partition_B"):
                rank[op.name] = 3
        for op in self.kernel.body:   # sm_90a: GMMA descriptors over every stage of a partition
            if isinstance(op, H.WgmmaFragmentOp) and isinstance(op.src, Var) and rank.get(op.src.name) == 3:
                rank[op.name] = 3
        return rank

    def restage(self, op: K.Op, rank: dict[str, int], stage: Expr) -> K.Op:
        if isinstance(op, K.CopyOp):
            return dataclasses.replace(op, src=_staged(op.src, rank, stage), dst=_staged(op.dst, rank, stage))
        if isinstance(op, H.WgmmaOp):
            return dataclasses.replace(op, a=_staged(op.a, rank, stage), b=_staged(op.b, rank, stage))
        if isinstance(op, (K.IfOp, K.ForOp)):
            return dataclasses.replace(op, body=tuple(self.restage(c, rank, stage) for c in op.body))
        return op

    def _restage_decl(self, op: K.Op, rank: dict[str, int]) -> K.Op:
        if isinstance(op, K.FragmentOp) and op.src is not None:
            return dataclasses.replace(op, src=_staged(op.src, rank, Const(0)))
        return op

    # -- waits
    @staticmethod
    def _rewait(body: list[K.Op], moved_groups: set[str], prev: str) -> list[K.Op]:
        """Waits for the moved copies now wait for the previous trip's group (older than every
        group committed so far in this trip); a second such wait is dropped with its barrier."""
        out: list[K.Op] = []
        committed: list[str] = []
        waited_prev = False
        skip_barrier = False
        for op in body:
            if skip_barrier and isinstance(op, H.FenceProxyAsyncOp):
                continue   # the dropped wait's fence goes with it
            if skip_barrier and isinstance(op, K.BarrierOp):
                skip_barrier = False
                continue
            skip_barrier = False
            if isinstance(op, K.CommitOp):
                committed.append(op.name)
            if isinstance(op, K.WaitOp):
                if set(op.groups) & moved_groups:
                    if waited_prev:
                        skip_barrier = True
                        continue
                    waited_prev = True
                    op = dataclasses.replace(op, pending=len(committed), groups=(prev,))
                elif op.groups and op.groups[0] in committed:
                    op = dataclasses.replace(op, pending=len(committed) - 1 - committed.index(op.groups[0]))
            out.append(op)
        return out

    @staticmethod
    def _after(op: K.Op, moved_groups: set[str]) -> K.Op:
        if isinstance(op, K.WaitOp) and set(op.groups) & moved_groups:
            return dataclasses.replace(op, pending=0)
        return op


def pipeline_kernel(kernel: K.KernelOp, stages: int, smem_limit: int) -> tuple[K.KernelOp, list[str]]:
    p = Pipeliner(kernel, stages, smem_limit)
    return p.run(), p.reports


@dataclass(frozen=True)
class PipelineTransform(KernelTransform):
    """Multi-stage cp.async copies of each loop. Stages: the `stages` option, else the schedule's (`Param
    Stages`, 2 by default; one where two do not fit the target's shared memory). A warp-specialised kernel
    is left as it is: its TMA ring already holds the stages."""

    name: ClassVar[str] = "pipeline"
    stages: int = 0

    def rewrite(self, kernel: K.KernelOp, schedule: Schedule, facts: Facts) -> tuple[K.KernelOp, Notes]:
        if any(isinstance(op, H.WarpSpecializeOp) for op in K.walk(kernel)):
            return kernel, []
        stages = self.stages or schedule.stages
        if not self.stages and stages > 2:   # the schedule allowed a TMA ring, which warp-specialize declined
            raise fail(f"Param Stages = {stages!r}: {CP_ASYNC_STAGES}", schedule.loc("Stages"))
        return pipeline_kernel(kernel, stages, facts.arch.smem_per_block)
