"""tlc.flash_attn_varlen_func on the CPU: its one-line refusals naming the argument, and a call through the real
launcher (a stand-in driver): the packed tensors bound as (1, heads, rows, d) storages, the batch taken from the
offsets' length, the output written into the caller's tensor. Results are checked on a GPU
(tests/gpu/test_varlen_gpu.py)."""
from __future__ import annotations

import ctypes
import re

import pytest
import torch

import tlc
from tlc.attention import sdpa, varlen
from tlc.diagnostics import TlcError


@pytest.fixture
def on_cuda(monkeypatch):
    monkeypatch.setattr(sdpa, "_on_cuda", lambda t: True)


def args(**change):
    out = dict(q=torch.zeros(30, 4, 64, dtype=torch.bfloat16), k=torch.zeros(40, 2, 64, dtype=torch.bfloat16),
               v=torch.zeros(40, 2, 64, dtype=torch.bfloat16), cu_seqlens_q=torch.tensor([0, 10, 30], dtype=torch.int32),
               cu_seqlens_k=torch.tensor([0, 15, 40], dtype=torch.int32), max_seqlen_q=20, max_seqlen_k=25)
    out.update(change)
    return out


@pytest.mark.parametrize("change, message", [
    (dict(q=torch.zeros(2, 30, 4, 64, dtype=torch.bfloat16)), "q must be 3-D (total rows, heads, d), got shape "
                                                               "(2, 30, 4, 64)"),
    (dict(v=torch.zeros(40, 2, 32, dtype=torch.bfloat16)), "k (40, 2, 64) and v (40, 2, 32) differ"),
    (dict(q=torch.zeros(30, 3, 64, dtype=torch.bfloat16)), "q's 3 heads are not a multiple of k's 2"),
    (dict(cu_seqlens_q=torch.tensor([0, 10, 30])), "cu_seqlens_q must be an int32 tensor of (batch + 1,)"),
    (dict(cu_seqlens_k=torch.tensor([0, 40], dtype=torch.int32)), "cu_seqlens_q has 3 offsets, cu_seqlens_k 2"),
    (dict(max_seqlen_q=-1), "max_seqlen_q must be an int >= 0, not -1"),
    (dict(k=torch.zeros(40, 2, 64)), "k is torch.float32; q, k and v are all bf16 or all fp16"),
])
def test_a_bad_argument_is_refused_in_one_line_naming_it(on_cuda, change: dict, message: str) -> None:
    with pytest.raises(TlcError, match=re.escape(message)) as info:
        tlc.flash_attn_varlen_func(**args(**change))
    assert "\n" not in str(info.value).strip()


def stand_in_varlen(monkeypatch, causal: bool):
    """The sm_90a kernel of specs/varlen_fwd.tl at d 64 through the real launcher, its driver a stand-in."""
    from bench.launch_stand_ins import no_gpu, stand_in_kernel
    from tlc.api import compile_graph
    from tlc.attention.kernels import specs_dir
    from tlc.lowering.passes import run_lowering

    no_gpu(monkeypatch.setattr)
    spec, defines = varlen.varlen_plan(64, "bf16", causal)
    graph, _ = compile_graph((specs_dir() / f"{spec}.tl").read_text(), f"{spec}.tl",
                             defines={k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in defines.items()})
    state, _ = run_lowering(graph, "sm_90a", name=spec)
    return stand_in_kernel(state.kir, state.abi)


