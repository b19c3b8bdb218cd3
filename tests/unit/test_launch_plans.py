"""Kernel.__call__'s launch plans, on the CPU: the first call of a geometry checks everything and keeps a plan
(the struct without its data pointers, the grid, the module); a later call of that geometry only fills in its
pointers. The driver, the module and the GPU checks are replaced by recorders; the struct bytes, grid and
launch configuration a planned call launches are compared with a fresh kernel's and with values worked out
here from the tensors. GPU: every tests/gpu launch goes through the same path."""
from __future__ import annotations

import contextlib
import ctypes
import math
import re
import types

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.tail_model import lower_state
from tlc.backend_cute import launch
from tlc.backend_cute.compile import CompiledKernel
from tlc.diagnostics import TlcError
from tlc.kir.evaluate import evaluate
from tlc.kir.ops_sm90 import RESIDENT_CTAS_FIELD, TILE_COUNTER

RESIDENT = 132
KERNELS = {   # sm_90a: one tile per CTA with TMA descriptors and the prefetch; the dynamic persistent kernel
    "one_tile": dict(HeadDim="128", BM="128", BN="128", Warps="8", PrefetchNext="true"),
    "dynamic": dict(HeadDim="128", BM="128", BN="128", Warps="8", Causal="true", Persistent="true"),
}
_STATES = {name: lower_state("gqa_fwd", **defines) for name, defines in KERNELS.items()}


class _Driver:
    """cuLaunchKernel's recorder: (grid, threads, smem, stream, the struct's bytes) of each launch."""
    CUresult = types.SimpleNamespace(CUDA_SUCCESS=0)

    def __init__(self, size: int) -> None:
        self.size, self.launches = size, []

    def CUstream(self, stream):  # noqa: N802 - the driver's name
        return stream

    def cuLaunchKernel(self, function, gx, gy, gz, bx, by, bz, smem, stream, args, extra):  # noqa: N802
        struct = ctypes.c_void_p.from_address(args).value
        self.launches.append(((gx, gy, gz), (bx, by, bz), smem, stream, ctypes.string_at(struct, self.size)))
        return (0,)


def _kernel(name: str) -> launch.Kernel:
    state = _STATES[name]
    kernel = launch.Kernel(CompiledKernel(state.kir, "sm_90a", "", b"", {}, 0.0), state.abi)
    kernel._loaded[0] = types.SimpleNamespace(resident_ctas=RESIDENT, function="f")
    return kernel


@pytest.fixture(autouse=True)
def _no_gpu(monkeypatch):
    """CPU tensors stand in for CUDA ones; descriptors encode to bytes that name their tensor's geometry."""
    monkeypatch.setattr(launch, "_on_gpu", lambda t: True)
    monkeypatch.setattr(launch, "encode_tma", lambda desc, t: repr((desc.name, t.data_ptr(), tuple(t.shape),
                                                                      t.stride())).encode().ljust(128, b"\0")[:128])
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: types.SimpleNamespace(cuda_stream=7))


def _record(monkeypatch, kernel) -> _Driver:
    driver = _Driver(ctypes.sizeof(kernel._struct))
    monkeypatch.setattr(launch, "_driver", lambda: driver)
    return driver


def _qkv(b, hq, hkv, sq, sk, bshd: bool):
    def make(h, s):
        if bshd:   # SDPA's view of a (batch, seq, heads, dim) buffer
            return torch.randn(b, s, h, 128).to(torch.bfloat16).transpose(1, 2)
        return torch.randn(b, h, s, 128).to(torch.bfloat16)
    return make(hq, sq), make(hkv, sk), make(hkv, sk)


def _without_counter(kernel, raw: bytes) -> bytes:
    if TILE_COUNTER not in kernel._filled:
        return raw
    offset = getattr(kernel._struct, TILE_COUNTER).offset
    return raw[:offset] + bytes(8) + raw[offset + 8:]


geometries = st.tuples(st.integers(1, 3), st.sampled_from([(2, 2), (4, 2), (4, 1)]), st.integers(1, 300),
                       st.integers(1, 300), st.booleans(), st.sampled_from([None, 0.125, 0.3]))


