"""`tlc.attention`'s call in `torch.nn.functional.scaled_dot_product_attention`'s terms: the checks that
refuse what tlc cannot run (no `attn_mask`, no dropout, head dims, devices, grad), the `tlc::attention` op's
implementation (tlc.attention.torch_op), and the layouts the kernel reads. An eager call whose geometry
(shapes, strides, dtypes, devices, causality, scale) ran before skips the checks it passed then and launches
the plan it left (`_CALLS`); the kernel itself comes from tlc.attention.kernels.
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
from typing import Iterator

from tlc.attention.kernels import attention_kernel
from tlc.diagnostics import Note, TlcError, fail
from tlc.numbers import a_kind, shown
from tlc.recent import Recent

_CALLS = Recent(256)   # an eager tlc.attention call's geometry → (kernel, launch plan): its checks passed once
_FLOAT_MAX = sys.float_info.max
HEAD_DIMS = range(8, 257, 8)  # FlashAttention's rule; widths that are not multiples of 32 are padded in the kernel
MIXED_HEAD_DIMS = {(192, 128): "MLA prefill"}  # (q/k, v) head dims that may differ: the shapes tested on a GPU
_NO_GRAD_FIX = ("tlc has no backward kernel yet: for inference wrap the call in `with torch.no_grad():` or "
                "`with torch.inference_mode():`; for training use torch.nn.functional.scaled_dot_product_attention")


def attention(query, key, value, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
              scale: float | None = None, enable_gqa: bool = False):
    """`scaled_dot_product_attention`'s forward, its parameters in its order, for (batch, heads, seq, dim)
    bf16/fp16 CUDA tensors. `attn_mask` must be None and `dropout_p` 0 (`check_mask_and_dropout`)."""
    # The defaults (no mask, dropout_p 0.0) take three comparisons; anything else is checked in full before the
    # call plans are asked, so a plan (whose key holds neither) never serves a call with a mask or dropout.
    if attn_mask is not None or type(dropout_p) is not float or dropout_p != 0.0:
        check_mask_and_dropout(attn_mask, dropout_p)
    q, k, v = query, key, value
    plan_key = _call_key(q, k, v, is_causal, scale, enable_gqa)
    planned = None if plan_key is None else _CALLS.recent(plan_key)
    if planned is not None:   # this geometry passed the checks before: launch its plan
        kernel, plan = planned
        try:
            return kernel.run_plan(plan, (q, k, v))
        except TlcError as exc:
            raise _attention_error(exc) from exc
    check_attention(q, k, v, scale, enable_gqa)

    scale = None if scale is None else float(scale)
    if _eager(q, k, v):
        # Eager: the op's implementation directly; torch.library's dispatch costs ~40 us a call (H200,
        # bench/launch_overhead.py), as much as a short sequence's kernel.
        out, kernel = _run_attention(q, k, v, bool(is_causal), scale)
        if plan_key is not None and kernel is not None and all(_in_place(t) for t in (q, k, v)):
            plan = kernel.plan_of((q, k, v), {"scale": scale})   # what the kernel just planned for q, k, v
            if plan is not None:
                _CALLS.keep(plan_key, (kernel, plan))
        return out
    from tlc.attention.torch_op import attention_op

    return attention_op(q, k, v, None, 0.0, bool(is_causal), scale, bool(enable_gqa))


def check_mask_and_dropout(attn_mask, dropout_p) -> None:
    """Refuse an `attn_mask` (tlc runs no mask but causal yet), dropout (tlc is forward inference only) and a
    `dropout_p` SDPA refuses too (not a probability), each in one line naming the argument and what to pass.
    A bool `attn_mask` is almost always a causal flag passed in SDPA's 4th place, so its refusal names is_causal."""
    if isinstance(attn_mask, bool):
        raise refuse(f"attn_mask is {attn_mask}, a bool: the 4th argument is attn_mask, as in "
                      f"scaled_dot_product_attention; pass is_causal={attn_mask} by name")
    if attn_mask is not None:
        raise refuse("attn_mask is not supported yet (no boolean or additive masks): for a causal mask pass "
                      "is_causal=True instead of a mask; for any other mask use "
                      "torch.nn.functional.scaled_dot_product_attention")
    if not _number(dropout_p):
        raise refuse(f"dropout_p must be a number from 0 to 1 (0.0: no dropout), not {a_kind(dropout_p)}")
    if not 0 <= dropout_p <= 1:   # NaN too
        raise refuse(f"dropout_p must be from 0 to 1, got {shown(str(dropout_p))}")
    if dropout_p != 0:
        raise refuse(f"dropout_p is {shown(str(dropout_p))}, but tlc has no dropout (forward inference only): "
                      "pass dropout_p=0.0 (e.g. dropout_p=p if self.training else 0.0); for training use "
                      "torch.nn.functional.scaled_dot_product_attention")


