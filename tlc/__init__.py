"""tlc: a compiler from LLM-TL to CUTLASS CuTe kernels.

`tlc.build(path_or_text, arch=…, defines=…)` returns a kernel callable on torch tensors;
`tlc.attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
enable_gqa=False)` is torch's scaled_dot_product_attention, its parameters in its order, for inference
(no backward kernel, no dropout, no mask but causal yet) and runs as the custom op
`torch.ops.tlc.attention`, so torch.compile traces it. Both import torch and the GPU machinery
only when called. `tlc.precompile(calls)` fills the kernel cache for a model's attention calls ahead
of time, compiling the missing kernels in parallel processes.
"""
from __future__ import annotations

__version__ = "0.1.0"

# The attention runtime is the package tlc.attention; importing it here, before `def attention` below binds
# the name to the function, keeps `tlc.attention` the function: a package's first import binds its name in
# the parent, later imports of its modules do not. The package itself imports nothing.
from tlc import attention as _attention_runtime  # noqa: E402,F401  # isort: skip


def build(path_or_text, *, arch=None, defines=None, lse=False):
    """The kernel of a TL program, callable on torch tensors. `path_or_text`: a `pathlib.Path`, a str that
    names an existing file (any extension), or TL text (a str with a newline or starting with a statement
    word such as `Param`; any other str is a file that does not exist: an error). Details: tlc.runtime.build."""
    from tlc.runtime import build as _build

    return _build(path_or_text, arch=arch, defines=defines, lse=lse)


def attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """`torch.nn.functional.scaled_dot_product_attention`'s forward for bf16/fp16 CUDA tensors, with its
    parameters, in its order, with its defaults, so a positional SDPA call means the same here.

    `attn_mask` must be None: a mask is refused (pass `is_causal=True` for a causal one; other masks are not
    supported yet). `dropout_p` must be 0 (a number; dropout is refused, as are values SDPA refuses).
    `is_causal` and `enable_gqa` are bools (as SDPA's), `scale` a number or None. A bad argument is a one-line
    TlcError naming it (tlc.attention.sdpa.check_mask_and_dropout, tlc.attention.sdpa.check_attention)."""
    from tlc.attention.sdpa import attention as _attention
    from tlc.attention.sdpa import refuse
    from tlc.numbers import a_kind

    for name, flag in (("is_causal", is_causal), ("enable_gqa", enable_gqa)):
        if not _is_bool(flag):
            raise refuse(f"{name} must be True or False, not {a_kind(flag)}")
    return _attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def _is_bool(value) -> bool:
    """A Python bool or numpy's bool scalar (what a comparison of numpy values gives)."""
    kind = type(value)
    return isinstance(value, bool) or (kind.__module__ == "numpy" and kind.__name__ == "bool_")


def precompile(calls, *, arch=None, jobs=0):
    """Compile, in parallel, every kernel `tlc.attention` would build for `calls` and is not cached yet.

    `calls`: dicts with the keys of a `tlc precompile --shapes` line (`d` required; `dv`, `dtype`
    bf16/fp16, `causal`, and the checked but kernel-neutral `b`, `hq`, `hkv`, `sq`, `sk`), e.g.
    `[{"b": 4, "hq": 32, "hkv": 8, "sq": 4096, "sk": 4096, "d": 128, "causal": True}]`. `arch`: a
    target or a list (default: this GPU's, else sm_90); `jobs`: parallel compiles (0, the default: CPU count).
    Returns one `tlc.attention.precompile.JobResult` per distinct kernel; a bad call or argument raises a
    one-line TlcError naming it.
    """
    from tlc.attention.precompile import precompile_calls

    return precompile_calls(calls, arch=arch, jobs=jobs)


def flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=None, block_table=None, softmax_scale=None,
                            causal=False, *, num_splits=0):
    """FlashAttention's `flash_attn_with_kvcache` (without appending to the cache): q (batch, new tokens, heads, d)
    against k_cache/v_cache (batch, cache, kv heads, d) — or (pages, page size, kv heads, d) with an int32
    `block_table` (batch, pages per sequence) — each sequence to its `cache_seqlens` (int or int32 (batch,)
    tensor); `causal` aligns the new tokens with the end of each sequence. Returns (batch, new tokens, heads, d).
    Runs specs/decode_fwd.tl or specs/paged_decode_fwd.tl, split-KV (tlc/attention/kvcache.py)."""
    from tlc.attention.kvcache import flash_attn_with_kvcache as _with_kvcache

    return _with_kvcache(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, causal,
                         num_splits=num_splits)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=None,
                           causal=False):
    """FlashAttention's `flash_attn_varlen_func`: packed sequences, q (total queries, heads, d), k and v (total keys,
    kv heads, d), sequence b at rows cu_seqlens[b] … cu_seqlens[b + 1] − 1 (int32 (batch + 1,) tensors); `causal`
    aligns each sequence's queries with the end of its keys. Returns (total queries, heads, d). Runs
    specs/varlen_fwd.tl (tlc/attention/varlen.py)."""
    from tlc.attention.varlen import flash_attn_varlen_func as _varlen

    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal)


__all__ = ["build", "attention", "flash_attn_with_kvcache", "flash_attn_varlen_func", "precompile", "__version__"]
