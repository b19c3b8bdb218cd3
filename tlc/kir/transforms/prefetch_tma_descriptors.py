"""`prefetch-tma-descriptors` (sm_90a, `Param PrefetchTma`): each TMA descriptor is prefetched
(`prefetch.tensormap`) by the thread that initialises the mbarriers, before the CTA's first barrier.

A CTA's first TMA load otherwise waits for its descriptor's 128 bytes to come from the kernel
parameters in memory before the load itself can start; with one tile per CTA that latency is paid on
every tile's critical path (Q before the first GEMM). Prefetched while the barriers are set up, it
overlaps that setup.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from tlc.kir import ops as K
from tlc.kir import ops_sm90 as H
from tlc.kir.transforms.base import Facts, KernelTransform, Notes
from tlc.kir.transforms.schedule import Schedule


def prefetch_descriptors(kernel: K.KernelOp) -> tuple[K.KernelOp, list[str]]:
    descs = [op.name for op in kernel.body if isinstance(op, H.TmaDescriptorOp)]
    init = next((i for i, op in enumerate(kernel.body) if isinstance(op, K.IfOp)
                 and any(isinstance(b, H.MbarrierInitOp) for b in op.body)), None)
    if not descs or init is None:
        return kernel, ["prefetch-tma-descriptors: no TMA descriptor and mbarrier set-up at the kernel's top level"]
    block = kernel.body[init]
    prefetch = tuple(H.TmaPrefetchOp(desc=d) for d in descs)
    body = (*kernel.body[:init], dataclasses.replace(block, body=prefetch + block.body), *kernel.body[init + 1:])
    return dataclasses.replace(kernel, body=body), [f"prefetch-tma-descriptors: {', '.join(descs)}"]


@dataclass(frozen=True)
class PrefetchTmaDescriptorsTransform(KernelTransform):
    """`Param PrefetchTma = true` (schedule.prefetch_tma): the descriptors fetched while the mbarriers are
    set up; off by default."""

    name: ClassVar[str] = "prefetch-tma-descriptors"

    def rewrite(self, kernel: K.KernelOp, schedule: Schedule, facts: Facts) -> tuple[K.KernelOp, Notes]:
        if not schedule.prefetch_tma:
            return kernel, []
        return prefetch_descriptors(kernel)
