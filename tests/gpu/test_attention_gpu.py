"""GPU correctness of attention built from the shipped `.tl` specs through the per-op lowering:
`tlc.attention` over dtypes, causal alignments, odd and unequal lengths, GQA/MQA, SDPA strides,
fully masked rows, the default scale and CUDA-graph capture; the tolerance rule of
docs/correctness.md, outputs NaN-poisoned where the launcher allows it.

Run with `pytest -m gpu tests/gpu`; skipped cleanly without a CUDA device.
"""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

import tlc  # noqa: E402
from tlc.runtime import attention_spec  # noqa: E402
from tlc.testing_tolerance import check_attention  # noqa: E402

SEQLENS = [1, 17, 128, 1000]
UNEQUAL = [(17, 1000), (1000, 17), (1, 4096)]


def _qkv(dt, B, Hq, Hkv, Sq, Sk, d, layout="bhsd"):
    g = torch.Generator(device="cuda").manual_seed(Sq * 131 + Sk + d)
    if layout == "bshd":  # SDPA view of a (B, S, H, D) buffer: strides differ, last dim contiguous
        make = lambda h, s: torch.randn(B, s, h, d, device="cuda", dtype=dt, generator=g).transpose(1, 2)  # noqa: E731
    else:
        make = lambda h, s: torch.randn(B, h, s, d, device="cuda", dtype=dt, generator=g)  # noqa: E731
    return make(Hq, Sq), make(Hkv, Sk), make(Hkv, Sk)


def run_and_check(dt, d, causal, B, Hq, Hkv, Sq, Sk, layout="bhsd"):
    q, k, v = _qkv(dt, B, Hq, Hkv, Sq, Sk, d, layout)
    out = tlc.attention(q, k, v, is_causal=causal, enable_gqa=Hq != Hkv)
    torch.cuda.synchronize()
    report = check_attention(out, q, k, v, causal=causal)
    assert report.passed, f"{dt} d={d} causal={causal} B{B} H{Hq}/{Hkv} {Sq}x{Sk}: {report}"


@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen", SEQLENS)
def test_equal_seqlens(dt, d, causal, seqlen):
    run_and_check(dt, d, causal, 2, 4, 4, seqlen, seqlen)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk", UNEQUAL)
def test_unequal_seqlens_gqa(d, causal, sq, sk):
    run_and_check(torch.bfloat16, d, causal, 1, 8, 2, sq, sk)


@pytest.mark.parametrize("hq,hkv", [(8, 2), (8, 1)], ids=["gqa", "mqa"])
def test_gqa_mqa(hq, hkv):
    run_and_check(torch.bfloat16, 128, True, 2, hq, hkv, 333, 777)


@pytest.mark.parametrize("d_qk,d_v,causal", [(192, 128, True), (256, 256, False)], ids=["mla_prefill", "d256"])
@pytest.mark.parametrize("sq,sk", [(1000, 1000), (17, 300)])
def test_other_head_dims(d_qk, d_v, causal, sq, sk):
    q, k, v = _qkv(torch.bfloat16, 1, 4, 4, sq, sk, d_qk)
    v = v[..., :d_v].contiguous()
    out = tlc.attention(q, k, v, is_causal=causal)
    assert check_attention(out, q, k, v, causal=causal).passed


def test_sdpa_strides_bshd():
    run_and_check(torch.bfloat16, 64, True, 2, 4, 4, 300, 300, layout="bshd")


def test_bottom_right_alignment_from_the_spec():
    """Align is a Param: the same spec built bottom-right matches SDPA's bottom-right reference."""
    spec, defines = attention_spec("bf16", 64, 64, True)
    kern = tlc.build(spec, defines=dict(defines, Align="bottom_right"))
    q, k, v = _qkv(torch.bfloat16, 1, 2, 2, 77, 333, 64)
    out = kern(q, k, v)
    assert check_attention(out, q, k, v, causal=True, alignment="bottom_right").passed


def test_fully_masked_rows_are_zero():
    """Top-left causal with more queries than keys: every query row has at least key 0; bottom-right
    with Sq > Sk leaves the first Sq - Sk rows with no key at all, and those must be 0."""
    spec, defines = attention_spec("bf16", 64, 64, True)
    kern = tlc.build(spec, defines=dict(defines, Align="bottom_right"))
    q, k, v = _qkv(torch.bfloat16, 1, 2, 2, 100, 30, 64)
    out = kern(q, k, v)
    assert torch.equal(out[:, :, :70], torch.zeros_like(out[:, :, :70]))
    assert check_attention(out, q, k, v, causal=True, alignment="bottom_right").passed


def test_default_scale_is_inverse_sqrt_d():
    q, k, v = _qkv(torch.bfloat16, 1, 2, 2, 64, 64, 64)
    a = tlc.attention(q, k, v)
    b = tlc.attention(q, k, v, scale=1 / math.sqrt(64))
    assert torch.equal(a, b)


def test_cuda_graph_capture_and_replay():
    q, k, v = _qkv(torch.bfloat16, 1, 4, 4, 256, 256, 64)
    tlc.attention(q, k, v)  # builds and loads the module outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = tlc.attention(q, k, v)
    q.copy_(torch.randn_like(q))
    graph.replay()
    torch.cuda.synchronize()
    assert check_attention(out, q, k, v).passed
