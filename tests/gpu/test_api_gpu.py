"""`tlc.build` and `tlc.attention` end to end on the GPU: TL file → passes → kernel → torch."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import tlc
from tlc.testing_tolerance import check_attention

SPECS = Path(__file__).resolve().parents[2] / "specs"
MHA64 = {"HeadDim": 64, "BM": 64, "BN": 64}


def _inputs(b, hq, hkv, sq, sk, d, dtype):
    g = torch.Generator(device="cuda").manual_seed(sq * 131 + sk)
    make = lambda h, s: torch.randn(b, h, s, d, device="cuda", dtype=dtype, generator=g)  # noqa: E731
    return make(hq, sq), make(hkv, sk), make(hkv, sk)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq, sk", [(1, 1), (17, 1000), (1000, 17), (128, 128)])
def test_build_from_tl_file(causal, sq, sk) -> None:
    kernel = tlc.build(SPECS / "mha_fwd.tl", defines=dict(MHA64, Causal=causal))
    q, k, v = _inputs(2, 4, 4, sq, sk, 64, torch.bfloat16)
    out = kernel(q, k, v)
    report = check_attention(out, q, k, v, causal=causal)
    assert report.passed, report


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("hq, hkv", [(8, 8), (8, 2), (8, 1)])
def test_attention_mirrors_sdpa(dtype, hq, hkv) -> None:
    q, k, v = _inputs(2, hq, hkv, 333, 77, 128, dtype)
    out = tlc.attention(q, k, v, is_causal=True, enable_gqa=hq != hkv)
    report = check_attention(out, q, k, v, causal=True)
    assert report.passed, report
    again = tlc.attention(q, k, v, is_causal=True, enable_gqa=hq != hkv, scale=1 / math.sqrt(128))
    assert torch.equal(out, again)


@pytest.mark.gpu
@pytest.mark.parametrize("d, causal, b, hq, hkv, s", [(128, False, 4, 32, 8, 1000), (64, False, 1, 16, 16, 4096),
                                                      (128, True, 4, 32, 8, 1000), (64, True, 4, 16, 4, 999)])
def test_short_keys_take_the_persistent_kernel_over_many_tiles(d, causal, b, hq, hkv, s) -> None:
    """Short key sequences run persistent on Hopper (tlc.attention.tuning.short_keys): hundreds of tiles for 132 SMs,
    so CTAs loop over several; every head of the output is checked, not a slice."""
    from tlc.attention.kernels import attention_target
    from tlc.attention.tuning import short_keys

    assert attention_target() != "sm_90a" or short_keys("sm_90a", d, d, causal, s)
    q, k, v = _inputs(b, hq, hkv, s, s, d, torch.bfloat16)
    out = tlc.attention(q, k, v, is_causal=causal, enable_gqa=hq != hkv)
    report = check_attention(out, q, k, v, causal=causal)
    assert report.passed, report


@pytest.mark.gpu
def test_attention_refuses_mismatched_heads() -> None:
    q, k, v = _inputs(1, 8, 2, 16, 16, 64, torch.bfloat16)
    with pytest.raises(tlc.diagnostics.TlcError, match="enable_gqa"):
        tlc.attention(q, k, v)



def builds() -> list[tuple[Path, dict]]:
    """Every (spec, -D bindings) these tests build, for bench/precompile.py and --precompile (no GPU)."""
    from tlc.attention.kernels import attention_spec

    out = [(SPECS / "mha_fwd.tl", dict(MHA64, Causal=causal)) for causal in (False, True)]
    return out + [attention_spec(dtype, 128, 128, True) for dtype in ("bf16", "fp16")]


def _precompile(job: tuple[Path, dict]) -> str:
    spec, defines = job
    tlc.build(spec, arch="sm_90", defines=defines)
    return f"built {spec.name} {defines}"


if __name__ == "__main__":
    import sys
    from concurrent.futures import ProcessPoolExecutor

    if "--precompile" in sys.argv:
        jobs = builds()
        with ProcessPoolExecutor(max_workers=len(jobs)) as pool:
            for line in pool.map(_precompile, jobs):
                print(line, flush=True)
