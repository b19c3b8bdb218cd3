"""A float64 reference for specs/sliding_window_fwd.tl, independent of the TL interpreter: dense
softmax(Q·Kᵀ·scale) V where query row i sees key j only when i - window <= j <= i (a row that sees no key
is 0), GQA by repeating each K/V head over its group of query heads."""
from __future__ import annotations

from functools import partial

import torch


def sliding_window_attention(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, *, scale: float,
                             window: int) -> torch.Tensor:
    group = Q.shape[1] // K.shape[1]
    K, V = K.double().repeat_interleave(group, dim=1), V.double().repeat_interleave(group, dim=1)
    S = Q.double() @ K.transpose(-1, -2) * scale
    i = torch.arange(Q.shape[2])[:, None]
    j = torch.arange(K.shape[2])[None, :]
    seen = (j <= i) & (j >= i - window)
    S = S.masked_fill(~seen, float("-inf"))
    P = torch.softmax(S, dim=-1).nan_to_num(0.0)   # a row without a key: softmax of all -inf is NaN, means 0
    return P @ V


def window_reference(window: int):
    """The reference for a window of `window` keys behind each query row (the spec's `Param Window`)."""
    return partial(sliding_window_attention, window=window)
