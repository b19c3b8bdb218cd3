"""`tlc::flash_attn_with_kvcache` and `tlc::flash_attn_varlen_func`, the torch.library custom ops that
`tlc.flash_attn_with_kvcache` and `tlc.flash_attn_varlen_func` become under torch.compile or another tracer, so a
call is one graph node: the fake implementations give the output's shape without a GPU, the real ones
(tlc.attention.kvcache.run_with_kvcache, tlc.attention.varlen.run_varlen) build on first use and launch. Eager
calls skip the dispatch (the functions call the runs directly). The Python functions check every argument before
either; the ops take them checked (the cache lengths an int32 tensor, the scale a float).
"""
from __future__ import annotations

from typing import Optional

import torch

from tlc.attention.kvcache import run_with_kvcache
from tlc.attention.torch_op import register_no_backward
from tlc.attention.varlen import run_varlen


@torch.library.custom_op("tlc::flash_attn_with_kvcache", mutates_args=())
def kvcache_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor,
               block_table: Optional[torch.Tensor], softmax_scale: float, causal: bool, num_splits: int) -> torch.Tensor:
    """q (batch, new tokens, heads, d) against the cache → (batch, new tokens, heads, d)."""
    return run_with_kvcache(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, causal, num_splits)


@kvcache_op.register_fake
def _kvcache_fake(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, causal, num_splits):
    return q.new_empty(q.shape)


@torch.library.custom_op("tlc::flash_attn_varlen_func", mutates_args=())
def varlen_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
              cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float,
              causal: bool) -> torch.Tensor:
    """Packed q (total queries, heads, d) → (total queries, heads, d)."""
    return run_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal)


@varlen_op.register_fake
def _varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal):
    return q.new_empty(q.shape)


for _op in (kvcache_op, varlen_op):
    register_no_backward(_op, "tlc's serving calls have no backward kernel: run them under torch.no_grad() / "
                              "torch.inference_mode()")
