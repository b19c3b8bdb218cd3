"""`tlc.attention` on a GPU: inference under no_grad/inference_mode, torch.compile(fullgraph=True)
equal to eager, SDPA's answers for empty shapes, and caller strides."""
from __future__ import annotations

import pytest
import torch

import tlc
from tlc.diagnostics import TlcError
from tlc.testing_tolerance import check_attention

pytestmark = pytest.mark.gpu
D = 64  # one kernel for the whole file: gqa_fwd at head dim 64, causal


def _qkv(b=2, hq=4, hkv=2, sq=77, sk=130, d=D, grad=False):
    g = torch.Generator(device="cuda").manual_seed(sq * 31 + sk)
    make = lambda h, s: torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=g)  # noqa: E731
    return [t.requires_grad_(grad) for t in (make(hq, sq), make(hkv, sk), make(hkv, sk))]


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_inputs_that_require_grad_run_without_grad_mode(mode) -> None:
    q, k, v = _qkv(grad=True)
    with pytest.raises(TlcError, match="torch.no_grad"):
        tlc.attention(q, k, v, is_causal=True, enable_gqa=True)
    with mode():
        out = tlc.attention(q, k, v, is_causal=True, enable_gqa=True)
    report = check_attention(out, q.detach(), k.detach(), v.detach(), causal=True)
    assert report.passed, report


def test_torch_compile_fullgraph_equals_eager() -> None:
    q, k, v = _qkv()

    def f(q, k, v):
        return tlc.attention(q, k, v, is_causal=True, enable_gqa=True) * 0.5 + 1

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), f(q, k, v), atol=1e-2, rtol=1e-2)


def test_empty_shapes_answer_as_sdpa() -> None:
    q, k, v = _qkv(sq=0)
    assert tlc.attention(q, k, v, is_causal=True, enable_gqa=True).shape == (2, 4, 0, D)
    q, k, v = _qkv(sk=0)
    out = tlc.attention(q, k, v, is_causal=True, enable_gqa=True)
    assert torch.equal(out, torch.zeros_like(q))


def test_any_strides_like_sdpa() -> None:
    q, k, v = _qkv()
    q_t = q.transpose(2, 3).contiguous().transpose(2, 3)  # column-major rows: copied for the kernel
    out = tlc.attention(q_t, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(out, tlc.attention(q, k, v, is_causal=True, enable_gqa=True), atol=0, rtol=0)


def test_a_neg_view_is_read_negated_also_after_a_planned_call() -> None:
    """torch._neg_view's lazy sign: the kernel reads memory, so tlc.attention must negate it first, also when
    the same geometry already has a call plan."""
    q, k, v = _qkv()
    tlc.attention(q, k, v, is_causal=True, enable_gqa=True)   # plans the geometry
    for neg_q, neg_v in ((True, False), (False, True)):
        args = (torch._neg_view(q) if neg_q else q, k, torch._neg_view(v) if neg_v else v)
        out = tlc.attention(*args, is_causal=True, enable_gqa=True)
        report = check_attention(out, -q if neg_q else q, k, -v if neg_v else v, causal=True)
        assert report.passed, report


@pytest.mark.parametrize("d", [40, 80, 96, 112, 160, 224])
@pytest.mark.parametrize("sq,sk", [(1, 1), (17, 1000), (333, 77)])
def test_head_dims_that_are_multiples_of_8(d, sq, sk) -> None:
    """FlashAttention's test widths: padded to a multiple of 32 inside the kernel (DESIGN §8's rule)."""
    q, k, v = _qkv(b=1, hq=4, hkv=2, sq=sq, sk=sk, d=d)
    for causal in (False, True):
        out = tlc.attention(q, k, v, is_causal=causal, enable_gqa=True)
        report = check_attention(out, q, k, v, causal=causal)
        assert report.passed, f"d={d} {sq}x{sk} causal={causal}: {report}"


@pytest.mark.parametrize("d", [40, 96, 160, 224])
def test_head_dims_that_are_multiples_of_8_over_long_keys(d) -> None:
    """Past every short-keys limit (tlc.attention.tuning.short_keys): the one-tile kernels with the next-wave
    prefetch at the padded widths, 448 to 1344 CTAs for the GPU's 132 SMs."""
    q, k, v = _qkv(b=8, hq=8, hkv=2, sq=1333, sk=4100, d=d)
    for causal in (False, True):
        out = tlc.attention(q, k, v, is_causal=causal, enable_gqa=True)
        report = check_attention(out, q, k, v, causal=causal)
        assert report.passed, f"d={d} 1333x4100 causal={causal}: {report}"


def test_sdpas_positional_call_means_what_it_means_for_sdpa() -> None:
    """SDPA's places 4 to 8 are attn_mask, dropout_p, is_causal, scale, enable_gqa: a call written for SDPA
    gives SDPA's answer and the keyword call's output, from tlc.attention and from the op alike."""
    q, k, v = _qkv()
    out = tlc.attention(q, k, v, None, 0.0, True, None, True)
    report = check_attention(out, q, k, v, causal=True)
    assert report.passed, report
    assert torch.equal(out, tlc.attention(q, k, v, is_causal=True, enable_gqa=True))
    assert torch.equal(out, torch.ops.tlc.attention(q, k, v, None, 0.0, True, None, True))
    scaled = tlc.attention(q, k, v, None, 0, False, 0.3, True)
    report = check_attention(scaled, q, k, v, scale=0.3)
    assert report.passed, report
    assert torch.equal(scaled, tlc.attention(q, k, v, scale=0.3, enable_gqa=True))


def test_torch_compile_fullgraph_of_a_positional_sdpa_call_equals_eager() -> None:
    q, k, v = _qkv()

    def f(q, k, v):
        return tlc.attention(q, k, v, None, 0.0, True, None, True) * 0.5 + 1

    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(f, fullgraph=True)(q, k, v), f(q, k, v), atol=1e-2, rtol=1e-2)


def test_a_planned_geometry_still_refuses_a_mask_and_dropout() -> None:
    q, k, v = _qkv()
    out = tlc.attention(q, k, v, is_causal=True, enable_gqa=True)   # plans the geometry
    mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device="cuda").tril()
    with pytest.raises(TlcError, match="attn_mask is not supported yet"):
        tlc.attention(q, k, v, mask, enable_gqa=True)
    with pytest.raises(TlcError, match="tlc has no dropout"):
        tlc.attention(q, k, v, dropout_p=0.1, is_causal=True, enable_gqa=True)
    assert torch.equal(out, tlc.attention(q, k, v, dropout_p=0, is_causal=True, enable_gqa=True))
