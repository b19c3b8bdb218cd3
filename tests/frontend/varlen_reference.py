"""A float64 reference for specs/varlen_fwd.tl, independent of the TL interpreter: packed sequences in (1, heads,
rows, d) storages, sequence b's queries at rows cu_seqlens_q[b] … and keys at cu_seqlens_k[b] …, each at most
seqlen_q / seqlen_k long (a negative length is none); dense softmax(Q·Kᵀ·scale)·V per sequence, causal
bottom-right at each sequence's end; a query row without keys is 0; rows no sequence owns keep NaN; GQA by
repeating each K/V head over its group. Offsets outside a storage's rows (random ones) leave their rows out,
as the row map does: a row outside the storage reads zeros and is not written."""
from __future__ import annotations

from functools import partial

import torch


def _rows(cu: torch.Tensor, b: int, cap: int, total: int) -> torch.Tensor:
    start = int(cu[b])
    n = max(0, min(int(cu[b + 1]) - start, cap))
    return torch.arange(n) + start


def _gather(storage: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    out = torch.zeros((storage.shape[1], len(rows), storage.shape[3]), dtype=torch.float64)
    inside = (rows >= 0) & (rows < storage.shape[2])
    out[:, inside] = storage[0][:, rows[inside]].double()
    return out


def varlen_attention(Q, K, V, *, scale: float, cu_seqlens_q, cu_seqlens_k, seqlen_q: int, seqlen_k: int,
                     causal: bool) -> torch.Tensor:
    out = torch.full((1, Q.shape[1], Q.shape[2], Q.shape[3]), float("nan"), dtype=torch.float64)
    group = Q.shape[1] // K.shape[1]
    for b in range(len(cu_seqlens_q) - 1):
        rq, rk = _rows(cu_seqlens_q, b, seqlen_q, Q.shape[2]), _rows(cu_seqlens_k, b, seqlen_k, K.shape[2])
        q = _gather(Q, rq)
        k, v = (_gather(t, rk).repeat_interleave(group, 0) for t in (K, V))
        s = q @ k.transpose(-1, -2) * scale
        if causal:
            i, j = torch.arange(len(rq))[:, None], torch.arange(len(rk))[None]
            s = s.masked_fill(j > i + len(rk) - len(rq), float("-inf"))
        o = torch.softmax(s, -1).nan_to_num(0.0) @ v if len(rk) else torch.zeros_like(q)
        inside = (rq >= 0) & (rq < Q.shape[2])
        out[0][:, rq[inside]] = o[:, inside]
    return out


def varlen_reference(causal: bool):
    return partial(varlen_attention, causal=causal)