def _call_key(q, k, v, is_causal, scale, enable_gqa) -> tuple | None:
    """An eager call's geometry, which settles every check `check_attention`, `kernel_layout` and the kernel's
    launch plan make but these per-call ones: plain CUDA tensors (no neg-bit views), no tracing, no grad, no
    forward-mode AD level, 16-byte aligned data pointers, a scale that is a number (not NaN). None when a
    per-call check fails or the call is odd in any way: the checked path then refuses, copies or traces it.
    The key holds no mask or dropout: `attention` refuses those before it asks for the key."""
    import torch
    from torch.autograd import forward_ad

    if not _eager(q, k, v) or forward_ad._current_level >= 0:
        return None
    if scale is not None and not _number(scale):
        return None
    try:
        if not (_on_cuda(q) and _on_cuda(k) and _on_cuda(v)) or q.is_neg() or k.is_neg() or v.is_neg():
            return None
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
            return None
        if q.data_ptr() % 16 or k.data_ptr() % 16 or v.data_ptr() % 16:
            return None
        scale = None if scale is None else float(scale)
        if scale is not None and scale != scale:   # NaN: never equal to itself, so never found again
            return None
        return (q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device, v.shape, v.stride(),
                v.dtype, v.device, bool(is_causal), bool(enable_gqa), scale,
                0 if scale is None else math.copysign(1, scale),   # -0.0 apart from 0.0
                os.environ.get("TLC_ATTENTION_ARCH"))
    except (RuntimeError, OverflowError, ValueError):   # no storage (sparse, vmap), a scale past float's range
        return None


def _eager(*tensors) -> bool:
    """Plain tensors, no torch.compile and no tracing mode (make_fx, fake tensors): nothing records the op."""
    import torch
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    return (not torch.compiler.is_compiling() and _get_current_dispatch_mode() is None
            and all(type(t) is torch.Tensor for t in tensors))


