"""GPU correctness of the CuTe forward-attention kernels (DESIGN §8 rule, NaN-poisoned outputs).

Run with `pytest -m gpu tests/gpu`; skipped cleanly without a CUDA device. Kernels come from the
tlc cache (fill it first in parallel with `python bench/precompile.py --set tests`).
"""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from tlc.diagnostics import TlcError  # noqa: E402
from tlc.kir.flash_fwd import FlashFwdConfig, default_tiles  # noqa: E402
from tlc.testing_tolerance import attention_reference, check_attention  # noqa: E402

TILES = {d: default_tiles(d, d) for d in (64, 128)}
SEQLENS = [1, 17, 128, 1000, 1024, 4096]
UNEQUAL = [(17, 1000), (1000, 17), (128, 4096), (4096, 128), (1, 4096)]
_KERNELS: dict = {}


def arch() -> str:
    major, minor = torch.cuda.get_device_capability()
    return {(8, 0): "sm_80", (8, 6): "sm_86", (8, 9): "sm_89", (9, 0): "sm_90"}.get((major, minor), "sm_90")


def kernel(cfg: FlashFwdConfig):
    from tlc.backend_cute.attention import attention_kernel
    if cfg not in _KERNELS:
        _KERNELS[cfg] = attention_kernel(cfg, arch())
    return _KERNELS[cfg]


def run_and_check(cfg, B, Hq, Hkv, Sq, Sk, *, softcap=None, layout="bhsd"):
    dt = torch.bfloat16 if cfg.dtype == "bf16" else torch.float16
    if layout == "bshd":  # SDPA view of a (B, S, H, D) buffer: strides differ, last dim contiguous
        q = torch.randn(B, Sq, Hq, cfg.d_qk, device="cuda", dtype=dt).transpose(1, 2)
        k = torch.randn(B, Sk, Hkv, cfg.d_qk, device="cuda", dtype=dt).transpose(1, 2)
        v = torch.randn(B, Sk, Hkv, cfg.d_v, device="cuda", dtype=dt).transpose(1, 2)
    else:
        q = torch.randn(B, Hq, Sq, cfg.d_qk, device="cuda", dtype=dt)
        k = torch.randn(B, Hkv, Sk, cfg.d_qk, device="cuda", dtype=dt)
        v = torch.randn(B, Hkv, Sk, cfg.d_v, device="cuda", dtype=dt)
    out = torch.full((B, Hq, Sq, cfg.d_v), float("nan"), device="cuda", dtype=dt)
    kw = {"softcap": softcap} if softcap is not None else {}
    o = kernel(cfg)(q, k, v, out=out, **kw)
    torch.cuda.synchronize()
    report = check_attention(o, q, k, v, causal=cfg.causal, alignment=cfg.alignment, softcap=softcap)
    assert report.passed, f"{cfg.key()} B{B} H{Hq}/{Hkv} {Sq}x{Sk}: {report}"
    return q, k, v, o


CONFIGS = [FlashFwdConfig(dtype=dt, d_qk=d, d_v=d, causal=c, alignment=a, **TILES[d])
           for dt in ("bf16", "fp16") for d in (128, 64)
           for c, a in ((False, "top_left"), (True, "top_left"), (True, "bottom_right"))]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.key())
@pytest.mark.parametrize("seqlen", SEQLENS)
def test_equal_seqlens(cfg, seqlen):
    B, H = (1, 2) if seqlen >= 4096 else (2, 3)
    run_and_check(cfg, B, H, H, seqlen, seqlen)


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.key())
@pytest.mark.parametrize("sq,sk", UNEQUAL)
def test_unequal_seqlens_gqa(cfg, sq, sk):
    run_and_check(cfg, 1, 4, 2, sq, sk)


VARIANTS = [dict(bm=128, bn=64, warps=4, stages=1), dict(bm=128, bn=32, warps=4, stages=2),
            dict(bm=64, bn=64, warps=4, stages=2), dict(bm=192, bn=64, warps=4, stages=2),
            dict(bm=128, bn=64, warps=4, stages=2, s_prefetch=False, pv_prefetch=False)]  # = bench/precompile.py


@pytest.mark.parametrize("tiles", VARIANTS, ids=lambda t: "_".join(f"{k}{v}" for k, v in t.items()))
@pytest.mark.parametrize("causal", [False, True])
def test_tile_variants(tiles, causal):
    """Other tile/stage choices (the bench sweep's) compute the same function."""
    run_and_check(FlashFwdConfig(d_qk=128, d_v=128, causal=causal, **tiles), 1, 2, 2, 1000, 1000)


