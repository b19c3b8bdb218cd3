"""tlc.attention's call plans, on the CPU: the first eager call of a geometry runs every check and keeps the
kernel and its launch plan; a later call of that geometry launches the plan after only the checks no geometry
settles (plain tensors, no tracing, grad, pointer alignment). The GPU side is stood in for
(bench/launch_stand_ins.py); what a planned call launches is compared with a fresh kernel's launch."""
from __future__ import annotations

import ctypes
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tlc
from bench.launch_stand_ins import lowered_kernel, no_gpu, record
from tlc.attention import kernels, sdpa
from tlc.backend_cute import launch
from tlc.diagnostics import TlcError
from tlc.kir.ops_sm90 import TILE_COUNTER
from tlc.recent import Recent


class _Calls:
    """The stand-in GPU for tlc.attention: `name`'s kernel for every call, a launch recorder, checks counted."""

    def __init__(self, monkeypatch, name: str) -> None:
        no_gpu(monkeypatch.setattr)
        self.name, self.checks = name, 0
        self.driver = record(monkeypatch.setattr, ctypes.sizeof(lowered_kernel(name)._struct))
        monkeypatch.setattr(sdpa, "_on_cuda", lambda t: True)
        monkeypatch.setattr(kernels, "attention_target", lambda device=None: "sm_90a")
        monkeypatch.setattr(kernels, "build_attention", lambda *args: lowered_kernel(name))
        monkeypatch.setattr(kernels, "_ATTENTION", {})
        monkeypatch.setattr(sdpa, "_CALLS", Recent(256))
        check = sdpa.check_attention

        def counted(*args):
            self.checks += 1
            return check(*args)
        monkeypatch.setattr(sdpa, "check_attention", counted)

    @property
    def causal(self) -> bool:
        return self.name == "dynamic"

    def fresh_launch(self, monkeypatch, q, k, v, scale):
        """What a kernel that never ran launches for these tensors (its own recorder)."""
        kernel = lowered_kernel(self.name)
        driver = record(monkeypatch.setattr, ctypes.sizeof(kernel._struct))
        kernel(q, k, v, scale=scale)
        monkeypatch.setattr(launch, "_driver", lambda: self.driver)   # back to the calls' recorder
        return driver.launches[-1]


def _tensor(b, h, s, bshd: bool, d: int = 128):
    if bshd:   # SDPA's view of a (batch, seq, heads, dim) buffer
        return torch.randn(b, s, h, d).to(torch.bfloat16).transpose(1, 2)
    return torch.randn(b, h, s, d).to(torch.bfloat16)


def _without_counter(raw: bytes, name: str) -> bytes:
    kernel = lowered_kernel(name)
    if TILE_COUNTER not in kernel._filled:
        return raw
    offset = getattr(kernel._struct, TILE_COUNTER).offset
    return raw[:offset] + bytes(8) + raw[offset + 8:]


geometries = st.tuples(st.integers(1, 3), st.sampled_from([(2, 2), (4, 2), (4, 1)]), st.integers(1, 300),
                       st.integers(1, 300), st.tuples(st.booleans(), st.booleans(), st.booleans()),
                       st.sampled_from([None, 0.125, 1, -0.0]))


@pytest.mark.parametrize("name", ["one_tile", "dynamic"])
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(geometry=geometries)
def test_a_repeated_call_skips_the_checks_and_launches_what_a_fresh_kernel_launches(monkeypatch, name, geometry):
    b, (hq, hkv), sq, sk, layouts, scale = geometry
    calls = _Calls(monkeypatch, name)

    def call():
        q, k, v = (_tensor(b, h, s, bshd) for (h, s), bshd in zip(((hq, sq), (hkv, sk), (hkv, sk)), layouts))
        return (q, k, v), tlc.attention(q, k, v, is_causal=calls.causal, scale=scale, enable_gqa=hq != hkv)

    call()
    assert calls.checks == 1
    (q, k, v), out = call()
    assert calls.checks == 1 and len(sdpa._CALLS) == 1 and len(calls.driver.launches) == 2
    assert out.shape == (b, hq, sq, 128)
    got = calls.driver.launches[-1]
    want = calls.fresh_launch(monkeypatch, q, k, v, None if scale is None else float(scale))
    assert got[:4] == want[:4]
    params = lowered_kernel(name)._struct.from_buffer_copy(got[4])
    assert params.Q_ptr == q.data_ptr() and params.O_ptr == out.data_ptr()
    # the output pointers differ (each call allocates its own): compare with them set alike
    fresh = lowered_kernel(name)._struct.from_buffer_copy(want[4])
    fresh.O_ptr = params.O_ptr
    assert _without_counter(got[4], name) == _without_counter(bytes(fresh), name)