def test_a_call_binds_the_packed_storages_and_the_batch_from_the_offsets(on_cuda, monkeypatch) -> None:
    from bench.launch_stand_ins import record

    kernel = stand_in_varlen(monkeypatch, causal=True)
    monkeypatch.setattr(varlen, "spec_kernel", lambda s, d, device: kernel)
    driver = record(monkeypatch.setattr, ctypes.sizeof(kernel._struct))
    a = args(causal=True)
    out = tlc.flash_attn_varlen_func(**a)
    assert tuple(out.shape) == (30, 4, 64)
    s = kernel._struct.from_buffer_copy(driver.launches[-1][-1])
    assert (s.batch, s.heads, s.group, s.seqlen_q, s.seqlen_k) == (2, 4, 2, 20, 25)
    assert (s.Q_storage_rows, s.K_storage_rows, s.O_storage_rows) == (30, 40, 30)
    assert (s.O_ptr, s.O_head_stride, s.O_row_stride) == (out.data_ptr(), 64, 4 * 64)
    assert s.cu_seqlens_q_ptr == a["cu_seqlens_q"].data_ptr()
    grid = driver.launches[-1][0]
    assert grid == (1, 4, 2)   # one 128-row query tile of the longest sequence, 4 heads, 2 sequences
    # the same geometry again: no check, no kernel lookup; the new call's tensors in the struct
    checked, check = [], varlen._check
    monkeypatch.setattr(varlen, "_check", lambda *x: checked.append(x) or check(*x))
    monkeypatch.setattr(varlen, "spec_kernel", lambda s, d, device: pytest.fail("a kept call looked its kernel up"))
    b = {name: t.clone() if hasattr(t, "clone") else t for name, t in a.items()}
    out2 = tlc.flash_attn_varlen_func(**b)
    again = kernel._struct.from_buffer_copy(driver.launches[-1][-1])
    assert not checked and (again.O_ptr, again.cu_seqlens_q_ptr) == (out2.data_ptr(), b["cu_seqlens_q"].data_ptr())
    assert (again.seqlen_q, again.seqlen_k, again.Q_storage_rows) == (20, 25, 30)
    with pytest.raises(TlcError, match="max_seqlen_q must be an int >= 0"):   # another value: checked again
        tlc.flash_attn_varlen_func(**dict(b, max_seqlen_q=-1))


def test_make_fx_records_one_varlen_op() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    mode = FakeTensorMode()
    with mode:
        q = torch.empty(30, 4, 64, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(40, 2, 64, dtype=torch.bfloat16, device="cuda")
        cq = torch.empty(3, dtype=torch.int32, device="cuda")
    graph = make_fx(lambda q, k, cq: tlc.flash_attn_varlen_func(q, k, k, cq, cq, 20, 25, causal=True),
                    tracing_mode="fake")(q, k, cq)
    calls = [n for n in graph.graph.nodes if n.target is torch.ops.tlc.flash_attn_varlen_func.default]
    assert len(calls) == 1 and tuple(calls[0].meta["val"].shape) == (30, 4, 64)


def test_a_misaligned_output_is_refused_before_its_rows_are_stored(on_cuda, monkeypatch) -> None:
    """A scattered output is the caller's tensor (out=): its pointer and strides must take 16-byte stores."""
    from bench.launch_stand_ins import record

    kernel = stand_in_varlen(monkeypatch, causal=False)
    record(monkeypatch.setattr, None)
    a = args()
    store = lambda t: t.permute(1, 0, 2).unsqueeze(0)   # noqa: E731
    given = dict(out=None, scale=0.1, seqlen_q=20, seqlen_k=25, cu_seqlens_q=a["cu_seqlens_q"],
                 cu_seqlens_k=a["cu_seqlens_k"])
    shifted = torch.zeros(30 * 4 * 64 + 1, dtype=torch.bfloat16)[1:].view(30, 4, 64)
    with pytest.raises(TlcError, match="O's data pointer is not 16-byte aligned"):
        kernel(store(a["q"]), store(a["k"]), store(a["v"]), **dict(given, out=store(shifted)))
    narrow = torch.zeros(30, 4, 68, dtype=torch.bfloat16)[:, :, :64]   # rows 136 bytes apart
    with pytest.raises(TlcError, match="out must be|not multiples of 16 bytes"):
        kernel(store(a["q"]), store(a["k"]), store(a["v"]), **dict(given, out=store(narrow)))
