"""The target table: what `lower-tile-ops`, `pipeline` and `check-resources` (and the LLM
workflow's prompts) know about each `--arch`. One `ArchInfo` per target; `arch_info(name)`.

Sources, all well-known published values:
  [PG]  CUDA C++ Programming Guide, "Compute Capabilities" → "Technical Specifications per
        Compute Capability" (shared memory per block / per SM, registers, threads per SM).
  [PTX] PTX ISA, "Warp-level matrix multiply-accumulate instructions" (mma.m16n8k16 for
        .f16/.bf16 since sm_80), "cp.async" (sm_80), "ldmatrix" (sm_75), "wgmma" (sm_90a
        only), "cp.async.bulk.tensor" (TMA, sm_90).
  [DS]  NVIDIA datasheets / architecture whitepapers for SM counts (A100: 108 SMs; A10: 72;
        RTX 3090: 82; L4: 58; RTX 4090: 128; H100 SXM and H200: 132; H100 PCIe: 114).
"tlc's sm_90" is the sm_80-family code path compiled for Hopper (an sm_80 cubin does not
load there); "sm_90a" is the Hopper path: wgmma GEMMs, TMA loads in mbarrier rings and warp-specialized
producer/consumer warp groups (docs/hopper.md). Each arch's `mma_path` picks its family of lowering rules
(tlc/lowering/rules.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tlc.diagnostics import fail

KB = 1024

# CuTe atom names, printed verbatim into the kernel IR (see tlc.kir.base.MMA_ATOMS / COPY_ATOMS).
SM80_MMA_ATOMS = {"bf16": "SM80_16x8x16_F32BF16BF16F32_TN", "fp16": "SM80_16x8x16_F32F16F16F32_TN"}
_SM80_MMA = SM80_MMA_ATOMS
# wgmma's N is chosen per tile (8..256); the table names the family.
_SM90_MMA = {"bf16": "SM90_64xNx16_F32BF16BF16_SS", "fp16": "SM90_64xNx16_F32F16F16_SS"}
_CP_ASYNC = "SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>"  # [PTX] cp.async.cg, 16 bytes per thread
_LDSM = "SM75_U32x4_LDSM_N"                               # [PTX] ldmatrix.x4: K-contiguous operands
_LDSM_T = "SM75_U16x8_LDSM_T"                             # [PTX] ldmatrix.x4.trans: MN-contiguous operands
_TMA = "SM90_TMA_LOAD"                                    # [PTX] cp.async.bulk.tensor


@dataclass(frozen=True)
class ArchInfo:
    """One compilation target. Byte counts are per thread block unless the name says SM."""

    name: str
    compute_capability: tuple[int, int]
    gpus: dict[str, int]                  # example GPUs → SM count [DS]
    smem_per_block: int                   # opt-in maximum dynamic shared memory per block, bytes [PG]
    smem_per_sm: int                      # [PG]
    smem_default_per_block: int           # without cudaFuncSetAttribute: 48 KB [PG]
    regs_per_thread: int                  # [PG]
    regs_per_sm: int                      # 64K 32-bit registers [PG]
    max_threads_per_sm: int               # [PG]
    mma_path: str                         # "mma.sync" (sm_80 family) or "wgmma" (Hopper path)
    mma_atoms: dict[str, str]             # dtype → MMA atom
    mma_shape: tuple[int, int, int]       # M, N, K of one atom (wgmma: N varies, 64xNx16)
    copy_atoms: dict[str, str] = field(default_factory=dict)  # role → copy atom
    cp_async_bytes: int = 16              # bytes one thread moves per cp.async [PTX]
    tma: bool = False
    nvrtc_arch: str = ""                  # what NVRTC is given (-arch=)

    @property
    def family(self) -> str:
        return "sm_80" if self.mma_path == "mma.sync" else "sm_90a"

    def describe(self) -> str:
        """A few lines for prompts and `tlc show`."""
        gpus = ", ".join(f"{g} ({n} SMs)" for g, n in self.gpus.items())
        atoms = ", ".join(f"{d}: {a}" for d, a in self.mma_atoms.items())
        return (f"{self.name} (compute capability {self.compute_capability[0]}.{self.compute_capability[1]}; {gpus})\n"
                f"  shared memory: {self.smem_per_block // KB} KB per block (opt-in), {self.smem_per_sm // KB} KB per SM\n"
                f"  registers: {self.regs_per_thread} per thread, {self.regs_per_sm // KB}K per SM\n"
                f"  MMA: {self.mma_path}, {atoms}\n"
                f"  copies: {', '.join(f'{k}: {v}' for k, v in self.copy_atoms.items())}")


def _sm80_family(name: str, cc: tuple[int, int], gpus: dict[str, int], smem_block_kb: int, smem_sm_kb: int,
                 threads_sm: int) -> ArchInfo:
    return ArchInfo(name=name, compute_capability=cc, gpus=gpus, smem_per_block=smem_block_kb * KB,
                    smem_per_sm=smem_sm_kb * KB, smem_default_per_block=48 * KB, regs_per_thread=255,
                    regs_per_sm=64 * KB, max_threads_per_sm=threads_sm, mma_path="mma.sync",
                    mma_atoms=dict(_SM80_MMA), mma_shape=(16, 8, 16),
                    copy_atoms={"g2s": _CP_ASYNC, "s2r": _LDSM, "s2r_trans": _LDSM_T},
                    nvrtc_arch=name)


ARCHES: dict[str, ArchInfo] = {
    # [PG] CC 8.0: 163 KB per block, 164 KB per SM, 2048 threads per SM.
    "sm_80": _sm80_family("sm_80", (8, 0), {"A100": 108, "A30": 56}, 163, 164, 2048),
    # [PG] CC 8.6: 99 KB per block, 100 KB per SM, 1536 threads per SM.
    "sm_86": _sm80_family("sm_86", (8, 6), {"A10": 72, "RTX 3090": 82}, 99, 100, 1536),
    # [PG] CC 8.9: 99 KB per block, 100 KB per SM, 1536 threads per SM.
    "sm_89": _sm80_family("sm_89", (8, 9), {"L4": 58, "RTX 4090": 128}, 99, 100, 1536),
    # [PG] CC 9.0: 227 KB per block, 228 KB per SM, 2048 threads per SM. tlc's sm_90 runs the
    # sm_80-family kernels (mma.sync, cp.async, ldmatrix) compiled for Hopper.
    "sm_90": _sm80_family("sm_90", (9, 0), {"H100 SXM": 132, "H200": 132, "H100 PCIe": 114}, 227, 228, 2048),
    # The Hopper path: wgmma and setmaxnreg need the arch-specific sm_90a target [PTX]. TMA exists
    # on sm_90 too, but only this path uses it.
    "sm_90a": ArchInfo(name="sm_90a", compute_capability=(9, 0), gpus={"H100 SXM": 132, "H200": 132, "H100 PCIe": 114},
                       smem_per_block=227 * KB, smem_per_sm=228 * KB, smem_default_per_block=48 * KB,
                       regs_per_thread=255, regs_per_sm=64 * KB, max_threads_per_sm=2048, mma_path="wgmma",
                       mma_atoms=dict(_SM90_MMA), mma_shape=(64, 0, 16),
                       copy_atoms={"g2s": _TMA, "g2s_fallback": _CP_ASYNC, "s2r": _LDSM, "s2r_trans": _LDSM_T},
                       tma=True, nvrtc_arch="sm_90a"),
}


def arch_info(name: str) -> ArchInfo:
    """The table entry for `--arch name`; a clear error listing the known targets otherwise."""
    info = ARCHES.get(name)
    if info is None:
        raise fail(f"unknown target '{name}': tlc knows {', '.join(ARCHES)} "
                   "(sm_80 family: mma.sync, cp.async, ldmatrix; sm_90a: the Hopper wgmma/TMA path)")
    return info
