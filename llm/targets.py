"""Target facts for the stage-2 and translation prompts: SMs, shared memory, registers, atoms.

tlc wants these generated from tlc's arch table. When `tlc.arch` exists and knows the
target we read it from there; until then (and for targets it lacks) this small table, from
the CUDA programming guide's per-arch limits and CUTLASS's atom names, is the source.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, replace
from typing import Any


class TargetError(ValueError):
    """An unknown target name; the message lists the known ones."""


@dataclass(frozen=True)
class TargetFacts:
    name: str  # the --target spelling, e.g. sm_90
    gpus: str
    sms: int
    smem_per_block: int  # bytes, opt-in maximum (above 48 KiB needs cuFuncSetAttribute)
    smem_per_sm: int
    registers_per_block: int
    registers_per_thread: int
    mma_atoms: tuple[str, ...]
    copy_atoms: tuple[str, ...]
    dtypes: tuple[str, ...]
    notes: str = ""
    source: str = "tlc_llm.targets"

    def render(self, dtype: str) -> str:
        """The bullet list the prompts show; `dtype` filters the MMA atoms to the ones that apply."""
        tag = "BF16BF16" if dtype == "bf16" else "F16F16"
        atoms = [a for a in self.mma_atoms if tag in a] or list(self.mma_atoms)
        lines = [
            f"- target: {self.name} ({self.gpus})",
            f"- streaming multiprocessors: {self.sms}",
            f"- shared memory per thread block: {self.smem_per_block} bytes ({self.smem_per_block // 1024} KiB); "
            f"per SM: {self.smem_per_sm} bytes",
            f"- registers: {self.registers_per_block} 32-bit per block, at most {self.registers_per_thread} per thread",
            f"- MMA atoms for {dtype}: {', '.join(atoms)}",
            f"- copy atoms: {', '.join(self.copy_atoms)}",
            f"- element types: {', '.join(self.dtypes)}; accumulate in fp32",
        ]
        if self.notes:
            lines.append(f"- notes: {self.notes}")
        return "\n".join(lines)


_SM80_COPY = (
    "SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t> (global→shared, 16 B per thread)",
    "SM75_U32x4_LDSM_N (ldmatrix, shared→register)",
    "SM75_U16x8_LDSM_T (ldmatrix.trans, for a transposed B operand)",
    "AutoVectorizingCopyWithAssumedAlignment<128> (register→global)",
)
_SM80_MMA = ("SM80_16x8x16_F32BF16BF16F32_TN", "SM80_16x8x16_F32F16F16F32_TN")

TABLE: dict[str, TargetFacts] = {
    "sm_75": TargetFacts(
        "sm_75", "T4, Quadro RTX 8000", 40, 65536, 65536, 65536, 255,
        ("SM75_16x8x8_F32F16F16F32_TN",),
        ("SM75_U32x4_LDSM_N (ldmatrix)", "SM75_U16x8_LDSM_T (ldmatrix.trans)", "UniversalCopy<cute::uint128_t>"),
        ("fp16",), "no cp.async: global→shared copies go through registers; no bf16 tensor cores",
    ),
    "sm_80": TargetFacts("sm_80", "A100", 108, 166912, 167936, 65536, 255, _SM80_MMA, _SM80_COPY, ("bf16", "fp16")),
    "sm_86": TargetFacts("sm_86", "A10, RTX 3090, A6000", 84, 101376, 102400, 65536, 255, _SM80_MMA, _SM80_COPY,
                         ("bf16", "fp16")),
    "sm_89": TargetFacts("sm_89", "L4, L40, RTX 4090", 128, 101376, 102400, 65536, 255, _SM80_MMA, _SM80_COPY,
                         ("bf16", "fp16")),
    "sm_90": TargetFacts(
        "sm_90", "H100 / H200 (sm_80-family code path: mma.sync, cp.async, ldmatrix)", 132, 232448, 233472,
        65536, 255, _SM80_MMA, _SM80_COPY, ("bf16", "fp16"),
    ),
    "sm_90a": TargetFacts(
        "sm_90a", "H100 / H200 (Hopper path: wgmma, TMA, mbarriers)", 132, 232448, 233472, 65536, 255,
        ("SM90_64xNx16_F32BF16BF16_SS (wgmma, N in 8..256 step 8)", "SM90_64xNx16_F32F16F16_SS",
         "SM90_64xNx16_F32BF16BF16_RS (A from registers)", "SM90_64xNx16_F32F16F16_RS"),
        ("SM90_TMA_LOAD (global→shared, bulk tensor copy, mbarrier completion)",
         "SM90_TMA_STORE", *_SM80_COPY),
        ("bf16", "fp16"), "wgmma reads A and B from shared memory; a warpgroup is 128 threads",
    ),
}


def _from_tlc(name: str) -> TargetFacts | None:
    """Facts from `tlc.arch` when it exists and knows `name`; fields it lacks keep our values."""
    try:
        arch = importlib.import_module("tlc.arch")
    except ImportError:
        return None
    getter = getattr(arch, "get", None) or getattr(arch, "get_arch", None)
    entry: Any = None
    if callable(getter):
        try:
            entry = getter(name)
        except Exception:  # noqa: BLE001 - an unknown target there is not an error here
            entry = None
    if entry is None:
        table = getattr(arch, "ARCHS", None) or getattr(arch, "TABLE", None)
        entry = table.get(name) if isinstance(table, dict) else None
    base = TABLE.get(name)
    if entry is None or base is None:
        return None
    fields = {}
    for ours in ("sms", "smem_per_block", "smem_per_sm", "registers_per_block", "registers_per_thread"):
        value = getattr(entry, ours, None)
        if isinstance(value, int):
            fields[ours] = value
    return replace(base, source="tlc.arch", **fields) if fields else None


def target_facts(name: str) -> TargetFacts:
    facts = _from_tlc(name) or TABLE.get(name)
    if facts is None:
        raise TargetError(f"unknown target {name!r}: expected one of {', '.join(TABLE)}")
    return facts
