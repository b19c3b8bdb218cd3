"""`tlc.flash_attn_with_kvcache`: attention against a KV cache in FlashAttention's shapes, so a serving loop
switches by changing an import. Every call runs a shipped TL program:

- a contiguous cache (k_cache (batch, cache, kv heads, d)): specs/decode_fwd.tl — split-KV with each sequence's
  length from `cache_seqlens`, the number of splits from `num_splits_heuristic`;
- a paged cache (k_cache (pages, page size, kv heads, d) and `block_table`): specs/paged_decode_fwd.tl — the
  same split-KV program with K and V gathered row by row from their pages through a row map.

One new token per sequence (q of one row) folds the query heads of each KV head into the kernel's rows: q
(batch, 1, heads, d) is viewed as (batch, kv heads, group, d), so one read of K and V serves the group. With
more new tokens each head keeps its rows and `causal` aligns the queries with the end of each sequence's keys
(FlashAttention's bottom-right). The tensors are viewed, never copied. Under torch.compile or another tracer the
call is one node, the custom op `tlc::flash_attn_with_kvcache` (tlc/attention/serving_ops.py).
"""
from __future__ import annotations

import math

from tlc.attention.kernels import spec_kernel
from tlc.attention.sdpa import refusal
from tlc.attention.serving_args import as_storage, call_errors, call_geometry, check_tensors
from tlc.numbers import a_kind
from tlc.recent import Recent

_CALLS = Recent(64)   # an eager call's geometry → (its lengths if an int gave them, scale, program): checked once
SPLITS = (1, 2, 4, 8, 16, 32, 64)   # the Splits the decode programs are built with (each a kernel)


def num_splits_heuristic(blocks: int, sms: int, key_tiles: int, max_splits: int = SPLITS[-1]) -> int:
    """Splits of each (query tile, head, sequence) program over its key tiles, FlashAttention's rule (`sms`: the
    CTAs the GPU holds at once, as FlashAttention passes twice the SM count): none when the blocks already fill
    80 % of them; else, of the powers of two up to `max_splits` and the key
    tiles, the fewest whose last wave is at least 85 % as full as the fullest choice's."""
    if blocks >= 0.8 * sms or key_tiles <= 1:
        return 1
    options = [s for s in SPLITS if s <= min(max_splits, key_tiles)]

    def fill(s: int) -> float:
        waves = blocks * s / sms
        return waves / math.ceil(waves)
    best = max(fill(s) for s in options)
    return next(s for s in options if fill(s) >= 0.85 * best)


def flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=None, block_table=None, softmax_scale=None,
                            causal: bool = False, *, num_splits: int = 0):
    """Attention of q (batch, new tokens, heads, d) against each sequence's cached keys and values, FlashAttention's
    layouts: k_cache/v_cache (batch, cache, kv heads, d), or (pages, page size, kv heads, d) with block_table
    (batch, pages per sequence) int32; cache_seqlens: an int or an int32 (batch,) tensor (None: the whole cache);
    a length past the cache reads the cache's rows only. Returns (batch, new tokens, heads, d). `num_splits`:
    0 picks by num_splits_heuristic, else one of SPLITS."""
    import torch

    from tlc.attention.sdpa import _eager

    key = _call_key(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, causal, num_splits)
    kept = None if key is None else _CALLS.get(key)
    if kept is not None:   # this geometry passed every check before: its lengths (an int's), scale and program
        lengths, scale, kernel, steps = kept
        tensors, out, placed, inputs = _bind(q, k_cache, v_cache, cache_seqlens if lengths is None else lengths,
                                             block_table, scale)
        with call_errors("flash_attn_with_kvcache"):
            if steps is not None:   # and the program's launch steps for it: no key of the program's own
                kernel.run_steps(steps, tensors, placed, **inputs)
                return out
            kernel(*tensors, out=placed, **inputs)
            steps_for = getattr(kernel, "steps_for", None)   # a program of several kernels keeps its steps
            steps = None if steps_for is None else steps_for(tensors, placed, **inputs)
        if steps is not None:
            _CALLS.keep(key, (lengths, scale, kernel, steps))
        return out
    _check(q, k_cache, v_cache, block_table, causal, num_splits)
    paged = block_table is not None
    capacity = block_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]
    lengths = _lengths(cache_seqlens, q.shape[0], capacity, q.device)
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(q.shape[3])
    if _eager(q, k_cache, v_cache, lengths, *([block_table] if paged else [])):
        out, kernel = _run(q, k_cache, v_cache, lengths, block_table, scale, causal, num_splits)
        given = isinstance(cache_seqlens, torch.Tensor)
        # kept for the next call of this geometry if every tensor is read as given (a lengths tensor not copied
        # contiguous) and, for an int's lengths tensor, no CUDA graph's pool holds it (captured)
        if key is not None and (lengths is cache_seqlens if given else not torch.cuda.is_current_stream_capturing()):
            _CALLS.keep(key, (None if given else lengths, scale, kernel, None))
        return out
    from tlc.attention.serving_ops import kvcache_op   # traced (torch.compile, make_fx): one graph node

    return kvcache_op(q, k_cache, v_cache, lengths, block_table, scale, causal, num_splits)


