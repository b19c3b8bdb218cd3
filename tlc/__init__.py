"""tlc: a compiler from LLM-TL to CUTLASS CuTe kernels.

`tlc.build(path_or_text, arch=…, defines=…)` returns a kernel callable on torch tensors;
`tlc.attention(q, k, v, is_causal=False, scale=None, enable_gqa=False)` mirrors torch's
scaled_dot_product_attention for inference (no backward kernel yet) and runs as the custom op
`torch.ops.tlc.attention`, so torch.compile traces it. Both import torch and the GPU machinery
only when called.
"""
from __future__ import annotations

__version__ = "0.1.0"


def build(path_or_text, *, arch=None, defines=None, lse=False):
    from tlc.runtime import build as _build

    return _build(path_or_text, arch=arch, defines=defines, lse=lse)


def attention(q, k, v, is_causal=False, scale=None, enable_gqa=False):
    from tlc.runtime import attention as _attention

    return _attention(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)


__all__ = ["build", "attention", "__version__"]
