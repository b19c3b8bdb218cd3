"""Float64 references of the variants the specs implement, written independently of
the TL program (no tiles, no loops), so the interpreter is checked against intent.
A program names its variant with `Param Variant`; tlc.testing.oracle checks one without a
known Variant against the program as written instead."""
from __future__ import annotations

from typing import Any, Mapping

import torch


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None,
                        causal: bool = False, alignment: str = "top_left", softcap: float = 0.0) -> torch.Tensor:
    """softmax(q·kᵀ·scale [softcapped] [causal]) · v in float64 over (batch, heads, seq, dim); GQA/MQA
    by repeating KV heads; rows with every key masked are 0 (the GPU tolerance rule's reference)."""
    from tlc.testing_tolerance import attention_reference as reference_in

    return reference_in(q, k, v, scale=scale, causal=causal, alignment=alignment, softcap=softcap or None,
                        dtype=torch.float64)


def b2b_gemm_reference(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, *, activation: str = "relu") -> torch.Tensor:
    """act(a · bᵀ) · c, with b stored (N, K) as an attention K is."""
    a, b, c = (t.to(torch.float64) for t in (a, b, c))
    s = a @ b.transpose(-1, -2)
    s = torch.relu(s) if activation == "relu" else s
    return s @ c


def gemm_chain_reference(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor, *,
                         tile: int) -> torch.Tensor:
    """Σ over key tiles of `tile` rows: relu(relu(a · b_tᵀ) · c_t) · d — the middle relu acts on each
    tile's partial product, so the tile size is part of the meaning."""
    a, b, c, d = (t.to(torch.float64) for t in (a, b, c, d))
    out = torch.zeros(*a.shape[:-1], d.shape[-1], dtype=torch.float64)
    for start in range(0, b.shape[-2], tile):
        s = torch.relu(a @ b[..., start:start + tile, :].transpose(-1, -2))
        out = out + torch.relu(s @ c[..., start:start + tile, :]) @ d
    return out


KNOWN_VARIANTS = ("attention", "b2b_gemm", "gemm_chain")


def known_variant(params: Mapping[str, Any]) -> str | None:
    """The program's `Param Variant` when this module has its reference, else None."""
    variant = params.get("Variant")
    return str(variant) if variant is not None and str(variant) in KNOWN_VARIANTS else None


def reference_for(params: Mapping[str, Any], tensors: Mapping[str, torch.Tensor], scalars: Mapping[str, Any]):
    """(output name, reference tensor) for a program, chosen by its `Variant` parameter. A missing
    Variant reads as attention here, for the attention-shaped pass tests (tests/passes) that omit it;
    `tlc test`, `tlc interp` and tlc.testing's checkers pick their oracle first (tlc.testing.oracle)
    and call this only for a known Variant, so a program without one is never checked as attention."""
    variant = str(params.get("Variant", "attention"))
    if variant == "attention":
        return "O", attention_reference(
            tensors["Q"], tensors["K"], tensors["V"], scale=scalars.get("scale"),
            causal=bool(params.get("Causal", False)), alignment=str(params.get("Align", "top_left")),
            softcap=float(params.get("Softcap", 0.0) or 0.0))
    if variant == "b2b_gemm":
        return "O", b2b_gemm_reference(tensors["A"], tensors["B"], tensors["C"],
                                       activation=str(params.get("Activation", "relu")))
    if variant == "gemm_chain":
        return "O", gemm_chain_reference(tensors["A"], tensors["B"], tensors["C"], tensors["D"],
                                         tile=int(params["BN"]))
    raise ValueError(f"no reference for Variant = {variant}; known: {', '.join(KNOWN_VARIANTS)}")
