"""docs/correctness.md's tolerance rule (FlashAttention's), defined once, plus float32 SDPA references.

`ref`  = attention in float32 from the low-precision inputs;
`lowp` = the same computed in the test dtype with the scale applied to K instead of Q;
pass iff max|out − ref| ≤ 2·max|lowp − ref| + 2·noise, noise = max|(ref + 0.3 − 0.3) − ref|.
Fully masked rows must be exactly 0.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


def _expand_kv(t, hq: int):
    hkv = t.shape[1]
    return t if hkv == hq else t.repeat_interleave(hq // hkv, dim=1)


def causal_mask(sq: int, sk: int, alignment: str, device=None):
    """True where a key is visible: top_left (SDPA) or bottom_right (FlashAttention ≥ 2.1)."""
    import torch
    rows = torch.arange(sq, device=device)[:, None]
    cols = torch.arange(sk, device=device)[None, :]
    offset = sk - sq if alignment == "bottom_right" else 0
    return cols <= rows + offset


def attention_reference(q, k, v, *, scale: float | None = None, causal: bool = False, alignment: str = "top_left",
                        softcap: float | None = None, dtype=None, scale_on_k: bool = False, return_lse: bool = False):
    """Softmax attention in `dtype` (default float32), SDPA layout, GQA by repeating K/V heads.
    Fully masked rows give 0 (and lse −inf)."""
    import torch
    dtype = dtype or torch.float32
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    hq = q.shape[1]
    qf, kf, vf = q.to(dtype), _expand_kv(k, hq).to(dtype), _expand_kv(v, hq).to(dtype)
    if scale_on_k:
        s = qf @ (kf * scale).transpose(-1, -2)
    else:
        s = (qf * scale) @ kf.transpose(-1, -2)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if causal:
        visible = causal_mask(q.shape[2], k.shape[2], alignment, q.device)
        s = s.masked_fill(~visible, float("-inf"))
    row_max = s.amax(dim=-1, keepdim=True)
    empty = torch.isinf(row_max) & (row_max < 0)
    p = torch.exp(s - torch.where(empty, torch.zeros_like(row_max), row_max))
    denom = p.sum(dim=-1, keepdim=True)
    out = (p @ vf) / torch.where(denom == 0, torch.ones_like(denom), denom)
    if not return_lse:
        return out
    lse = (row_max + torch.log(denom)).squeeze(-1).float()
    return out, lse


@dataclass
class ToleranceReport:
    passed: bool
    max_err: float
    bound: float
    lowp_err: float
    noise: float
    masked_rows_zero: bool
    message: str

    def __str__(self) -> str:
        return self.message


def check_attention(out, q, k, v, *, scale: float | None = None, causal: bool = False,
                    alignment: str = "top_left", softcap: float | None = None) -> ToleranceReport:
    """Apply the tolerance rule of docs/correctness.md to a kernel output `out` (any float dtype, SDPA layout)."""
    import torch
    ref = attention_reference(q, k, v, scale=scale, causal=causal, alignment=alignment, softcap=softcap)
    lowp = attention_reference(q, k, v, scale=scale, causal=causal, alignment=alignment, softcap=softcap,
                               dtype=q.dtype, scale_on_k=True).float()
    outf = out.float()
    noise = ((ref + 0.3 - 0.3) - ref).abs().max().item() if ref.numel() else 0.0
    lowp_err = (lowp - ref).abs().max().item() if ref.numel() else 0.0
    finite = torch.isfinite(outf).all().item()
    max_err = (outf - ref).abs().max().item() if ref.numel() else 0.0
    bound = 2 * lowp_err + 2 * noise
    masked_ok = True
    if causal and ref.numel():
        visible = causal_mask(q.shape[2], k.shape[2], alignment, q.device)
        empty_rows = ~visible.any(dim=-1)
        if empty_rows.any():
            masked_ok = bool((outf[:, :, empty_rows, :] == 0).all().item())
    passed = bool(finite and max_err <= bound and masked_ok)
    msg = (f"max|out-ref|={max_err:.3e} bound={bound:.3e} (2*{lowp_err:.3e} + 2*{noise:.3e})"
           + ("" if finite else " NON-FINITE output") + ("" if masked_ok else " masked rows not zero"))
    return ToleranceReport(passed, max_err, bound, lowp_err, noise, masked_ok, msg)


def assert_attention_close(out, q, k, v, **kw) -> ToleranceReport:
    report = check_attention(out, q, k, v, **kw)
    assert report.passed, f"attention output outside the tolerance of docs/correctness.md: {report}"
    return report
