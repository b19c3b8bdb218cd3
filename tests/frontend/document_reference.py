"""Float64 references for specs/document_mask_fwd.tl and specs/kv_lengths_fwd.tl, independent of the TL
interpreter: dense softmax(Q·Kᵀ·scale) V where query row i of sequence b sees key j only when j < kv_lengths[b]
and (documents) doc_q[b, i] == doc_k[b, j], causal: j <= i shifted by seqlen_k - seqlen_q bottom-right
(documents) or by kv_lengths[b] - seqlen_q (a cache filled to kv_lengths[b]); a row that sees no key is 0; GQA
by repeating each K/V head over its group of query heads. Keys past kv_lengths[b] never enter the sum, so a
NaN there cannot reach the result."""
from __future__ import annotations

from functools import partial

import torch


def document_attention(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, *, scale: float, doc_q: torch.Tensor,
                       doc_k: torch.Tensor, kv_lengths: torch.Tensor, causal: bool, align: str) -> torch.Tensor:
    group = Q.shape[1] // K.shape[1]
    K, V = K.double().repeat_interleave(group, dim=1), V.double().repeat_interleave(group, dim=1)
    S = Q.double() @ K.transpose(-1, -2) * scale
    i = torch.arange(Q.shape[2])[:, None]
    j = torch.arange(K.shape[2])[None, :]
    seen = (doc_q.long()[:, :, None] == doc_k.long()[:, None, :]) & (j[None] < kv_lengths.long()[:, None, None])
    if causal:
        shift = K.shape[2] - Q.shape[2] if align == "bottom_right" else 0
        seen = seen & (j <= i + shift)[None]
    S = S.masked_fill(~seen[:, None], float("-inf"))
    P = torch.softmax(S, dim=-1).nan_to_num(0.0)   # a row without a key: softmax of all -inf is NaN, means 0
    return P @ V


def document_reference(causal: bool, align: str):
    """The reference for the spec's `Param Causal` and `Param Align`."""
    return partial(document_attention, causal=causal, align=align)


def kv_lengths_attention(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, *, scale: float, kv_lengths: torch.Tensor,
                         causal: bool) -> torch.Tensor:
    group = Q.shape[1] // K.shape[1]
    out = torch.zeros(Q.shape, dtype=torch.float64)
    for b in range(Q.shape[0]):
        n = max(0, min(int(kv_lengths[b]), K.shape[2]))
        k = K[b, :, :n].double().repeat_interleave(group, dim=0)
        v = V[b, :, :n].double().repeat_interleave(group, dim=0)
        S = Q[b].double() @ k.transpose(-1, -2) * scale
        if causal:
            i = torch.arange(Q.shape[2])[:, None]
            j = torch.arange(n)[None, :]
            S = S.masked_fill(j > i + n - Q.shape[2], float("-inf"))
        P = torch.softmax(S, dim=-1).nan_to_num(0.0)
        out[b] = P @ v if n else 0.0
    return out


def kv_lengths_reference(causal: bool):
    return partial(kv_lengths_attention, causal=causal)