def run_with_kvcache(q, k_cache, v_cache, lengths, block_table, scale: float, causal: bool, num_splits: int):
    """The checked call (`lengths` an int32 (batch,) tensor, `scale` a float): builds on first use and launches."""
    return _run(q, k_cache, v_cache, lengths, block_table, scale, causal, num_splits)[0]


def _run(q, k_cache, v_cache, lengths, block_table, scale: float, causal: bool, num_splits: int):
    """`run_with_kvcache`'s output and the program it ran."""
    import torch

    B, sq, H, d = q.shape
    paged = block_table is not None
    capacity = block_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]
    dtype = "bf16" if q.dtype == torch.bfloat16 else "fp16"
    spec, defines = kernel_plan(B, sq, H, k_cache.shape[2], d, capacity, dtype, causal,
                                k_cache.shape[1] if paged else 0, num_splits, _sm_count(q.device))
    with call_errors("flash_attn_with_kvcache"):
        kernel = spec_kernel(spec, defines, q.device)
        return _launch(kernel, q, k_cache, v_cache, lengths, block_table, scale), kernel


def _launch(kernel, q, k_cache, v_cache, lengths, block_table, scale: float):
    """The program on the call's tensors, viewed as it reads them; the output in FlashAttention's layout."""
    tensors, out, placed, inputs = _bind(q, k_cache, v_cache, lengths, block_table, scale)
    kernel(*tensors, out=placed, **inputs)
    return out


