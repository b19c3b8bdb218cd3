"""The kernel-IR transform interface: a frozen dataclass with a kebab-case `name` (its module's name)
and `apply(program, schedule, facts) -> (program, notes)`.

Options are dataclass fields, written `pipeline{stages=3}` in a pass list; the knobs a program sets
come in the `Schedule`; what only the TL graph can prove comes in the `Facts`. A transform returns the
program it leaves (the same object when it changes nothing) and its schedule notes, one line each,
`<name>: what it did` or `<name>: kept …: why not` — `tlc show --print-after` and `tlc build`'s knob
warnings read them.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from tlc.arch import ArchInfo
from tlc.kir.ops import KernelOp, ProgramOp, rewrite_ops, walk
from tlc.kir.transforms.schedule import Schedule

Notes = list[str]


@dataclass(frozen=True)
class Facts:
    """What a transform needs beyond the kernel IR and the schedule: the target, and what the TL graph
    proves about the program. The lowering driver computes them once (tlc.lowering.facts); on kernel-IR
    text they are given (`tlc opt --arch`, `--fact`) or assumed: a precondition left None holds."""

    arch: ArchInfo
    # lazy-rescale's precondition: why a running max that lags the true one would change the result
    stale_max: str | None = None
    # skip-masked-trips' precondition: why a trip whose scores are all masked changes what the loop carries
    masked_trips: str | None = None


@dataclass(frozen=True)
class Transform:
    """A kernel-IR → kernel-IR rewrite; subclasses set `name` and implement `apply`."""

    name: ClassVar[str] = ""

    def apply(self, program: ProgramOp, schedule: Schedule, facts: Facts) -> tuple[ProgramOp, Notes]:
        raise NotImplementedError


@dataclass(frozen=True)
class KernelTransform(Transform):
    """A transform of each kernel on its own: `rewrite(kernel, schedule, facts) -> (kernel, notes)`;
    the parameter struct and the other top-level ops stay."""

    def rewrite(self, kernel: KernelOp, schedule: Schedule, facts: Facts) -> tuple[KernelOp, Notes]:
        raise NotImplementedError

    def apply(self, program: ProgramOp, schedule: Schedule, facts: Facts) -> tuple[ProgramOp, Notes]:
        body, notes = [], []
        for op in program.body:
            if isinstance(op, KernelOp):
                op, more = self.rewrite(op, schedule, facts)
                notes += more
            body.append(op)
        if all(new is old for new, old in zip(body, program.body)):
            return program, notes
        return dataclasses.replace(program, body=tuple(body)), notes


def set_on_every(kernel: KernelOp, cls: type, **values: object) -> tuple[KernelOp, int]:
    """The kernel with `values` set on every `cls` op, and how many there are."""
    body = rewrite_ops(kernel.body, lambda op: dataclasses.replace(op, **values) if isinstance(op, cls) else op)
    kernel = dataclasses.replace(kernel, body=body)
    return kernel, sum(isinstance(op, cls) for op in walk(kernel))