def test_each_new_geometry_is_checked_once(monkeypatch) -> None:
    calls = _Calls(monkeypatch, "one_tile")
    q, k, v = (_tensor(1, 2, 64, False) for _ in range(3))
    qs, ks, vs = (_tensor(1, 2, 64, True) for _ in range(3))   # the same shapes, other strides
    steps = [
        ((q, k, v), {}),
        ((q, k, v), {}),
        ((qs, k, v), {}), ((q, ks, v), {}), ((q, k, vs), {}),         # each tensor's strides
        ((q[:, :, :32], k, v), {}),                                  # query length
        ((q, k, v), {"scale": 0.0}),
        ((q, k, v), {"scale": -0.0}),                                # equal to 0.0 in Python, not in the kernel
        ((q, k, v), {"scale": 0.0}),
        ((q, k, v), {"enable_gqa": True}),                           # not needed here, but a different call
        ((torch.cat([q, q]), torch.cat([k, k]), torch.cat([v, v])), {}),   # batch
    ]
    counts = []
    for tensors, kwargs in steps:
        tlc.attention(*tensors, **kwargs)
        counts.append(calls.checks)
    assert counts == [1, 1, 2, 3, 4, 5, 6, 7, 7, 8, 9]
    assert math.copysign(1, lowered_kernel("one_tile")._struct.from_buffer_copy(
        calls.driver.launches[7][4]).scale) == -1
    monkeypatch.setenv("TLC_ATTENTION_ARCH", "sm_90")                # the target switch: checked again
    tlc.attention(q, k, v)
    assert calls.checks == 10


def test_a_planned_geometry_still_refuses_grad(monkeypatch) -> None:
    calls = _Calls(monkeypatch, "one_tile")
    q, k, v = (_tensor(1, 2, 64, False) for _ in range(3))
    tlc.attention(q, k, v)
    with pytest.raises(TlcError, match="q requires grad, but tlc has no backward kernel yet"):
        tlc.attention(q.requires_grad_(), k, v)
    with torch.no_grad():
        tlc.attention(q, k, v)
    assert calls.checks == 2 and len(calls.driver.launches) == 2


def test_a_planned_geometry_copies_a_misaligned_tensor_as_the_checked_call_would(monkeypatch) -> None:
    calls = _Calls(monkeypatch, "one_tile")
    q, k, v = (_tensor(1, 2, 64, False) for _ in range(3))
    tlc.attention(q, k, v)
    shifted = torch.empty(q.numel() + 8, dtype=torch.bfloat16)[1:1 + q.numel()].view(q.shape)
    shifted.copy_(q)
    assert shifted.stride() == q.stride() and shifted.data_ptr() % 16
    tlc.attention(shifted, k, v)
    params = lowered_kernel("one_tile")._struct.from_buffer_copy(calls.driver.launches[-1][4])
    assert calls.checks == 2 and params.Q_ptr % 16 == 0 and params.Q_ptr != shifted.data_ptr()


def test_calls_no_geometry_describes_take_the_checked_path(monkeypatch) -> None:
    _Calls(monkeypatch, "one_tile")
    q = _tensor(1, 2, 64, False)
    assert sdpa._call_key(q, q, q, False, torch.tensor(0.5), False) is None   # a tensor scale
    assert sdpa._call_key(q, q, q, False, True, False) is None                 # a bool is refused as a scale

    class Sub(torch.Tensor):
        pass
    assert sdpa._call_key(q.as_subclass(Sub), q, q, False, None, False) is None   # traced or wrapped tensors
    assert sdpa._call_key(q, q, q, False, None, False) is not None


def test_a_launch_error_on_a_planned_call_speaks_for_tlc_attention(monkeypatch) -> None:
    calls = _Calls(monkeypatch, "one_tile")
    q, k, v = (_tensor(1, 2, 64, False) for _ in range(3))
    tlc.attention(q, k, v)
    monkeypatch.setattr(calls.driver, "cuLaunchKernel", lambda *args: (1,), raising=False)
    monkeypatch.setattr(calls.driver, "cuGetErrorName", lambda err: (0, b"CUDA_ERROR_LAUNCH_FAILED"), raising=False)
    with pytest.raises(TlcError) as info:
        tlc.attention(q, k, v)
    assert str(info.value).splitlines()[0].startswith("error: tlc.attention: CUDA driver call cuLaunchKernel(")
    assert calls.checks == 1


def test_what_else_the_key_holds_is_checked_again(monkeypatch) -> None:
    calls = _Calls(monkeypatch, "one_tile")
    q, k, v = (_tensor(1, 2, 64, False) for _ in range(3))
    tlc.attention(q, k, v)
    tlc.attention(q, k, v, is_causal=True)   # another kernel (the stand-in builds the same one): checked again
    assert calls.checks == 2
    for bad, message in (((q.half(), k, v), "q, k and v must have one dtype"),
                         ((q, k.half(), v), "q, k and v must have one dtype"),
                         ((q, k.to("meta"), v), "q, k and v are on different devices")):
        with pytest.raises(TlcError, match=message):
            tlc.attention(*bad)
    for i in (1, 2):   # k's or v's grad, not only q's
        tensors = [q, k, v]
        tensors[i] = tensors[i].clone().requires_grad_()
        with pytest.raises(TlcError, match="requires grad"):
            tlc.attention(*tensors)


