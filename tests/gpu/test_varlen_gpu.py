"""`tlc.flash_attn_varlen_func` on a GPU against a float32 reference per sequence (docs/correctness.md's rule):
packed sequences of odd lengths (0 and 1 included), GQA and MQA, causal (bottom-right at each sequence's end) or
not, head dims 64 and 128. The inputs have 5 NaN rows past the last sequence, so a read of one shows in the
output."""
from __future__ import annotations

import math

import pytest
import torch

import tlc
from tlc.testing_tolerance import check_attention

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
LENGTHS = {"odd": ([17, 0, 333, 1, 128], [40, 3, 333, 1, 1000]), "equal": ([256] * 4, [256] * 4)}
CASES = [(name, h, kvh, causal, d) for name in LENGTHS for h, kvh in ((8, 2), (4, 1)) for causal in (False, True)
         for d in (64, 128)]


def builds() -> list[tuple]:
    """The kernels these tests build (sm_90a), for bench/precompile.py --set tests."""
    from tlc.attention.kernels import specs_dir
    from tlc.attention.varlen import varlen_plan

    plans = {(spec, tuple(sorted(defs.items()))) for spec, defs in (varlen_plan(d, "bf16", c) for *_, c, d in CASES)}
    return [(specs_dir() / f"{spec}.tl", dict(d), spec, "sm_90a") for spec, d in sorted(plans)]


@pytest.mark.parametrize("lengths, h, kvh, causal, d", CASES)
def test_packed_sequences(lengths: str, h: int, kvh: int, causal: bool, d: int) -> None:
    lq, lk = LENGTHS[lengths]
    if causal:   # FlashAttention's bottom-right alignment needs a query's keys: as many keys as queries
        lk = [max(a, b) for a, b in zip(lq, lk)]
    g = torch.Generator(device="cuda").manual_seed(h * 10 + d + causal)
    cq = torch.tensor([0, *torch.tensor(lq).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    ck = torch.tensor([0, *torch.tensor(lk).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    tq, tk = int(cq[-1]), int(ck[-1])
    make = lambda n, heads: torch.randn(n + 5, heads, d, device="cuda", dtype=torch.bfloat16, generator=g)  # noqa: E731
    q, k, v = make(tq, h), make(tk, kvh), make(tk, kvh)
    for t in (q, k, v):
        t[-5:] = float("nan")
    out = tlc.flash_attn_varlen_func(q, k, v, cq, ck, max(lq), max(lk), causal=causal)   # 5 NaN rows past the last
    torch.cuda.synchronize()
    assert tuple(out.shape) == (tq + 5, h, d)
    for b in range(len(lq)):
        o = out[cq[b]:cq[b + 1]].transpose(0, 1).unsqueeze(0)
        if lq[b] == 0:
            continue
        if lk[b] == 0:
            assert torch.equal(o, torch.zeros_like(o)), f"sequence {b}: no keys but not 0"
            continue
        qq = q[cq[b]:cq[b + 1]].transpose(0, 1).unsqueeze(0)
        kk, vv = (t[ck[b]:ck[b + 1]].transpose(0, 1).unsqueeze(0).repeat_interleave(h // kvh, dim=1) for t in (k, v))
        report = check_attention(o, qq, kk, vv, scale=1 / math.sqrt(d), causal=causal, alignment="bottom_right")
        assert report.passed, f"sequence {b} ({lq[b]} queries, {lk[b]} keys): {report}"
