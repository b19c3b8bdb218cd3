"""Which kernel a `tlc.attention` call gets: the shipped spec and its -D bindings for the call's dtype, head
dims, causality and key length (`attention_spec`, tiles and knobs from tlc.attention.tuning), the target
(sm_90a on Hopper, TLC_ATTENTION_ARCH, else the GPU's sm_80-family arch), the sm_90 fallback where the
sm_90a lowering refuses a shape, and the in-process table that makes a second call a dict lookup.
"""
from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import Any

from tlc import runtime
from tlc.diagnostics import TlcError, fail

_ATTENTION: dict[tuple, Any] = {}  # (dtype, d_qk, d_v, causal, device, arch, short keys) → kernel: no I/O per call


def specs_dir() -> Path:
    """The shipped `.tl` specs: the `tlc_specs` package (the checkout's `specs/` in an editable install)."""
    try:
        return Path(str(resources.files("tlc_specs")))
    except ModuleNotFoundError:
        checkout = Path(__file__).resolve().parents[2] / "specs"
        if (checkout / "__init__.py").is_file():  # a checkout on PYTHONPATH, not installed (bench/README.md)
            return checkout
        raise fail("tlc's shipped specs (the tlc_specs package) are not installed: reinstall tlc") from None


def attention_kernel(q, d_v: int, causal: bool, seq_k: int | None = None):
    """The kernel for this call's dtype, head dims, device and key length class (tlc.attention.tuning.short_keys:
    short sequences run persistent on sm_90a): built on first use, then a dict lookup."""
    import torch

    from tlc.attention.tuning import short_keys

    # TLC_ATTENTION_ARCH is part of the key: setting it mid-process switches the kernels from then on. The
    # key-length class is sm_90a's (the one target it changes): the device is asked for its target only
    # on a miss, and elsewhere both classes build the same kernel (one build, `build`'s own table).
    key = (q.dtype, q.shape[3], d_v, causal, q.device, os.environ.get("TLC_ATTENTION_ARCH"),
           short_keys("sm_90a", q.shape[3], d_v, causal, seq_k))
    kernel = _ATTENTION.get(key)
    if kernel is None:
        dtype = "bf16" if q.dtype == torch.bfloat16 else "fp16"
        kernel = _ATTENTION[key] = build_attention(dtype, q.shape[3], d_v, causal, attention_target(q.device), seq_k)
    return kernel


def attention_target(device=None) -> str:
    """What `attention` compiles for: sm_90a (wgmma) on Hopper, the device's sm_80-family arch
    elsewhere; TLC_ATTENTION_ARCH=sm_90 keeps a Hopper GPU on the mma.sync kernels."""
    return attention_target_for(runtime.device_arch(device))


def attention_target_for(arch: str) -> str:
    """`attention_target` for a GPU of `arch` (also what `tlc precompile --shapes` builds for it)."""
    if arch != "sm_90":
        return arch
    choice = os.environ.get("TLC_ATTENTION_ARCH", "sm_90a")
    if choice not in ("sm_90", "sm_90a"):
        raise fail(f"TLC_ATTENTION_ARCH={choice!r}: for a Hopper GPU set sm_90a (wgmma, the default) or sm_90")
    return choice


def attention_fallback(target: str) -> str | None:
    """The target to build when `target`'s lowering refuses a shape: Hopper falls back to sm_90."""
    return "sm_90" if target == "sm_90a" else None


def build_attention(dtype: str, d_qk: int, d_v: int, causal: bool, target: str, seq_k: int | None = None):
    """The kernel for one specialization; if the sm_90a lowering refuses it, the sm_90 kernel of the
    same spec, with a warning that names the reason (both compute the same program)."""
    def build(arch: str):
        spec, defines = attention_spec(dtype, d_qk, d_v, causal, arch, seq_k)
        return runtime.build(spec, arch=arch, defines=defines)
    return build_with_fallback(build, target, f"tlc.attention: no {target} kernel for d={d_qk}/{d_v} causal={causal}")


def build_with_fallback(build, target: str, refused: str):
    """`build(target)`; where the target's lowering refuses the program (sm_90a), `build` of its fallback (sm_90:
    the same program on mma.sync), with a warning `<refused> (<why>); using the sm_90 kernel`."""
    try:
        return build(target)
    except TlcError as exc:
        fallback = attention_fallback(target)
        if fallback is None:
            raise
        import warnings

        warnings.warn(f"{refused} ({exc.diagnostics[0].message}); using the {fallback} kernel", stacklevel=4)
        return build(fallback)


def attention_spec(dtype: str, d_qk: int, d_v: int, causal: bool, arch: str = "sm_90",
                   seq_k: int | None = None) -> tuple[Path, dict[str, Any]]:
    """The shipped spec and its -D bindings that `attention` builds for a call's shape on `arch`; `seq_k`
    (keys per sequence, when known) may pick the short-sequence schedule (tlc.attention.tuning.short_keys)."""
    from tlc.attention.tuning import default_schedule, default_tiles

    if d_qk == d_v:
        spec, defines = specs_dir() / "gqa_fwd.tl", {"HeadDim": d_qk}
    else:
        spec, defines = specs_dir() / "mla_prefill_fwd.tl", {"DQK": d_qk, "DV": d_v, "Align": "top_left"}
    tiles = default_tiles(d_qk, d_v, arch)  # the tuned tiles for this head dim and target (tlc/attention/tuning.py)
    defines.update(dtype=dtype, Causal=causal, BM=tiles["bm"], BN=tiles["bn"], Warps=tiles["warps"],
                   Stages=tiles["stages"])  # Warps and Stages bind as schedule options (neither spec sets them)
    defines.update(default_schedule(d_qk, d_v, arch, causal, seq_k))   # knobs tuned per head dim, key length
    return spec, defines


_SPEC_KERNELS: dict = {}


def spec_kernel(spec: str, defines: dict, device):
    """The kernel of shipped spec `spec` (`specs_dir() / f"{spec}.tl"`) with `defines`, for the target
    `attention_target` picks for `device` (its fallback where that target refuses, as `build_attention`); built once
    per process (the disk cache keeps it across processes)."""
    arch = attention_target(device)
    key = (spec, tuple(sorted(defines.items())), arch)
    if key not in _SPEC_KERNELS:
        _SPEC_KERNELS[key] = build_with_fallback(
            lambda target: runtime.build(specs_dir() / f"{spec}.tl", arch=target, defines=defines), arch,
            f"tlc: no {arch} kernel for {spec} {defines}")
    return _SPEC_KERNELS[key]

