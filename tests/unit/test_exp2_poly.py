"""tlc::exp2_poly (templates/preamble.cuh), the FMA-pipe 2^x `emulate-exp2` uses, replayed step by step in
float32 with its own constants read from the header: relative error within 2e-4 over the range
softmax feeds it (lazy-rescale lets scores reach 2^8), exactly 0 for -inf and below -126.
The CUDA function itself runs in tests/gpu/test_sm90a_specs_gpu.py (`*_exp2poly` cases)."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

HEADER = Path(__file__).resolve().parents[2] / "tlc" / "backend_cute" / "templates" / "preamble.cuh"


def _function() -> str:
    text = HEADER.read_text()
    start = text.index("__device__ __forceinline__ float exp2_poly(float x) {")
    return text[start:text.index("\n}\n", start)]


def _exp2_poly(x: np.ndarray) -> np.ndarray:
    body = _function()
    magic = np.float32(float(re.search(r"t = x \+ ([0-9.]+)f;", body).group(1)))
    c3, c2, c1, c0 = (np.float32(float(v)) for v in re.search(
        r"fmaf\(fmaf\(fmaf\(([0-9.e-]+)f, f, ([0-9.e-]+)f\), f, ([0-9.e-]+)f\), f, ([0-9.e-]+)f\)", body).groups())
    floor = np.float32(float(re.search(r"return x < (-[0-9.]+)f \? 0.f", body).group(1)))
    shift = int(re.search(r"bits = __float_as_int\(p\) \+ \(__float_as_int\(t\) << (\d+)\);", body).group(1))
    x = x.astype(np.float32)
    with np.errstate(invalid="ignore"):
        t = x + magic
        f = x - (t - magic)
        p = ((c3 * f + c2) * f + c1) * f + c0          # fmaf rounds once; within the tolerance below
        bits = (p.view(np.int32).astype(np.int64) + (t.view(np.int32).astype(np.int64) << shift)) & 0xFFFFFFFF
    return np.where(x < floor, np.float32(0.0), bits.astype(np.uint32).view(np.float32))


def test_relative_error_over_the_softmax_range() -> None:
    x = np.linspace(-126.0, 9.0, 1_000_001, dtype=np.float32)
    got, want = _exp2_poly(x).astype(np.float64), np.exp2(x.astype(np.float64))
    assert np.max(np.abs(got - want) / want) < 2e-4


def test_masked_scores_give_zero_and_integers_are_near_exact() -> None:
    got = _exp2_poly(np.array([-np.inf, -1e30, -200.0, -126.5], dtype=np.float32))
    assert (got == 0).all()
    ints = np.arange(-120, 9, dtype=np.float32)
    assert np.max(np.abs(_exp2_poly(ints) / np.exp2(ints) - 1)) < 1e-4