@pytest.mark.parametrize("d_qk,d_v,causal", [(192, 128, True), (256, 256, False)], ids=["mla_prefill", "d256"])
@pytest.mark.parametrize("sq,sk", [(1000, 1000), (17, 300)])
def test_other_head_dims(d_qk, d_v, causal, sq, sk):
    """Beyond SDPA's flash backend: d_qk != d_v (MLA prefill) and d = 256."""
    cfg = FlashFwdConfig(d_qk=d_qk, d_v=d_v, causal=causal, **default_tiles(d_qk, d_v))
    run_and_check(cfg, 1, 4, 2, sq, sk)


@pytest.mark.parametrize("hq,hkv", [(8, 2), (8, 1)], ids=["gqa", "mqa"])
def test_gqa_mqa(hq, hkv):
    run_and_check(CONFIGS[1], 2, hq, hkv, 333, 517)


def test_sdpa_strides_bshd():
    run_and_check(CONFIGS[0], 2, 4, 2, 200, 300, layout="bshd")


def test_fully_masked_rows_are_zero():
    cfg = CONFIGS[2]  # causal, bottom-right: with Sq > Sk the first Sq - Sk rows see no key
    _, _, _, o = run_and_check(cfg, 1, 2, 2, 300, 100)
    assert (o[:, :, :200] == 0).all()


def test_lse_output():
    cfg = FlashFwdConfig(dtype="bf16", d_qk=128, d_v=128, causal=True, lse=True, **TILES[128])
    q, k, v = (torch.randn(2, 4, 777, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o, lse = kernel(cfg)(q, k, v, return_lse=True)
    _, lse_ref = attention_reference(q, k, v, causal=True, return_lse=True)
    assert check_attention(o, q, k, v, causal=True).passed
    assert torch.allclose(lse, lse_ref, atol=1e-3, rtol=1e-4)


def test_softcap():
    cfg = FlashFwdConfig(dtype="bf16", d_qk=128, d_v=128, softcap=True, **TILES[128])
    run_and_check(cfg, 2, 4, 2, 259, 700, softcap=30.0)


def test_cuda_graph_capture_and_replay():
    cfg = CONFIGS[0]
    kern = kernel(cfg)
    q, k, v = (torch.randn(2, 4, 300, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = torch.empty_like(q)
    kern(q, k, v, out=out)  # loads the module outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        with torch.cuda.graph(graph, stream=s):
            kern(q, k, v, out=out)
    out.fill_(float("nan"))
    for t in (q, k, v):
        t.copy_(torch.randn_like(t))
    graph.replay()
    torch.cuda.synchronize()
    assert check_attention(out, q, k, v).passed


@pytest.mark.parametrize("bad,message", [
    ("dtype", "dtype"), ("cpu", "CUDA device"), ("lastdim", "contiguous"), ("heads", "multiple of key/value heads"),
    ("headdim", "head dim"), ("rank", "4-D"), ("misaligned", "16-byte")])
def test_argument_errors(bad, message):
    kern = kernel(CONFIGS[0])
    q, k, v = (torch.randn(1, 4, 64, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    if bad == "dtype":
        q = q.half()
    elif bad == "cpu":
        q = q.cpu()
    elif bad == "lastdim":
        q = torch.randn(1, 4, 128, 64, device="cuda", dtype=torch.bfloat16).transpose(-1, -2)
    elif bad == "heads":
        k = k[:, :3]
        v = v[:, :3]
    elif bad == "headdim":
        q, k = q[..., :64], k[..., :64]
    elif bad == "rank":
        q = q[0]
    elif bad == "misaligned":
        q = torch.randn(1 * 4 * 64 * 128 + 1, device="cuda", dtype=torch.bfloat16)[1:].view(1, 4, 64, 128)
    with pytest.raises(TlcError, match=message):
        kern(q, k, v)


def test_default_scale_is_inverse_sqrt_d():
    cfg = CONFIGS[3]
    q, k, v = (torch.randn(1, 2, 100, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    a = kernel(cfg)(q, k, v)
    b = kernel(cfg)(q, k, v, scale=1 / math.sqrt(64))
    assert torch.equal(a, b)