def test_traced_or_odd_calls_take_the_checked_path(monkeypatch) -> None:
    _Calls(monkeypatch, "one_tile")
    q = _tensor(1, 2, 64, False)
    assert sdpa._call_key(q, q, q, False, 0.5, False) is not None
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert sdpa._call_key(q, q, q, False, 0.5, False) is None
    monkeypatch.undo()
    _Calls(monkeypatch, "one_tile")
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        assert sdpa._call_key(q, q, q, False, 0.5, False) is None
    import torch.autograd.forward_ad as fwad
    with fwad.dual_level():
        assert sdpa._call_key(q, q, q, False, 0.5, False) is None
        dual = fwad.make_dual(q, torch.ones_like(q))
        with pytest.raises(TlcError, match="q carries a forward-mode AD tangent"):
            tlc.attention(dual, q, q)
    assert sdpa._call_key(torch._neg_view(q), q, q, False, None, False) is None
    assert sdpa._call_key(q, q, q, False, float("nan"), False) is None   # never found again: not kept
    assert sdpa._call_key(q, q, q, False, 10 ** 400, False) is None
    with pytest.raises(TlcError, match=r"scale is past a float's range \(an int of 1329 bits\)"):
        tlc.attention(q, q, q, scale=10 ** 400)


def test_a_numpy_scale_and_its_float_share_a_plan(monkeypatch) -> None:
    np = pytest.importorskip("numpy")
    calls = _Calls(monkeypatch, "one_tile")
    q, k, v = (_tensor(1, 2, 64, False) for _ in range(3))
    tlc.attention(q, k, v, scale=np.float64(0.125))
    tlc.attention(q, k, v, scale=0.125)
    assert calls.checks == 1


def test_a_neg_view_is_negated_before_the_kernel_reads_it(monkeypatch) -> None:
    calls = _Calls(monkeypatch, "one_tile")
    q, k, v = (_tensor(1, 2, 64, False) for _ in range(3))
    tlc.attention(q, k, v)
    read, launch_kernel = torch.empty_like(q), calls.driver.cuLaunchKernel

    def reading_q(*args):   # what Q's pointer holds when the kernel is launched
        result = launch_kernel(*args)
        params = lowered_kernel("one_tile")._struct.from_buffer_copy(calls.driver.launches[-1][4])
        ctypes.memmove(read.data_ptr(), params.Q_ptr, q.numel() * q.element_size())
        return result
    monkeypatch.setattr(calls.driver, "cuLaunchKernel", reading_q)
    tlc.attention(torch._neg_view(q), k, v)
    assert calls.checks == 2 and torch.equal(read, -q)


def test_a_refused_mask_or_dropout_is_never_served_from_a_plan(monkeypatch) -> None:
    """The plan key holds no mask and no dropout: those are checked before it, on every call."""
    calls = _Calls(monkeypatch, "one_tile")
    q, k, v = (_tensor(1, 2, 64, False) for _ in range(3))
    tlc.attention(q, k, v)
    mask = torch.ones(64, 64, dtype=torch.bool)
    for args, kwargs, words in (((q, k, v, mask), {}, "attn_mask is not supported yet"),
                                ((q, k, v, True), {}, "pass is_causal=True by name"),
                                ((q, k, v), {"dropout_p": 0.1}, "but tlc has no dropout"),
                                ((q, k, v, None, float("nan")), {}, "dropout_p must be from 0 to 1, got nan"),
                                ((q, k, v, None, "0"), {}, "dropout_p must be a number")):
        with pytest.raises(TlcError, match=words):
            tlc.attention(*args, **kwargs)
        with pytest.raises(TlcError, match=words):
            sdpa.attention(*args, **kwargs)
    assert calls.checks == 1 and len(calls.driver.launches) == 1


def test_sdpas_positional_call_is_causal_and_shares_the_keyword_calls_plan(monkeypatch) -> None:
    calls = _Calls(monkeypatch, "dynamic")
    q, k, v = (_tensor(1, 2, 64, False) for _ in range(3))
    tlc.attention(q, k, v, None, 0.0, True)
    ((_, _, _, causal, *_),) = kernels._ATTENTION   # the kernel's key: (dtype, d_qk, d_v, causal, …)
    assert causal is True
    tlc.attention(q, k, v, is_causal=True)
    tlc.attention(query=q, key=k, value=v, attn_mask=None, dropout_p=0, is_causal=True)
    assert calls.checks == 1 and len(calls.driver.launches) == 3 and len(sdpa._CALLS) == 1


def test_a_positional_scale_and_gqa_flag_mean_the_keywords(monkeypatch) -> None:
    calls = _Calls(monkeypatch, "one_tile")
    q, k = _tensor(1, 4, 64, False), _tensor(1, 2, 64, False)
    tlc.attention(q, k, k, None, 0.0, False, 0.5, True)
    tlc.attention(q, k, k, scale=0.5, enable_gqa=True)
    assert calls.checks == 1 and len(sdpa._CALLS) == 1
    assert lowered_kernel("one_tile")._struct.from_buffer_copy(calls.driver.launches[0][4]).scale == 0.5
    with pytest.raises(TlcError, match="pass enable_gqa=True"):
        tlc.attention(q, k, k, None, 0.0, False, 0.5)
