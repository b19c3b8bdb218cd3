"""`tlc.flash_attn_with_kvcache` on a GPU against a float32 reference per sequence (docs/correctness.md's rule,
tlc.testing_tolerance.check_attention): contiguous and paged caches (pages of 16 and 64 scattered by a
permutation), GQA and MQA, one new token (the heads folded into the rows) and three (causal, bottom-right at
each sequence's length), lengths 0, odd and full, forced and heuristic splits. Every cache row no sequence
reads — past its length, in unused pages — is NaN, so a read of one shows."""
from __future__ import annotations

import math

import pytest
import torch

import tlc
from tlc.testing_tolerance import check_attention

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
LENGTHS = [0, 5, 517, 1000]
CONTIGUOUS = [(h, kvh, sq, causal, d) for h, kvh in ((8, 2), (4, 1)) for sq, causal in ((1, False), (3, True), (3, False))
              for d in (64, 128)]
PAGED = [(page, sq, causal, h, kvh) for page in (16, 64) for sq, causal in ((1, False), (3, True))
         for h, kvh in ((8, 2), (4, 1))]
SPLITS = [1, 4, 64]


def builds() -> list[tuple]:
    """The kernels these tests build on an H200 (132 SMs; sm_90a), for bench/precompile.py --set tests."""
    from tlc.attention.kernels import specs_dir
    from tlc.attention.kvcache import kernel_plan

    plans = [kernel_plan(4, sq, h, kvh, d, 1000, "bf16", causal) for h, kvh, sq, causal, d in CONTIGUOUS]
    plans += [kernel_plan(4, 1, 8, 2, 128, 1000, "bf16", False, num_splits=s) for s in SPLITS]
    plans += [kernel_plan(4, sq, h, kvh, 128, 1024, "bf16", causal, page) for page, sq, causal, h, kvh in PAGED]
    plans += [kernel_plan(4, 1, 8, 2, 128, 1024, "bf16", False, 16, num_splits=s) for s in SPLITS]
    plans += [kernel_plan(2, 1, 8, 2, 64, 256, "bf16", False), kernel_plan(2, 1, 8, 2, 64, 256, "bf16", False, 64)]
    unique = {(spec, tuple(sorted(d.items()))) for spec, d in plans}
    return [(specs_dir() / f"{spec}.tl", dict(d), spec, "sm_90a") for spec, d in sorted(unique)]


def case(b, h, kvh, sq, sk, d, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    make = lambda *shape: torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g)  # noqa: E731
    q, k, v = make(b, sq, h, d), make(b, sk, kvh, d), make(b, sk, kvh, d)
    lengths = torch.tensor(LENGTHS[:b], dtype=torch.int32, device="cuda")
    for i, n in enumerate(LENGTHS[:b]):   # what no sequence reads is NaN
        k[i, n:], v[i, n:] = float("nan"), float("nan")
    return q, k, v, lengths


def paged(k, v, page: int):
    """The caches as (pages, page, kv heads, d) with 3 spare NaN pages, scattered by a permutation; the table."""
    b, sk, kvh, d = k.shape
    per = sk // page
    table = torch.randperm(b * per + 3, device="cuda")[:b * per].view(b, per).to(torch.int32)
    pools = []
    for t in (k, v):
        pool = torch.full((b * per + 3, page, kvh, d), float("nan"), device="cuda", dtype=t.dtype)
        pool[table.view(-1).long()] = t.view(b * per, page, kvh, d)
        pools.append(pool)
    return pools[0], pools[1], table


def check(out, q, k, v, lengths, causal: bool) -> None:
    b, sq, h, d = q.shape
    group = h // k.shape[2]
    assert tuple(out.shape) == tuple(q.shape)
    for i, n in enumerate(lengths.tolist()):
        o = out[i:i + 1].transpose(1, 2)
        if n == 0:   # no key: 0, as FlashAttention gives
            assert torch.equal(o, torch.zeros_like(o)), f"sequence {i}: no keys but not 0"
            continue
        kk, vv = (t[i:i + 1, :n].transpose(1, 2).repeat_interleave(group, dim=1) for t in (k, v))
        report = check_attention(o, q[i:i + 1].transpose(1, 2), kk, vv, scale=1 / math.sqrt(d), causal=causal,
                                 alignment="bottom_right")
        assert report.passed, f"sequence {i} (length {n}): {report}"


@pytest.mark.parametrize("h, kvh, sq, causal, d", CONTIGUOUS)
def test_a_contiguous_cache(h: int, kvh: int, sq: int, causal: bool, d: int) -> None:
    q, k, v, lengths = case(4, h, kvh, sq, 1000, d, h * 100 + sq + d)
    out = tlc.flash_attn_with_kvcache(q, k, v, cache_seqlens=lengths, causal=causal)
    torch.cuda.synchronize()
    check(out, q, k, v, lengths, causal)


@pytest.mark.parametrize("splits", SPLITS)
def test_forced_splits(splits: int) -> None:
    q, k, v, lengths = case(4, 8, 2, 1, 1000, 128, splits)
    out = tlc.flash_attn_with_kvcache(q, k, v, cache_seqlens=lengths, num_splits=splits)
    torch.cuda.synchronize()
    check(out, q, k, v, lengths, False)
    q, k, v, lengths = case(4, 8, 2, 1, 1024, 128, splits + 1)
    kp, vp, table = paged(k, v, 16)
    out = tlc.flash_attn_with_kvcache(q, kp, vp, cache_seqlens=lengths, block_table=table, num_splits=splits)
    torch.cuda.synchronize()
    check(out, q, k, v, lengths, False)


@pytest.mark.parametrize("page, sq, causal, h, kvh", PAGED)
def test_a_paged_cache(page: int, sq: int, causal: bool, h: int, kvh: int) -> None:
    q, k, v, lengths = case(4, h, kvh, sq, 1024, 128, page + sq + h)
    lengths[3] = 1024
    k[3], v[3] = torch.randn_like(k[3]), torch.randn_like(v[3])
    kp, vp, table = paged(k, v, page)
    out = tlc.flash_attn_with_kvcache(q, kp, vp, cache_seqlens=lengths, block_table=table, causal=causal)
    torch.cuda.synchronize()
    check(out, q, k, v, lengths, causal)


def test_whole_caches_without_lengths() -> None:
    q, k, v, _ = case(2, 8, 2, 1, 256, 64, 7)
    k, v = torch.randn_like(k), torch.randn_like(v)
    full = torch.full((2,), 256, dtype=torch.int32, device="cuda")
    check(tlc.flash_attn_with_kvcache(q, k, v), q, k, v, full, False)
    kp, vp, table = paged(k, v, 64)
    check(tlc.flash_attn_with_kvcache(q, kp, vp, block_table=table), q, k, v, full, False)
