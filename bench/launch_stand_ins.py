"""Stand-ins for the GPU side of a launch, for the launch-plan and tlc.attention call tests and for
bench/host_path_cpu.py: sm_90a kernels lowered (not compiled) from the shipped spec, a driver that records (or
just accepts) launches, CPU tensors passing for CUDA ones."""
from __future__ import annotations

import contextlib
import ctypes
import types

import torch

from bench.tail_model import lower_state
from tlc.backend_cute import launch
from tlc.backend_cute.compile import CompiledKernel

RESIDENT = 132
KERNELS = {   # sm_90a: one tile per CTA with TMA descriptors and the prefetch; the dynamic persistent kernel
    "one_tile": dict(HeadDim="128", BM="128", BN="128", Warps="8", PrefetchNext="true"),
    "dynamic": dict(HeadDim="128", BM="128", BN="128", Warps="8", Causal="true", Persistent="true"),
}
_STATES: dict[str, object] = {}


class Driver:
    """cuLaunchKernel's stand-in: with `size` (the struct's bytes) it records (grid, threads, smem, stream, the
    struct's bytes) of each launch; without, it only accepts them."""
    CUresult = types.SimpleNamespace(CUDA_SUCCESS=0)

    def __init__(self, size: int | None = None) -> None:
        self.size, self.launches = size, []

    def CUstream(self, stream):  # noqa: N802 - the driver's name
        return stream

    def cuLaunchKernel(self, function, gx, gy, gz, bx, by, bz, smem, stream, args, extra):  # noqa: N802
        if self.size is not None:
            struct = ctypes.c_void_p.from_address(args).value
            self.launches.append(((gx, gy, gz), (bx, by, bz), smem, stream, ctypes.string_at(struct, self.size)))
        return (0,)


def lowered_kernel(name: str) -> launch.Kernel:
    """A `Kernel` for `KERNELS[name]` whose module is a stand-in on device 0 with `RESIDENT` CTAs."""
    if name not in _STATES:
        _STATES[name] = lower_state("gqa_fwd", **KERNELS[name])
    state = _STATES[name]
    return stand_in_kernel(state.kir, state.abi)


def stand_in_kernel(kir, abi, arch: str = "sm_90a") -> launch.Kernel:
    """A `Kernel` for a lowered program (kernel IR and launch ABI) whose module is a stand-in on device 0."""
    kernel = launch.Kernel(CompiledKernel(kir, arch, "", b"", {}, 0.0), abi)
    kernel._loaded[0] = types.SimpleNamespace(resident_ctas=RESIDENT, function="f")
    return kernel


def no_gpu(set_attr=setattr) -> None:
    """CPU tensors pass for CUDA ones; descriptors encode to bytes that name their tensor's geometry. `set_attr`:
    pytest's monkeypatch.setattr in tests (undone after each), plain setattr in a script."""
    set_attr(launch, "_on_gpu", lambda t: True)
    set_attr(launch, "encode_tma", lambda desc, t: repr((desc.name, t.data_ptr(), tuple(t.shape),
                                                         t.stride())).encode().ljust(128, b"\0")[:128])
    set_attr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    set_attr(torch.cuda, "current_device", lambda: 0)
    set_attr(torch.cuda, "current_stream", lambda device=None: types.SimpleNamespace(cuda_stream=7))
    set_attr(launch, "_current_stream", lambda device: 7)
    set_attr(torch.cuda, "is_current_stream_capturing", lambda: False)


def record(set_attr, struct_bytes: int | None) -> Driver:
    """Install a `Driver` (recording when `struct_bytes` is given) as the launcher's driver."""
    driver = Driver(struct_bytes)
    set_attr(launch, "_driver", lambda: driver)
    return driver


def qkv(b, hq, hkv, sq, sk, bshd: bool, d: int = 128):
    def make(h, s):
        if bshd:   # SDPA's view of a (batch, seq, heads, dim) buffer
            return torch.randn(b, s, h, d).to(torch.bfloat16).transpose(1, 2)
        return torch.randn(b, h, s, d).to(torch.bfloat16)
    return make(hq, sq), make(hkv, sk), make(hkv, sk)
