"""A float64 reference for specs/paged_kv_fwd.tl, independent of the TL interpreter: the keys and values of
sequence b are rows j < min(kv_lengths[b], seqlen_k) of its pages — row j at row j % page of page
block_table[b, j / page] of the (1, kv heads, rows, d) pool, zeros where that row is outside the pool — then
kv_lengths_attention (tests/frontend/document_reference.py, causal at each sequence's length) on the gathered,
dense K and V."""
from __future__ import annotations

from functools import partial

import torch

from tests.frontend.document_reference import kv_lengths_attention


def unpaged(pool: torch.Tensor, block_table: torch.Tensor, page: int, rows: int) -> torch.Tensor:
    """(batch, heads, rows, d) from the pool: row j of sequence b from its page, zeros outside the pool."""
    out = torch.zeros((block_table.shape[0], pool.shape[1], rows, pool.shape[3]), dtype=torch.float64)
    for b in range(block_table.shape[0]):
        for j in range(rows):
            p = j // page
            at = int(block_table[b, p]) * page + j % page if p < block_table.shape[1] else j % page
            if 0 <= at < pool.shape[2]:
                out[b, :, j] = pool[0, :, at].double()
    return out


def paged_attention(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, *, scale: float, kv_lengths: torch.Tensor,
                    block_table: torch.Tensor, seqlen_k: int, page: int, causal: bool = False) -> torch.Tensor:
    return kv_lengths_attention(Q, unpaged(K, block_table, page, seqlen_k), unpaged(V, block_table, page, seqlen_k),
                                scale=scale, kv_lengths=kv_lengths, causal=causal)


def paged_reference(page: int, causal: bool = False):
    """The reference for the spec's `Param PageSize` and `Param Causal`."""
    return partial(paged_attention, page=page, causal=causal)
