"""Float64 references of the variants the specs implement, written independently of
the TL program (no tiles, no loops), so the interpreter is checked against intent."""
from __future__ import annotations

import math
from typing import Any, Mapping

import torch


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None,
                        causal: bool = False, alignment: str = "top_left", softcap: float = 0.0) -> torch.Tensor:
    """softmax(q·kᵀ·scale [softcapped] [causal]) · v over (batch, heads, seq, dim); GQA/MQA by
    repeating KV heads. Rows with every key masked are 0."""
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ k.transpose(-1, -2) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    sq, sk = q.shape[2], k.shape[2]
    if causal:
        shift = 0 if alignment == "top_left" else sk - sq
        rows = torch.arange(sq)[:, None]
        cols = torch.arange(sk)[None, :]
        s = s.masked_fill(cols > rows + shift, float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    p = torch.exp(s - m)
    l = p.sum(dim=-1, keepdim=True)
    return torch.where(l == 0, torch.zeros_like(l), (p @ v) / torch.where(l == 0, torch.ones_like(l), l))


def b2b_gemm_reference(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, *, activation: str = "relu") -> torch.Tensor:
    """act(a · bᵀ) · c, with b stored (N, K) as an attention K is."""
    a, b, c = (t.to(torch.float64) for t in (a, b, c))
    s = a @ b.transpose(-1, -2)
    s = torch.relu(s) if activation == "relu" else s
    return s @ c


def reference_for(params: Mapping[str, Any], tensors: Mapping[str, torch.Tensor], scalars: Mapping[str, Any]):
    """(output name, reference tensor) for a program, chosen by its `Variant` parameter."""
    variant = str(params.get("Variant", "attention"))
    if variant == "attention":
        return "O", attention_reference(
            tensors["Q"], tensors["K"], tensors["V"], scale=scalars.get("scale"),
            causal=bool(params.get("Causal", False)), alignment=str(params.get("Align", "top_left")),
            softcap=float(params.get("Softcap", 0.0) or 0.0))
    if variant == "b2b_gemm":
        return "O", b2b_gemm_reference(tensors["A"], tensors["B"], tensors["C"],
                                       activation=str(params.get("Activation", "relu")))
    raise ValueError(f"no reference for Variant = {variant}; known: attention, b2b_gemm")
