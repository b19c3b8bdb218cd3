"""The serving calls as graph nodes on a GPU: `tlc.flash_attn_with_kvcache` and `tlc.flash_attn_varlen_func`
under torch.compile (fullgraph: each call is the custom op, no graph break) equal their eager calls bit for bit,
and a decode step captured in a CUDA graph replays with new queries and new `cache_seqlens` written into the
captured tensors (the lengths are read on the device, so a replay needs no host work) equal to an eager call on
the new values. The kernels are the ones tests/gpu/test_kvcache_gpu.py and test_varlen_gpu.py build."""
from __future__ import annotations

import pytest
import torch

import tlc

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _decode_case(seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    make = lambda *shape: torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g)  # noqa: E731
    q, k, v = make(4, 1, 8, 128), make(4, 1000, 2, 128), make(4, 1000, 2, 128)
    lengths = torch.tensor([0, 5, 517, 1000], dtype=torch.int32, device="cuda")
    return q, k, v, lengths


def test_kvcache_under_torch_compile_equals_eager() -> None:
    q, k, v, lengths = _decode_case(1)
    step = torch.compile(lambda q, k, v, n: tlc.flash_attn_with_kvcache(q, k, v, cache_seqlens=n) * 1.0,
                         fullgraph=True)
    with torch.inference_mode():
        compiled = step(q, k, v, lengths)
        eager = tlc.flash_attn_with_kvcache(q, k, v, cache_seqlens=lengths)
    torch.cuda.synchronize()
    assert torch.isfinite(compiled).all()
    assert torch.equal(compiled, eager)


def test_kvcache_in_a_cuda_graph_replays_with_new_lengths() -> None:
    q, k, v, lengths = _decode_case(2)
    static_q, static_lengths = q.clone(), lengths.clone()
    with torch.inference_mode():
        tlc.flash_attn_with_kvcache(static_q, k, v, cache_seqlens=static_lengths)   # build and load outside capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = tlc.flash_attn_with_kvcache(static_q, k, v, cache_seqlens=static_lengths)
        for seed, new_lengths in ((3, [1000, 0, 33, 999]), (4, [7, 8, 9, 10])):
            new_q = _decode_case(seed)[0]
            static_q.copy_(new_q)
            static_lengths.copy_(torch.tensor(new_lengths, dtype=torch.int32))
            static_out.fill_(float("nan"))
            graph.replay()
            eager = tlc.flash_attn_with_kvcache(new_q, k, v, cache_seqlens=static_lengths.clone())
            torch.cuda.synchronize()
            assert torch.isfinite(static_out).all(), f"lengths {new_lengths}: the replay left NaN"
            assert torch.equal(static_out, eager), f"lengths {new_lengths}: replay and eager call differ"


def test_varlen_under_torch_compile_equals_eager() -> None:
    g = torch.Generator(device="cuda").manual_seed(5)
    lengths = [17, 0, 333, 1, 128]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(int(cu[-1]), heads, 128, device="cuda", dtype=torch.bfloat16, generator=g)
               for heads in (8, 2, 2))
    call = lambda q, k, v, cu: tlc.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths),  # noqa: E731
                                                          causal=True)
    with torch.inference_mode():
        compiled = torch.compile(lambda *a: call(*a) * 1.0, fullgraph=True)(q, k, v, cu)
        eager = call(q, k, v, cu)
    torch.cuda.synchronize()
    assert torch.isfinite(compiled).all()
    assert torch.equal(compiled, eager)
