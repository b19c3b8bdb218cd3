"""A float64 reference for specs/mha_lse_fwd.tl, independent of the TL interpreter: O = softmax(Q·Kᵀ·scale) V and
LSE = log Σ_j exp(scale · q_i·k_j) over the keys row i sees (causal: j <= i, shifted by seqlen_k - seqlen_q
bottom-right); a row without a key has O = 0 and LSE = -inf. GQA by repeating each K/V head over its group."""
from __future__ import annotations

from functools import partial

import torch


def attention_with_lse(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, *, scale: float, causal: bool,
                       align: str) -> dict[str, torch.Tensor]:
    group = Q.shape[1] // K.shape[1]
    K, V = K.double().repeat_interleave(group, dim=1), V.double().repeat_interleave(group, dim=1)
    S = Q.double() @ K.transpose(-1, -2) * scale
    if causal:
        shift = K.shape[2] - Q.shape[2] if align == "bottom_right" else 0
        i = torch.arange(Q.shape[2])[:, None]
        j = torch.arange(K.shape[2])[None, :]
        S = S.masked_fill(j > i + shift, float("-inf"))
    P = torch.softmax(S, dim=-1).nan_to_num(0.0)
    return {"O": P @ V, "LSE": torch.logsumexp(S, dim=-1)}


def lse_reference(causal: bool, align: str):
    return partial(attention_with_lse, causal=causal, align=align)
