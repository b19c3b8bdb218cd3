"""tlc: a compiler from LLM-TL to CUTLASS CuTe kernels.

`tlc.build(path_or_text, arch=…, defines=…)` returns a kernel callable on torch tensors;
`tlc.attention(q, k, v, is_causal=False, scale=None, enable_gqa=False)` mirrors torch's
scaled_dot_product_attention for inference (no backward kernel yet) and runs as the custom op
`torch.ops.tlc.attention`, so torch.compile traces it. Both import torch and the GPU machinery
only when called. `tlc.precompile(calls)` fills the kernel cache for a model's attention calls ahead
of time, compiling the missing kernels in parallel processes.
"""
from __future__ import annotations

__version__ = "0.1.0"


def build(path_or_text, *, arch=None, defines=None, lse=False):
    from tlc.runtime import build as _build

    return _build(path_or_text, arch=arch, defines=defines, lse=lse)


def attention(q, k, v, is_causal=False, scale=None, enable_gqa=False):
    from tlc.runtime import attention as _attention

    return _attention(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)


def precompile(calls, *, arch=None, jobs=0):
    """Compile, in parallel, every kernel `tlc.attention` would build for `calls` and is not cached yet.

    `calls`: dicts with the keys of a `tlc precompile --shapes` line (`d` required; `dv`, `dtype`
    bf16/fp16, `causal`, and the checked but kernel-neutral `b`, `hq`, `hkv`, `sq`, `sk`), e.g.
    `[{"b": 4, "hq": 32, "hkv": 8, "sq": 4096, "sk": 4096, "d": 128, "causal": True}]`. `arch`: a
    target or a list (default: this GPU's, else sm_90); `jobs`: parallel compiles (default: CPU count).
    Returns one `tlc.precompile_jobs.JobResult` per distinct kernel; a bad call raises TlcError.
    """
    from tlc.precompile_jobs import precompile_calls

    return precompile_calls(calls, arch=arch, jobs=jobs)


__all__ = ["build", "attention", "precompile", "__version__"]
