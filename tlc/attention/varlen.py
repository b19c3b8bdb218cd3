"""`tlc.flash_attn_varlen_func`: attention over packed sequences of different lengths in FlashAttention's shapes —
q (total queries, heads, d), k and v (total keys, kv heads, d), sequence b at rows cu_seqlens[b] … cu_seqlens[b+1]−1.
It runs specs/varlen_fwd.tl, whose tensors are read and written through row maps (`rows at cu_seqlens_q[batch_idx]
+ row`): the packed tensors are viewed as (1, heads, rows, d) storages, never copied, and the output is written
in the queries' rows. Under torch.compile or another tracer the call is one node, the custom op
`tlc::flash_attn_varlen_func` (tlc/attention/serving_ops.py).
"""
from __future__ import annotations

import math

from tlc.attention.kernels import spec_kernel
from tlc.attention.sdpa import refusal
from tlc.attention.serving_args import as_storage, call_errors, call_geometry, check_tensors
from tlc.numbers import a_kind
from tlc.recent import Recent

_CALLS = Recent(64)   # an eager call's geometry → (scale, kernel): its checks passed once


def varlen_plan(d: int, dtype: str, causal: bool) -> tuple[str, dict]:
    """(spec, -D bindings) of the program a call runs."""
    return "varlen_fwd", {"HeadDim": d, "BM": 128 if d <= 128 else 64, "BN": 64, "dtype": dtype, "Causal": causal}


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=None,
                           causal: bool = False):
    """Attention of each packed sequence's queries to its own keys; `cu_seqlens_*` int32 (batch + 1,) offsets
    starting at 0, non-decreasing (a sequence longer than `max_seqlen_*` is cut there); `causal` aligns each
    sequence's queries with the end of its keys (FlashAttention's bottom-right). Returns (total queries, heads, d)."""
    from tlc.attention.sdpa import _eager

    key = _call_key(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal)
    kept = None if key is None else _CALLS.get(key)
    if kept is not None:   # this geometry passed every check before: its scale and kernel
        scale, kernel = kept
        with call_errors("flash_attn_varlen_func"):
            return _launch(kernel, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale)
    _check(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal)
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(q.shape[2])
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), scale, causal)
    if _eager(q, k, v, cu_seqlens_q, cu_seqlens_k):
        out, kernel = _run(*args)
        if key is not None:
            _CALLS.keep(key, (scale, kernel))
        return out
    from tlc.attention.serving_ops import varlen_op   # traced (torch.compile, make_fx): one graph node

    return varlen_op(*args)


def run_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, scale: float,
               causal: bool):
    """The checked call: builds on first use and launches."""
    return _run(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal)[0]


def _run(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, scale: float, causal: bool):
    """`run_varlen`'s output and the kernel it ran."""
    import torch

    spec, defines = varlen_plan(q.shape[2], "bf16" if q.dtype == torch.bfloat16 else "fp16", causal)
    with call_errors("flash_attn_varlen_func"):
        kernel = spec_kernel(spec, defines, q.device)
        return _launch(kernel, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale), kernel


def _launch(kernel, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, scale: float):
    """The program on the packed tensors viewed as (1, heads, rows, d) storages; the output in q's layout."""
    import torch

    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    kernel(as_storage(q), as_storage(k), as_storage(v), out=as_storage(out), scale=scale, seqlen_q=max_seqlen_q,
           seqlen_k=max_seqlen_k, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    return out


def _call_key(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale, causal) -> tuple | None:
    """The call's geometry (serving_args.call_geometry) with the maximum lengths, which settles every check `_check`
    makes; None for anything odd."""
    if type(causal) is not bool or type(max_q) is not int or type(max_k) is not int:
        return None
    return call_geometry((q, k, v, cu_q, cu_k), softmax_scale, max_q, max_k, causal)


def _check(q, k, v, cu_q, cu_k, max_q, max_k, causal) -> None:
    import torch

    check_tensors("flash_attn_varlen_func", (("q", q), ("k", k), ("v", v)), 3, "(total rows, heads, d)")
    if k.shape != v.shape:
        raise refusal(f"flash_attn_varlen_func: k {tuple(k.shape)} and v {tuple(v.shape)} differ (a head_dim_v other "
                      "than d is not supported yet)")
    d = q.shape[2]
    if k.shape[2] != d or d % 8 or d > 256:
        raise refusal(f"flash_attn_varlen_func: head dims q {d}, k {k.shape[2]}: they must be equal, a multiple of 8, "
                      "at most 256")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise refusal(f"flash_attn_varlen_func: q's {q.shape[1]} heads are not a multiple of k's {k.shape[1]}")
    for name, cu in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32 or cu.dim() != 1 or cu.shape[0] < 2 \
                or cu.device != q.device:
            raise refusal(f"flash_attn_varlen_func: {name} must be an int32 tensor of (batch + 1,) on {q.device}")
    if cu_q.shape != cu_k.shape:
        raise refusal(f"flash_attn_varlen_func: cu_seqlens_q has {cu_q.shape[0]} offsets, cu_seqlens_k {cu_k.shape[0]}: "
                      "one more than the batch each")
    for name, n in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise refusal(f"flash_attn_varlen_func: {name} must be an int >= 0, not {n!r}")
    if not isinstance(causal, bool):
        raise refusal(f"flash_attn_varlen_func: causal must be True or False, not {a_kind(causal)}")