@pytest.mark.parametrize("name", sorted(KERNELS))
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])   # the recorder is set per example
@given(geometry=geometries)
def test_a_planned_call_launches_what_a_fresh_kernel_launches(monkeypatch, name, geometry) -> None:
    b, (hq, hkv), sq, sk, bshd, scale = geometry
    warm = _kernel(name)
    driver = _record(monkeypatch, warm)
    warm(*_qkv(b, hq, hkv, sq, sk, bshd), scale=scale)   # plans this geometry
    q, k, v = _qkv(b, hq, hkv, sq, sk, bshd)
    out = torch.empty(b, hq, sq, 128, dtype=torch.bfloat16)
    assert warm(q, k, v, out=out, scale=scale) is out
    assert len(warm._plans) == 2   # `out` given is its own geometry
    warm(q, k, v, out=out, scale=scale)
    assert len(warm._plans) == 2 and len(driver.launches) == 3
    fresh = _kernel(name)
    fresh_driver = _record(monkeypatch, fresh)
    fresh(q, k, v, out=out, scale=scale)
    got, want = driver.launches[-1], fresh_driver.launches[-1]
    assert got[:4] == want[:4]
    assert _without_counter(warm, got[4]) == _without_counter(fresh, want[4])


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_each_field_holds_the_calls_values(monkeypatch, name) -> None:
    kernel = _kernel(name)
    driver = _record(monkeypatch, kernel)
    q, k, v = _qkv(2, 4, 2, 333, 77, bshd=True)
    for _ in range(2):   # planned, then from the plan
        out = kernel(q, k, v)
        grid, block, smem, stream, raw = driver.launches[-1]
        params = kernel._struct.from_buffer_copy(raw)
        assert out.shape == (2, 4, 333, 128) and out.is_contiguous()
        for arg, t in zip(kernel.inputs + kernel.outputs, (q, k, v, out)):
            assert getattr(params, arg.ptr) == t.data_ptr()
            assert [getattr(params, arg.stride(w)) for w in ("batch", "head", "row")] == list(t.stride()[:3])
        assert (params.batch, params.heads, params.group) == (2, 4, 2)
        assert math.isclose(params.scale, 1 / math.sqrt(128), rel_tol=1e-6)
        env = {f"p.{n}": getattr(params, n) for n, _ in kernel._params_op.fields if "tma" not in n}
        assert grid == tuple(int(evaluate(g, dict(env, **{"launch.ctas": RESIDENT}))) for g in kernel.kernel.grid)
        assert (block, smem, stream) == ((kernel.kernel.threads, 1, 1), kernel.kernel.smem_bytes, 7)
        if RESIDENT_CTAS_FIELD in kernel._filled:
            assert getattr(params, RESIDENT_CTAS_FIELD) == RESIDENT
        if TILE_COUNTER in kernel._filled:
            assert getattr(params, TILE_COUNTER) != 0
        for offset, slot, desc in kernel._slots:
            tensor = {"Q": q, "K": k, "V": v}[desc.field.removesuffix("_ptr")]
            assert raw[offset:offset + 128] == launch.encode_tma(desc, tensor)
    assert len(kernel._plans) == 1


def test_a_planned_geometry_still_refuses_a_misaligned_pointer(monkeypatch) -> None:
    kernel = _kernel("one_tile")
    _record(monkeypatch, kernel)
    q, k, v = _qkv(1, 2, 2, 64, 64, bshd=False)
    kernel(q, k, v)
    shifted = torch.empty(q.numel() + 8, dtype=torch.bfloat16)[1:1 + q.numel()].view(q.shape)
    assert shifted.shape == q.shape and shifted.stride() == q.stride() and shifted.data_ptr() % 16
    with pytest.raises(TlcError, match="Q's data pointer is not 16-byte aligned"):
        kernel(shifted, k, v)


def test_new_geometries_and_inputs_get_new_plans_and_the_memo_is_bounded(monkeypatch) -> None:
    kernel = _kernel("one_tile")
    q, k, v = _qkv(1, 2, 2, 64, 64, bshd=False)
    driver = _record(monkeypatch, kernel)
    kernel(q, k, v)
    kernel(q, k, v, scale=0.5)
    kernel(q, k, v, scale=0.25)
    assert kernel._struct.from_buffer_copy(driver.launches[-1][4]).scale == 0.25
    bshd = _qkv(1, 2, 2, 64, 64, bshd=True)   # the same shapes in SDPA's other layout: its own strides
    kernel(*bshd)
    params = kernel._struct.from_buffer_copy(driver.launches[-1][4])
    assert [getattr(params, f"Q_{w}_stride") for w in ("batch", "head", "row")] == list(bshd[0].stride()[:3])
    assert len(kernel._plans) == 4
    kernel(q, k, v, scale=torch.tensor(0.5))   # not a plain number: checked every time, not kept
    assert len(kernel._plans) == 4
    kernel(q, k, v, scale=0.0)
    kernel(q, k, v, scale=-0.0)   # equal to 0.0 in Python, not in the struct
    assert math.copysign(1, kernel._struct.from_buffer_copy(driver.launches[-1][4]).scale) == -1
    assert len(kernel._plans) == 6
    first = next(iter(kernel._plans))
    for sk in range(1, launch._PLAN_MEMO + 10):
        kernel(*_qkv(1, 2, 2, 8, sk, bshd=False))
        kernel(q, k, v)   # in use all along: kept (the memo drops the least recently used)
    assert len(kernel._plans) == launch._PLAN_MEMO and first in kernel._plans


@pytest.mark.parametrize("call,message", [
    (lambda q, k, v: (q, k), re.escape("this kernel takes 3 tensor(s) (Q, K, V), got 2")),
    (lambda q, k, v: (q, k, "v"), "V must be a torch.Tensor, got str"),
    (lambda q, k, v: (q, k, v.float()), "V has dtype torch.float32"),
])
def test_bad_calls_after_a_planned_one_are_refused_in_one_line(monkeypatch, call, message) -> None:
    kernel = _kernel("one_tile")
    _record(monkeypatch, kernel)
    q, k, v = _qkv(1, 2, 2, 64, 64, bshd=False)
    kernel(q, k, v)
    with pytest.raises(TlcError, match=message):
        kernel(*call(q, k, v))


def test_an_empty_output_is_returned_without_a_launch_also_from_its_plan(monkeypatch) -> None:
    kernel = _kernel("one_tile")
    driver = _record(monkeypatch, kernel)
    q, k, v = _qkv(1, 2, 2, 0, 64, bshd=False)
    for _ in range(2):
        out = kernel(q, k, v)
        assert out.shape == (1, 2, 0, 128) and driver.launches == []
    assert len(kernel._plans) == 1
    shifted = torch.empty(k.numel() + 8, dtype=torch.bfloat16)[1:1 + k.numel()].view(k.shape)
    with pytest.raises(TlcError, match="K's data pointer is not 16-byte aligned"):   # as a fresh kernel says
        kernel(q, shifted, v)
