"""`LoweringState`: what the lowering passes (select-atoms → pipeline → check-resources)
accumulate on the `PassContext` while the TL graph stays as the TL passes left it.

select-atoms fills the target choices, pipeline the schedule and the kernel IR,
check-resources the resource report; `describe()` is what `--print-after` shows.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tlc.arch import ArchInfo, arch_info
from tlc.diagnostics import Loc
from tlc.kir.ops import ProgramOp

# What `tlc build` assumes without --arch; `tlc show` uses it when no target is named.
DEFAULT_ARCH = "sm_90"


@dataclass(frozen=True)
class OperandLoad:
    """How one GEMM operand reaches registers: ldmatrix, ldmatrix.trans, or already there."""

    gemm: str        # "S = Q·K.T"
    role: str        # "A" or "B"
    tensor: str      # the TL name
    major: str       # "k" or "mn" (resolve-transpose), "acc" for a regrouped accumulator
    load: str        # "ldmatrix", "ldmatrix.trans" or "registers"
    atom: str        # the CuTe copy atom ("" for registers)
    loc: Loc | None = None


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
    shape: Any = None            # tlc.lowering.select_atoms.AttentionShape
    config: Any = None           # tlc.kir.flash_fwd.FlashFwdConfig
    mma_atom: str = ""
    warps: tuple[int, int, int] = (1, 1, 1)
    loads: list[OperandLoad] = field(default_factory=list)
    swizzles: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    tl_allocs: dict[str, tuple[str, Loc]] = field(default_factory=dict)  # TL name@space → (statement, loc)
    stages: int = 0
    stages_reason: str = ""
    prefetch: str = ""
    kir: ProgramOp | None = None
    resources: ResourceReport | None = None

    def describe_atoms(self) -> str:
        s = self.shape
        lines = [f"// target {self.arch.name}: {self.arch.mma_path}, "
                 f"{self.arch.smem_per_block} B shared memory per block, {self.arch.regs_per_thread} registers per thread",
                 f"specialization {self.name}: dtype {s.dtype}, d_qk {s.d_qk}, d_v {s.d_v}, BM {s.bm}, BN {s.bn}, "
                 f"causal {str(s.causal).lower()}" + (f" ({s.alignment})" if s.causal else ""),
                 f"mma atom {self.mma_atom}, warps (M, N, K) = {self.warps}"]
        for ld in self.loads:
            if ld.load == "registers":
                lines.append(f"operand {ld.role} of {ld.gemm}: {ld.tensor} regrouped accumulator → registers")
            else:
                lines.append(f"operand {ld.role} of {ld.gemm}: {ld.tensor} {ld.major}-major → {ld.load} ({ld.atom})")
        for buf, sw in self.swizzles.items():
            lines.append(f"shared {buf}: Swizzle<{sw[0]},{sw[1]},{sw[2]}>")
        return "\n".join(lines) + "\n"


def get_state(ctx: Any) -> LoweringState | None:
    """The state on `ctx` (PassContext carries it as the `lowering` attribute), if any."""
    return ctx.lowering


def start_state(ctx: Any, arch: str, name: str = "tl_kernel", lse: bool = False) -> LoweringState:
    """A fresh state for target `arch` on `ctx` (an unknown arch is a clear TlcError)."""
    state = LoweringState(arch=arch_info(arch), name=name, lse=lse)
    ctx.lowering = state
    return state
