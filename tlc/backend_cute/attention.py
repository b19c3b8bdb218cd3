"""Build a two-GEMM `Kernel` (attention, softcap, back-to-back GEMM) from a FlashFwdConfig
(builder → compile_kir → launcher)."""
from __future__ import annotations

from tlc.backend_cute.compile import compile_kir
from tlc.backend_cute.launch import AttentionSpec, Kernel
from tlc.kir.flash_fwd import FlashFwdConfig, build_flash_fwd_kir


def spec_of(cfg: FlashFwdConfig) -> AttentionSpec:
    return AttentionSpec(dtype=cfg.dtype, d_qk=cfg.d_qk, d_v=cfg.d_v, causal=cfg.causal, lse=cfg.lse,
                         softcap=cfg.softcap, softmax=cfg.softmax, score_scalars=cfg.score_scalars,
                         tensor_names=cfg.tensor_names)


def attention_kernel(cfg: FlashFwdConfig, arch: str = "sm_90", *, line_directives: bool = True) -> Kernel:
    compiled = compile_kir(build_flash_fwd_kir(cfg), arch, line_directives=line_directives)
    return Kernel(compiled, spec_of(cfg))
