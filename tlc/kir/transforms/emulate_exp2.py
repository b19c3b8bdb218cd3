"""`emulate-exp2` (`Param Exp2Poly = k`, k > 0): every k-th exp2 of each thread's scores by a polynomial
on the FMA pipe (tlc::exp2_poly) instead of the MUFU unit.

MUFU's 16 results per clock and SM bound the softmax when the head dim is small (d = 64: as many cycles
of exp2 as of wgmma per tile). The transform sets `poly_every = k` on every `Exp2ScaleOp`; the emitter
spells the choice. 0 (the default): every exp2 on MUFU. Measured slower on an H200 at d = 64 (k = 8
0.96×, 4 0.92×, 2 0.82×, docs/lowering.md): each emulated exp2 costs about eight issue slots there, and
issue, not MUFU, binds.

    Exp2ScaleOp(target=acc_S, row_max=m, scale_log2=…, poly_every=0)
    →  Exp2ScaleOp(target=acc_S, row_max=m, scale_log2=…, poly_every=4)        (Exp2Poly = 4)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tlc.kir.ops import Exp2ScaleOp, KernelOp
from tlc.kir.transforms.base import Facts, KernelTransform, Notes, set_on_every
from tlc.kir.transforms.schedule import Schedule


@dataclass(frozen=True)
class EmulateExp2Transform(KernelTransform):
    name: ClassVar[str] = "emulate-exp2"

    def rewrite(self, kernel: KernelOp, schedule: Schedule, facts: Facts) -> tuple[KernelOp, Notes]:
        every = schedule.exp2_poly
        if not every:
            return kernel, []
        kernel, count = set_on_every(kernel, Exp2ScaleOp, poly_every=every)
        return kernel, [f"emulate-exp2: every {every}th exp2 of {count} score exp2 site(s) by polynomial on the "
                        "FMA pipe"]
