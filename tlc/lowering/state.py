"""`LoweringState`: what the lowering passes (lower-tile-ops → … → check-resources) accumulate
on the `PassContext` while the TL graph stays as the TL passes left it: the kernel IR, the
launch ABI, the schedule knobs and the facts the transforms read, their notes and the resource report.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tlc.arch import ArchInfo, arch_info
from tlc.diagnostics import Loc
from tlc.kir.ops import ProgramOp
from tlc.kir.transforms.base import Facts
from tlc.kir.transforms.schedule import Schedule

# What `tlc build` assumes without --arch; `tlc show` uses it when no target is named.
DEFAULT_ARCH = "sm_90"


@dataclass(frozen=True)
class Allocation:
    """One resource user in check-resources' report, tied back to its TL statement."""

    name: str        # kernel-IR name (sQ, acc_o)
    tl: str          # the TL statement it implements, in words
    bytes: int       # shared bytes, or registers per thread for register allocations
    loc: Loc | None
    note: str = ""   # e.g. "reuses sQ"


@dataclass(frozen=True)
class ResourceReport:
    smem: tuple[Allocation, ...]
    smem_bytes: int
    smem_limit: int
    regs: tuple[Allocation, ...]
    regs_resident: int   # accumulators and row vectors: live across the whole KV loop
    regs_peak: int       # plus the operand fragments of the hungriest GEMM (estimate, no addressing)
    regs_limit: int

    def describe(self) -> str:
        lines = [f"shared memory: {self.smem_bytes} of {self.smem_limit} bytes per block"]
        lines += [f"  {a.name:<8} {a.bytes:>7} B  {a.tl}" + (f"  ({a.note})" if a.note else "") for a in self.smem]
        lines.append(f"registers per thread (estimate): resident {self.regs_resident}, peak {self.regs_peak} "
                     f"of {self.regs_limit}")
        lines += [f"  {a.name:<9} {a.bytes:>6}    {a.tl}" + (f"  ({a.note})" if a.note else "") for a in self.regs]
        return "\n".join(lines)


@dataclass
class LoweringState:
    arch: ArchInfo
    name: str = "tl_kernel"
    lse: bool = False
    kir: ProgramOp | None = None
    abi: Any = None              # tlc.lowering.abi.LaunchABI
    loc: Loc | None = None       # the first GEMM: where program-wide problems are reported
    tl_allocs: dict[str, tuple[str, Loc | None]] = field(default_factory=dict)  # shared buffer → (statement, loc)
    layout_notes: list[str] = field(default_factory=list)
    knobs: Schedule = field(default_factory=Schedule)   # parsed from the Params by lower-tile-ops
    facts: Facts | None = None                          # what the TL graph proves (lower-tile-ops)
    schedule: list[str] = field(default_factory=list)   # the transforms' notes, in pipeline order
    partial_copies: list[tuple[str, str, Loc | None]] = field(default_factory=list)  # tile_ops.partial_copies
    stages: int = 0
    resources: ResourceReport | None = None


def get_state(ctx: Any) -> LoweringState | None:
    """The state on `ctx` (PassContext carries it as the `lowering` attribute), if any."""
    return ctx.lowering


def start_state(ctx: Any, arch: str, name: str = "tl_kernel", lse: bool = False) -> LoweringState:
    """A fresh state for target `arch` on `ctx` (an unknown arch is a clear TlcError)."""
    state = LoweringState(arch=arch_info(arch), name=name, lse=lse)
    ctx.lowering = state
    return state
