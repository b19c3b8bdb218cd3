"""`insert-sync`: cp.async waits and CTA barriers from the shared-memory effects the kernel-IR ops declare.

The lowering emits copies and compute with no synchronization; this pass adds exactly what the
effects require, walking each region in order with the async groups still in flight:

    read of a buffer an in-flight group writes → cp.async.wait_group N (N = newer groups) + barrier
        (sm_90a: + fence.proxy.async between them when a wgmma reads what the retired groups wrote)
    read of a buffer written by registers       → barrier (other threads wrote it); fence.proxy.async
        first when the reader is a TMA store
    write to a buffer read since the last barrier (write-after-read, also across loop trips) → barrier
    a group still in flight at the kernel's end                          → cp.async.wait_group 0

Buffers overlap when their bytes do (an epilogue staging tile over dead operand tiles). In a
warp-specialised kernel (`warp-specialize`) only the consumers' region is walked: its barriers are
named barriers among the consumer threads (the producer's TMA loads synchronise through mbarriers).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

from tlc.kir import ops as K
from tlc.kir import ops_sm90 as H
from tlc.kir.effects import Effect
from tlc.kir.transforms.base import Facts, KernelTransform, Notes
from tlc.kir.transforms.schedule import Schedule


@dataclass
class _State:
    groups: list[tuple[str, frozenset[str]]] = field(default_factory=list)
    uncommitted: set[str] = field(default_factory=set)
    dirty: set[str] = field(default_factory=set)      # written by registers since the last barrier
    read: set[str] = field(default_factory=set)       # read since the last barrier

    def copy(self) -> "_State":
        return _State(list(self.groups), set(self.uncommitted), set(self.dirty), set(self.read))

    def merge(self, other: "_State") -> "_State":
        names = [g for g, _ in self.groups]
        groups = list(self.groups) + [g for g in other.groups if g[0] not in names]
        return _State(groups, self.uncommitted | other.uncommitted, self.dirty | other.dirty, self.read | other.read)


def _extent(kernel: K.KernelOp) -> dict[str, tuple[int, int]]:
    """Byte range of each shared buffer (the resource model's accounting, one definition)."""
    from tlc.lowering.resources import shared_buffers

    return {b.name: (b.offset, b.offset + b.bytes) for b in shared_buffers(kernel)}


class _Sync:
    def __init__(self, kernel: K.KernelOp) -> None:
        self.span = _extent(kernel)
        self.views = {op.name: op.of for op in K.walk(kernel) if isinstance(op, K.SharedViewOp)}
        # Buffers wgmma reads through the async proxy: cp.async writes to them need a proxy fence.
        self.async_reads = {b for op in K.walk(kernel) if Effect.WGMMA in op.effects().kinds
                            for b in op.effects().shared_reads}
        self.threads = kernel.threads
        self.named_barrier: int | None = None   # threads of the consumers' named barrier, inside their region

    def _hits(self, a: str, names: set[str] | frozenset[str]) -> bool:
        """Whether buffer `a` shares bytes with any of `names`."""
        a = self.views.get(a, a)
        lo, hi = self.span.get(a, (0, 0))
        for b in names:
            b = self.views.get(b, b)
            blo, bhi = self.span.get(b, (0, 0))
            if a == b or (lo < bhi and blo < hi):
                return True
        return False

    def _barrier(self, st: _State, out: list[K.Op], loc) -> None:
        if self.named_barrier is None:
            out.append(K.BarrierOp(loc=loc))
        else:
            out.append(H.NamedBarrierOp(id=0, threads=self.named_barrier, loc=loc))
        st.dirty.clear()
        st.read.clear()

    def _wait_for(self, names: set[str], st: _State, out: list[K.Op], loc) -> None:
        newest = max((i for i, (_, written) in enumerate(st.groups) if any(self._hits(n, written) for n in names)),
                     default=None)
        if newest is not None:
            out.append(K.WaitOp(pending=len(st.groups) - 1 - newest, groups=(st.groups[newest][0],), loc=loc))
            if any(self._hits(b, written) for _, written in st.groups[:newest + 1] for b in self.async_reads):
                out.append(H.FenceProxyAsyncOp(loc=loc))
            st.groups = st.groups[newest + 1:]
            self._barrier(st, out, loc)

    def region(self, ops: tuple[K.Op, ...], st: _State) -> list[K.Op]:
        out: list[K.Op] = []
        for op in ops:
            if isinstance(op, H.WarpSpecializeOp):
                self.named_barrier = self.threads - op.producer_threads
                consumer = self.region(op.consumer, _State())
                self.named_barrier = None
                out.append(dataclasses.replace(op, consumer=tuple(consumer)))
                continue
            if isinstance(op, K.ForOp) and not op.unroll:
                trial = st.copy()
                self.region(op.body, trial)
                entry = st.merge(trial)
                body = self.region(op.body, entry)
                out.append(dataclasses.replace(op, body=tuple(body)))
                merged = st.merge(entry)
                st.groups, st.uncommitted, st.dirty, st.read = merged.groups, merged.uncommitted, merged.dirty, merged.read
                continue
            if isinstance(op, K.CommitOp):
                st.groups.append((op.name, frozenset(st.uncommitted)))
                st.uncommitted = set()
                out.append(op)
                continue
            # An If and an unrolled k-block loop sync as one op: what the ops inside them do.
            effects = K.nested_effects(op)
            writes, reads, reg_writes = effects.cp_async_writes, effects.shared_reads, effects.shared_writes
            touched = reads | reg_writes
            # A wgmma's waits and barriers go before its operand fences and wgmma.fence.
            at = len(out)
            while isinstance(op, H.WgmmaOp) and at and isinstance(out[at - 1], (H.WgmmaFenceOperandOp, H.WgmmaArriveOp)):
                at -= 1
            out, issued = out[:at], out[at:]
            if touched:
                self._wait_for(touched, st, out, op.loc)
            if any(self._hits(r, st.dirty) for r in reads):
                if Effect.TMA in effects.kinds:
                    out.append(H.FenceProxyAsyncOp(loc=op.loc))   # register writes → the TMA store's async proxy
                self._barrier(st, out, op.loc)
            if any(self._hits(w, st.read) for w in writes | reg_writes):
                self._barrier(st, out, op.loc)
            out += issued
            out.append(op)
            st.uncommitted |= writes
            st.read |= reads
            st.dirty |= reg_writes
        return out


def insert_sync(kernel: K.KernelOp) -> K.KernelOp:
    """…and a CTA retires its cp.async groups before it ends: a group that may still be in flight there (a
    loop that ran no trip never waited for the tile loaded before it) gets a final wait, so no copy lands in
    the shared memory of a CTA that has exited."""
    st = _State()
    body = _Sync(kernel).region(kernel.body, st)
    if st.groups:
        body.append(K.WaitOp(pending=0, groups=(st.groups[-1][0],), loc=kernel.loc))
    return dataclasses.replace(kernel, body=tuple(body))


@dataclass(frozen=True)
class InsertSyncTransform(KernelTransform):
    """cp.async waits and barriers from the shared-memory effects; no schedule knob."""

    name: ClassVar[str] = "insert-sync"

    def rewrite(self, kernel: K.KernelOp, schedule: Schedule, facts: Facts) -> tuple[K.KernelOp, Notes]:
        return insert_sync(kernel), []