def _bind(q, k_cache, v_cache, lengths, block_table, scale: float):
    """The program's tensors (views), the output in FlashAttention's layout and the view the program stores it
    through, and the Inputs: the program reads (O, LSE); the log-sum-exp is not returned (FlashAttention's default)."""
    import torch

    B, sq, H, d = q.shape
    kvh = k_cache.shape[2]
    fold = sq == 1   # one new token: the group's heads are the rows (causal changes nothing for it)
    qk = q.view(B, kvh, H // kvh, d) if fold and q.is_contiguous() else (
        q.contiguous().view(B, kvh, H // kvh, d) if fold else q.transpose(1, 2))
    out = torch.empty(B, sq, H, d, device=q.device, dtype=q.dtype)
    placed = out.view(B, kvh, H // kvh, d) if fold else out.transpose(1, 2)
    if block_table is not None:
        return (qk, _pool(k_cache), _pool(v_cache)), out, placed, dict(
            scale=scale, seqlen_k=block_table.shape[1] * k_cache.shape[1], kv_lengths=lengths, block_table=block_table)
    return (qk, k_cache.transpose(1, 2), v_cache.transpose(1, 2)), out, placed, dict(scale=scale, kv_lengths=lengths)


def _call_key(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, causal, num_splits) -> tuple | None:
    """The call's geometry (serving_args.call_geometry) with an int length's value, which with it settles every check
    `_check` and `_lengths` make; None for anything odd."""
    if type(causal) is not bool or type(num_splits) is not int:
        return None
    given = cache_seqlens if type(cache_seqlens) is not int and cache_seqlens is not None else None
    tensors = (q, k_cache, v_cache) + (() if block_table is None else (block_table,)) + (() if given is None else (given,))
    return call_geometry(tensors, softmax_scale, block_table is None, "tensor" if given is not None else cache_seqlens,
                         causal, num_splits)


def kernel_plan(batch: int, new_tokens: int, heads: int, kv_heads: int, d: int, capacity: int, dtype: str,
                causal: bool, page: int = 0, num_splits: int = 0, sms: int = 132) -> tuple[str, dict]:
    """(spec, -D bindings) of the program a call runs: `page` 0 a contiguous cache of `capacity` rows, else pages
    of that many rows; one new token folds the group's heads into the rows (then causal is moot); `sms`: the
    GPU's multiprocessors, which the split heuristic fills."""
    fold = new_tokens == 1
    # 64-key tiles: two partial-kernel CTAs per SM at d = 128 (80 KB of shared memory each), whose loads in flight
    # together beat one CTA's 128-key tiles (bench/decode_sweep.py, H200); the combine on 16-row blocks (CM)
    tiles = {"HeadDim": d, "BM": 64, "BN": 64, "CM": 16, "dtype": dtype, "Causal": bool(causal and not fold)}
    rows, programs = (heads // kv_heads, kv_heads) if fold else (new_tokens, heads)
    splits = num_splits or num_splits_heuristic(-(-rows // tiles["BM"]) * programs * batch,
                                                sms * resident_ctas(d, tiles["BM"], tiles["BN"]),
                                                -(-capacity // tiles["BN"]))
    if page:
        return "paged_decode_fwd", dict(tiles, Splits=splits, PageSize=page)
    return "decode_fwd", dict(tiles, Splits=splits)


def resident_ctas(d: int, bm: int, bn: int, smem: int = 227 * 1024) -> int:
    """Partial-kernel CTAs one SM holds by shared memory: a Q tile and two stages of K and V tiles of bf16/fp16."""
    return max(1, smem // ((bm + 4 * bn) * d * 2))


def _sm_count(device) -> int:
    import torch
    return torch.cuda.get_device_properties(device).multi_processor_count


def _pool(cache):
    """(pages, page size, kv heads, d) as the (1, kv heads, pages · page size, d) pool the row map reads: a view."""
    pages, page, kvh, d = cache.shape
    return as_storage(cache.view(pages * page, kvh, d))


def _lengths(cache_seqlens, batch: int, capacity: int, device):
    import torch

    if cache_seqlens is None:
        return torch.full((batch,), capacity, dtype=torch.int32, device=device)
    if isinstance(cache_seqlens, bool) or not isinstance(cache_seqlens, (int, torch.Tensor)):
        raise refusal(f"flash_attn_with_kvcache: cache_seqlens must be an int or an int32 tensor of (batch,), not "
                      f"{a_kind(cache_seqlens)}")
    if isinstance(cache_seqlens, int):
        if not 0 <= cache_seqlens <= capacity:
            raise refusal(f"flash_attn_with_kvcache: cache_seqlens = {cache_seqlens} is outside the cache's 0 … {capacity} "
                          "rows")
        return torch.full((batch,), cache_seqlens, dtype=torch.int32, device=device)
    t = cache_seqlens
    if t.dtype != torch.int32 or tuple(t.shape) != (batch,) or t.device != device:
        raise refusal(f"flash_attn_with_kvcache: cache_seqlens must be an int32 tensor of ({batch},) on {device}, got "
                      f"{t.dtype} {tuple(t.shape)} on {t.device}")
    return t.contiguous()


def _check(q, k_cache, v_cache, block_table, causal, num_splits) -> None:
    import torch

    if v_cache is None:
        raise refusal("flash_attn_with_kvcache: v_cache=None (MLA's latent cache read for K and V) is not supported "
                      "yet; pass v_cache")
    check_tensors("flash_attn_with_kvcache", (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)), 4,
                  "(batch, rows, heads, d)")
    B, _, H, d = q.shape
    if k_cache.shape != v_cache.shape:
        raise refusal(f"flash_attn_with_kvcache: k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} differ "
                      "(a head_dim_v other than d is not supported yet)")
    kvh = k_cache.shape[2]
    if k_cache.shape[3] != d:
        raise refusal(f"flash_attn_with_kvcache: q's head dim {d} and k_cache's {k_cache.shape[3]} differ")
    if d % 8 or d > 256:
        raise refusal(f"flash_attn_with_kvcache: head dim {d} is not supported (a multiple of 8, at most 256)")
    if kvh == 0 or H % kvh:
        raise refusal(f"flash_attn_with_kvcache: q's {H} heads are not a multiple of the cache's {kvh} KV heads")
    if not isinstance(causal, bool):
        raise refusal(f"flash_attn_with_kvcache: causal must be True or False, not {a_kind(causal)}")
    if not isinstance(num_splits, int) or isinstance(num_splits, bool) or (num_splits and num_splits not in SPLITS):
        raise refusal(f"flash_attn_with_kvcache: num_splits must be 0 (the heuristic) or one of {SPLITS}, not "
                      f"{num_splits!r}")
    if block_table is None:
        if k_cache.shape[0] != B:
            raise refusal(f"flash_attn_with_kvcache: k_cache holds {k_cache.shape[0]} sequences, q {B} (without "
                          "block_table the cache is (batch, cache, kv heads, d))")
        return
    if not isinstance(block_table, torch.Tensor) or block_table.dtype != torch.int32 or block_table.dim() != 2 \
            or block_table.shape[0] != B or block_table.device != q.device:
        raise refusal(f"flash_attn_with_kvcache: block_table must be an int32 tensor of (batch = {B}, pages per "
                      f"sequence) on {q.device}, got {_describe(block_table)}")
    page = k_cache.shape[1]
    if page % 16 or not 16 <= page <= 256:
        raise refusal(f"flash_attn_with_kvcache: page size {page} is not supported (16 to 256, a multiple of 16)")
    if not k_cache.is_contiguous() or not v_cache.is_contiguous():
        raise refusal("flash_attn_with_kvcache: a paged k_cache/v_cache must be contiguous (pages, page size, kv heads, d)")


def _describe(t) -> str:
    import torch
    if not isinstance(t, torch.Tensor):
        return a_kind(t)
    return f"{t.dtype} {tuple(t.shape)} on {t.device}"
