"""Python entry points that return kernels: `tlc.build(...)` and `tlc.attention(...)`.

`build` takes a `.tl` path or TL text and returns a callable on torch tensors. `attention`
mirrors `torch.nn.functional.scaled_dot_product_attention`: it picks the shipped spec for
the call's shape, builds that specialization on first use (NVRTC + the disk cache) and
keeps it in an in-process dispatch table, so later calls cost a dict lookup.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from tlc.diagnostics import fail

SPECS = Path(__file__).resolve().parent.parent / "specs"
_DISPATCH: dict[tuple, Any] = {}
_ATTENTION: dict[tuple, Any] = {}  # (dtype, d_qk, d_v, causal, device) → kernel: no file I/O per call


def _read(path_or_text: str | Path) -> tuple[bytes, str]:
    if isinstance(path_or_text, Path) or (isinstance(path_or_text, str) and "\n" not in path_or_text
                                          and path_or_text.endswith(".tl")):
        p = Path(path_or_text)
        try:
            return p.read_bytes(), str(p)
        except OSError as exc:
            raise fail(f"cannot read '{p}': {exc.strerror or exc}") from None
    return str(path_or_text).encode(), "<text>"


def device_arch() -> str:
    """The sm_80-family target for the current GPU (Hopper runs it compiled for sm_90)."""
    import torch

    if not torch.cuda.is_available():
        raise fail("no CUDA GPU is visible: tlc kernels need one to run (tlc build works without)")
    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}"
    if arch in ("sm_80", "sm_86", "sm_89", "sm_90"):
        return arch
    raise fail(f"this GPU is {arch}; tlc's kernels target sm_80, sm_86, sm_89 and sm_90")


def build(path_or_text: str | Path, *, arch: str | None = None, defines: Mapping[str, Any] | None = None,
          lse: bool = False):
    """Compile a TL program and return its kernel, callable as `kernel(q, k, v, scale=None)`."""
    from tlc.backend_cute.attention import spec_of
    from tlc.backend_cute.compile import compile_kir
    from tlc.backend_cute.launch import Kernel
    from tlc.builder import lower_to_kernel_ir

    data, name = _read(path_or_text)
    defs = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in (defines or {}).items()}
    arch = arch or device_arch()
    key = (data, name, tuple(sorted(defs.items())), arch, lse)
    if key in _DISPATCH:
        return _DISPATCH[key]
    stem = Path(name).stem if name != "<text>" else "tl_kernel"
    state, _ = lower_to_kernel_ir(data, name, arch, defs, name=stem, lse=lse)
    compiled = compile_kir(state.kir, arch, source_name=Path(name).name, cu_name=f"{stem}.cu")
    kernel = Kernel(compiled, spec_of(state.config))
    _DISPATCH[key] = kernel
    return kernel


def attention(q, k, v, is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False):
    """`scaled_dot_product_attention` for (batch, heads, seq, dim) bf16/fp16 CUDA tensors."""
    import torch

    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise fail(f"tlc.attention: {name} must be a 4-D (batch, heads, seq, dim) tensor")
    if q.dtype not in (torch.bfloat16, torch.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise fail(f"tlc.attention: q, k, v must all be bfloat16 or float16 (got {q.dtype}, {k.dtype}, {v.dtype})")
    hq, hkv = q.shape[1], k.shape[1]
    if hq != hkv and not enable_gqa:
        raise fail(f"tlc.attention: {hq} query heads but {hkv} KV heads; pass enable_gqa=True for GQA/MQA")
    if hq % hkv:
        raise fail(f"tlc.attention: {hq} query heads are not a multiple of {hkv} KV heads")
    dtype = "bf16" if q.dtype == torch.bfloat16 else "fp16"
    key = (dtype, q.shape[-1], v.shape[-1], bool(is_causal), q.device)
    kernel = _ATTENTION.get(key)
    if kernel is None:
        spec, defines = attention_spec(dtype, q.shape[-1], v.shape[-1], is_causal)
        kernel = _ATTENTION[key] = build(spec, defines=defines)
    return kernel(q, k, v, scale=scale)


def attention_spec(dtype: str, d_qk: int, d_v: int, causal: bool) -> tuple[Path, dict[str, Any]]:
    """The shipped spec and its -D bindings that `attention` builds for a call's shape."""
    from tlc.kir.flash_fwd import default_tiles

    if d_qk == d_v:
        spec, defines = SPECS / "gqa_fwd.tl", {"HeadDim": d_qk}
    else:
        spec, defines = SPECS / "mla_prefill_fwd.tl", {"DQK": d_qk, "DV": d_v, "Align": "top_left"}
    tiles = default_tiles(d_qk, d_v)  # the tuned tiles for this head dim (bench/README.md)
    defines.update(dtype=dtype, Causal=causal, BM=tiles["bm"], BN=tiles["bn"])
    return spec, defines
