"""Kernel.__call__'s launch plans, on the CPU: the first call of a geometry checks everything and keeps a plan
(the struct without its data pointers, the grid, the module); a later call of that geometry only fills in its
pointers. The driver, the module and the GPU checks are replaced by recorders; the struct bytes, grid and
launch configuration a planned call launches are compared with a fresh kernel's and with values worked out
here from the tensors. GPU: every tests/gpu launch goes through the same path."""
from __future__ import annotations

import ctypes
import math
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.launch_stand_ins import KERNELS, RESIDENT, lowered_kernel, no_gpu, qkv, record
from tlc.backend_cute import launch
from tlc.diagnostics import TlcError
from tlc.kir.evaluate import evaluate
from tlc.kir.ops_sm90 import RESIDENT_CTAS_FIELD, TILE_COUNTER


@pytest.fixture(autouse=True)
def _no_gpu(monkeypatch):
    no_gpu(monkeypatch.setattr)


def _record(monkeypatch, kernel):
    return record(monkeypatch.setattr, ctypes.sizeof(kernel._struct))


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
    warm = lowered_kernel(name)
    driver = _record(monkeypatch, warm)
    warm(*qkv(b, hq, hkv, sq, sk, bshd), scale=scale)   # plans this geometry
    q, k, v = qkv(b, hq, hkv, sq, sk, bshd)
    out = torch.empty(b, hq, sq, 128, dtype=torch.bfloat16)
    assert warm(q, k, v, out=out, scale=scale) is out
    assert len(warm._plans) == 2   # `out` given is its own geometry
    warm(q, k, v, out=out, scale=scale)
    assert len(warm._plans) == 2 and len(driver.launches) == 3
    fresh = lowered_kernel(name)
    fresh_driver = _record(monkeypatch, fresh)
    fresh(q, k, v, out=out, scale=scale)
    got, want = driver.launches[-1], fresh_driver.launches[-1]
    assert got[:4] == want[:4]
    assert _without_counter(warm, got[4]) == _without_counter(fresh, want[4])


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_each_field_holds_the_calls_values(monkeypatch, name) -> None:
    kernel = lowered_kernel(name)
    driver = _record(monkeypatch, kernel)
    q, k, v = qkv(2, 4, 2, 333, 77, bshd=True)
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
    kernel = lowered_kernel("one_tile")
    _record(monkeypatch, kernel)
    q, k, v = qkv(1, 2, 2, 64, 64, bshd=False)
    kernel(q, k, v)
    shifted = torch.empty(q.numel() + 8, dtype=torch.bfloat16)[1:1 + q.numel()].view(q.shape)
    assert shifted.shape == q.shape and shifted.stride() == q.stride() and shifted.data_ptr() % 16
    with pytest.raises(TlcError, match="Q's data pointer is not 16-byte aligned"):
        kernel(shifted, k, v)


def test_new_geometries_and_inputs_get_new_plans_and_the_memo_is_bounded(monkeypatch) -> None:
    kernel = lowered_kernel("one_tile")
    q, k, v = qkv(1, 2, 2, 64, 64, bshd=False)
    driver = _record(monkeypatch, kernel)
    kernel(q, k, v)
    kernel(q, k, v, scale=0.5)
    kernel(q, k, v, scale=0.25)
    assert kernel._struct.from_buffer_copy(driver.launches[-1][4]).scale == 0.25
    bshd = qkv(1, 2, 2, 64, 64, bshd=True)   # the same shapes in SDPA's other layout: its own strides
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
        kernel(*qkv(1, 2, 2, 8, sk, bshd=False))
        kernel(q, k, v)   # in use all along: kept (the memo drops the least recently used)
    assert len(kernel._plans) == launch._PLAN_MEMO and first in kernel._plans


@pytest.mark.parametrize("call,message", [
    (lambda q, k, v: (q, k), re.escape("this kernel takes 3 tensor(s) (Q, K, V), got 2")),
    (lambda q, k, v: (q, k, "v"), "V must be a torch.Tensor, got str"),
    (lambda q, k, v: (q, k, v.float()), "V has dtype torch.float32"),
])
def test_bad_calls_after_a_planned_one_are_refused_in_one_line(monkeypatch, call, message) -> None:
    kernel = lowered_kernel("one_tile")
    _record(monkeypatch, kernel)
    q, k, v = qkv(1, 2, 2, 64, 64, bshd=False)
    kernel(q, k, v)
    with pytest.raises(TlcError, match=message):
        kernel(*call(q, k, v))


def test_an_empty_output_is_returned_without_a_launch_also_from_its_plan(monkeypatch) -> None:
    kernel = lowered_kernel("one_tile")
    driver = _record(monkeypatch, kernel)
    q, k, v = qkv(1, 2, 2, 0, 64, bshd=False)
    for _ in range(2):
        out = kernel(q, k, v)
        assert out.shape == (1, 2, 0, 128) and driver.launches == []
    assert len(kernel._plans) == 1
    shifted = torch.empty(k.numel() + 8, dtype=torch.bfloat16)[1:1 + k.numel()].view(k.shape)
    with pytest.raises(TlcError, match="K's data pointer is not 16-byte aligned"):   # as a fresh kernel says
        kernel(q, shifted, v)


def test_tile_counters_are_zeroed_slots_never_handed_out_twice(monkeypatch) -> None:
    counters, cpu = launch._TileCounters(), torch.device("cpu")
    monkeypatch.setattr(counters, "SLOTS", 4)
    taken = [counters.take(cpu, 7) for _ in range(6)]
    blocks = [block for block, _ in taken]
    assert blocks[0] is blocks[3] and blocks[4] is blocks[5] and blocks[3] is not blocks[4]   # a used-up block is replaced
    assert [address - block.data_ptr() for block, address in taken] == [0, 4, 8, 12, 0, 4]
    assert all(int(block[(address - block.data_ptr()) // 4]) == 0 for block, address in taken)
    other_stream = counters.take(cpu, 8)[0]
    assert other_stream is not blocks[4]   # each stream zeroes its own block, in its own order
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    captured = [counters.take(cpu, 7) for _ in range(2)]   # a graph replays each launch's own zeroing
    assert all(block.numel() == 1 and int(block[0]) == 0 and address == block.data_ptr() for block, address in captured)
    assert captured[0][0] is not captured[1][0]


def test_planned_persistent_launches_take_a_fresh_counter_each(monkeypatch) -> None:
    kernel = lowered_kernel("dynamic")
    driver = _record(monkeypatch, kernel)
    q, k, v = qkv(1, 2, 2, 64, 64, bshd=False)
    for _ in range(3):
        kernel(q, k, v)
    addresses = [getattr(kernel._struct.from_buffer_copy(raw), TILE_COUNTER) for *_, raw in driver.launches]
    assert len(set(addresses)) == 3
