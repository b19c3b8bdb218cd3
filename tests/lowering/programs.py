"""Kernel-IR programs for tests, lowered from the shipped specs (what used to be hand-written configs)."""
from __future__ import annotations

from pathlib import Path

from tlc.lowering.emit_text import kernel_ir

SPECS = Path(__file__).resolve().parents[2] / "specs"


def attention_kir(*, dtype: str = "bf16", d: int = 128, d_v: int | None = None, bm: int = 128, bn: int = 64,
                  warps: int = 4, stages: int = 2, causal: bool = False, alignment: str = "top_left",
                  softcap: bool = False, arch: str = "sm_90"):
    """The MHA/GQA kernel IR for these choices (MLA prefill's spec when d_v differs, softcap's when asked)."""
    if softcap:
        return kernel_ir(SPECS / "softcap_fwd.tl", arch, dict(dtype=dtype, HeadDim=d, BM=bm, BN=bn, Causal=causal,
                                                              Align=alignment))
    tiles = dict(dtype=dtype, BM=bm, BN=bn, Warps=warps, Stages=stages, Causal=causal, Align=alignment)
    if d_v is not None and d_v != d:
        return kernel_ir(SPECS / "mla_prefill_fwd.tl", arch, dict(tiles, DQK=d, DV=d_v))
    return kernel_ir(SPECS / "gqa_fwd.tl", arch, dict(tiles, HeadDim=d))


def gemms(kir) -> list[tuple]:
    """(MmaOp, {copy name: CopyOp}) per GEMM of `kir`, in program order: each unrolled k-block loop's
    MMA and the shared→register loads of its operands (inside the loop, or before it once prefetched)."""
    from tlc.kir.ops import CopyOp, ForOp, MmaOp, walk

    out, seen = [], set()
    for loop in (op for op in walk(kir) if isinstance(op, ForOp) and op.unroll):
        if loop in seen:   # split-masked-trips repeats the KV loop's body: one entry per distinct GEMM
            continue
        seen.add(loop)
        mma = next(op for op in walk(loop) if isinstance(op, MmaOp))
        loads = {op.copy: op for op in walk(loop) if isinstance(op, CopyOp) and op.kblock is not None}
        out.append((mma, loads))
    return out