def check_attention(q, k, v, scale, enable_gqa: bool) -> None:
    """Refuse, in the caller's terms, any call tlc cannot run, before anything is built: the cheap
    checks first, the device last (so shapes are checked on any tensors, and torch.compile traces it)."""
    import torch

    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise refuse(f"{name} must be a 4-D (batch, heads, seq, dim) tensor")
    if torch.is_grad_enabled():
        for name, t in (("q", q), ("k", k), ("v", v)):
            if t.requires_grad:
                raise refuse(f"{name} requires grad, but {_NO_GRAD_FIX}")
    if q.dtype not in (torch.bfloat16, torch.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise refuse(f"q, k and v must have one dtype, bfloat16 or float16 (got q {q.dtype}, k {k.dtype}, "
                      f"v {v.dtype})")
    if not q.shape[0] == k.shape[0] == v.shape[0]:
        raise refuse(f"batch sizes differ: q {q.shape[0]}, k {k.shape[0]}, v {v.shape[0]}")
    check_heads(q.shape[1], k.shape[1], v.shape[1], enable_gqa)
    if k.shape[2] != v.shape[2]:
        raise refuse(f"k has {k.shape[2]} keys but v has {v.shape[2]} values: their sequence lengths must agree")
    if k.shape[3] != q.shape[3]:
        raise refuse(f"k's head dim {k.shape[3]} must equal q's {q.shape[3]}")
    problem = head_dim_problem(q.shape[3], v.shape[3])
    if problem:
        raise refuse(problem)
    if scale is not None and not _number(scale):
        raise refuse(f"scale must be a number or None, got {type(scale).__name__}")
    if isinstance(scale, int) and abs(scale) > _FLOAT_MAX:
        raise refuse(f"scale is past a float's range (an int of {scale.bit_length()} bits); pass a float")
    from torch.autograd import forward_ad
    if forward_ad._current_level >= 0:   # inside fwAD.dual_level(): a dual tensor's tangent would be dropped
        for name, t in (("q", q), ("k", k), ("v", v)):
            if forward_ad.unpack_dual(t).tangent is not None:
                raise refuse(f"{name} carries a forward-mode AD tangent, which tlc cannot carry through: pass "
                              f"its primal (torch.autograd.forward_ad.unpack_dual({name}).primal) or use "
                              "torch.nn.functional.scaled_dot_product_attention")
    devices = (q.device, k.device, v.device)
    if not all(_on_cuda(t) for t in (q, k, v)):
        raise refuse(f"q, k and v must be CUDA tensors (got {', '.join(str(d) for d in devices)}); "
                      "move them with .cuda()")
    if len(set(devices)) > 1:
        raise refuse(f"q, k and v are on different devices: {', '.join(str(d) for d in devices)}")


def _on_cuda(t) -> bool:
    return t.is_cuda


def _number(scale) -> bool:
    """A scale SDPA takes: an int or float (numpy's float64 is one), not a bool."""
    return isinstance(scale, (int, float)) and not isinstance(scale, bool)


def check_heads(hq: int, hk: int, hv: int, enable_gqa: bool) -> None:
    if hk != hv:
        raise refuse(f"k has {hk} heads but v has {hv}: they must agree")
    if hk == 0 and hq:
        raise refuse(f"k and v have 0 heads; {hq} query heads need at least one KV head")
    if hq != hk and not enable_gqa:
        raise refuse(f"{hq} query heads but {hk} KV heads; pass enable_gqa=True for GQA/MQA")
    if hk and hq % hk:
        raise refuse(f"{hq} query heads are not a multiple of {hk} KV heads (GQA/MQA needs a whole group per KV head)")


def head_dim_problem(d_qk: int, d_v: int) -> str | None:
    """Why tlc.attention cannot run these head dims (None when it can): the one place to widen them."""
    # Comparisons, not `in`: under torch.compile(dynamic=True) the head dims are symbolic ints, which compare
    # (dynamo guards on the answer) but cannot be looked up in a range or a dict.
    for d in (d_qk, d_v):
        if not (HEAD_DIMS.start <= d < HEAD_DIMS.stop and d % HEAD_DIMS.step == 0):
            return (f"head dim {d} is not supported; supported: multiples of {HEAD_DIMS.step} "
                    f"from {HEAD_DIMS.start} to {HEAD_DIMS.stop - 1}")
    if d_qk != d_v and not any(d_qk == a and d_v == b for a, b in MIXED_HEAD_DIMS):
        pairs = ", ".join(f"q/k {a} with v's {b} ({what})" for (a, b), what in MIXED_HEAD_DIMS.items())
        return f"v's head dim {d_v} differs from q's {d_qk}; differing head dims are supported only for {pairs}"
    return None


def refuse(message: str) -> Exception:
    """`tlc.attention: <message>` as the exception to raise (`refusal`)."""
    return refusal(f"tlc.attention: {message}")


def refusal(message: str) -> Exception:
    """A call's refusal as the exception to raise: a TlcError, or a ValueError while torch.compile traces."""
    import torch

    if torch.compiler.is_compiling():
        # Dynamo cannot trace building a TlcError: a ValueError carries the same words into its report
        # under fullgraph=True; otherwise it falls back to eager here, and eager raises the TlcError.
        return ValueError(message)
    return fail(message)


def run_attention(q, k, v, is_causal: bool, scale: float | None):
    """The `tlc::attention` op's implementation: degenerate shapes as SDPA answers them, else the kernel."""
    return _run_attention(q, k, v, is_causal, scale)[0]


def _run_attention(q, k, v, is_causal: bool, scale: float | None):
    """`run_attention`'s output and the kernel that computed it (None for a degenerate shape)."""
    shape = (q.shape[0], q.shape[1], q.shape[2], v.shape[3])
    if q.numel() == 0:
        return q.new_empty(shape), None
    if k.shape[2] == 0:
        return q.new_zeros(shape), None  # SDPA's answer when there is nothing to attend to
    with _as_attention_error():
        kernel = attention_kernel(q, v.shape[3], bool(is_causal), k.shape[2])
        return kernel(*(kernel_layout(t) for t in (q, k, v)), scale=scale), kernel


def kernel_layout(t):
    """`t` if the kernel reads it in place, else a contiguous copy: SDPA takes any strides, and so does
    tlc.attention."""
    if t.is_neg():   # a lazily negated view (torch._neg_view): the kernel reads memory, so negate it for real
        t = t.resolve_neg()
    if _in_place(t):
        return t
    import torch

    return t.clone(memory_format=torch.contiguous_format)


def _in_place(t) -> bool:
    """Whether the kernel reads `t` as it is: unit last stride, 16-byte aligned rows and base (cp.async, TMA)."""
    ok = not t.is_neg() and (t.stride(-1) == 1 or t.shape[-1] == 1)
    ok = ok and t.data_ptr() % 16 == 0
    return ok and all((t.stride(d) * t.element_size()) % 16 == 0 or t.shape[d] == 1 for d in range(3))


@contextlib.contextmanager
def _as_attention_error() -> Iterator[None]:
    try:
        yield
    except TlcError as exc:
        raise _attention_error(exc) from exc


def _attention_error(exc: TlcError) -> TlcError:
    return call_error("tlc.attention", exc)


def call_error(call: str, exc: TlcError) -> TlcError:
    """Errors past a call's checks (building, launching) still start with `<call>:` and name no shipped spec's
    line: the first message leads, the others and their notes follow as notes."""
    lines = [m for d in exc.diagnostics for m in (d.message, *(n.message for n in d.notes))]
    first = lines[0].removeprefix(f"{call}: ")
    return fail(f"{call}: {first}", None, *(Note(m) for m in lines[1:]))
