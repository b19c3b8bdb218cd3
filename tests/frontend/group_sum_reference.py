"""A float64 reference for specs/group_sum_fwd.tl, independent of the TL interpreter: each query head's
attention output softmax(Q·Kᵀ·scale)·V (causal: key j visible to row i when j <= i, shifted by seqlen_k - seqlen_q bottom-right), summed over the query heads
of each KV group into one (batch, kv_heads, seqlen_q, HeadDim) tensor; a row without a key adds 0."""
from __future__ import annotations

from functools import partial

import torch


def group_sum(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, *, scale: float, causal: bool,
              align: str) -> dict[str, torch.Tensor]:
    kv = K.shape[1]
    group = Q.shape[1] // kv
    Kr, Vr = K.double().repeat_interleave(group, dim=1), V.double().repeat_interleave(group, dim=1)
    S = Q.double() @ Kr.transpose(-1, -2) * scale
    if causal:
        i = torch.arange(Q.shape[2])[:, None]
        j = torch.arange(K.shape[2])[None, :]
        shift = K.shape[2] - Q.shape[2] if align == "bottom_right" else 0
        S = S.masked_fill(j > i + shift, float("-inf"))
    O = torch.softmax(S, dim=-1).nan_to_num(0.0) @ Vr
    return {"O": O.reshape(O.shape[0], kv, group, *O.shape[2:]).sum(dim=2)}


def group_sum_reference(causal: bool, align: str):
    return partial(group_sum, causal=causal, align=align)
