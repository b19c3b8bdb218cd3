"""The argument checks the serving calls (tlc.attention.kvcache, tlc.attention.varlen) share: each a one-line
refusal naming the call and the argument (a ValueError while torch.compile traces, sdpa.refusal)."""
from __future__ import annotations

import contextlib
from typing import Iterator

from tlc.attention.sdpa import refusal
from tlc.numbers import a_kind


def check_tensors(call: str, named: tuple[tuple[str, object], ...], rank: int, layout: str) -> None:
    """Each of `named` ((argument, value) pairs) a CUDA tensor of `rank` dimensions (`layout` says which), bf16 or
    fp16 as the first one is, its last dimension contiguous."""
    import torch

    from tlc.attention import sdpa

    names = ", ".join(n for n, _ in named[:-1]) + f" and {named[-1][0]}"
    first = named[0][1]
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise refusal(f"{call}: {name} must be a torch.Tensor, not {a_kind(t)}")
        if t.dim() != rank:
            raise refusal(f"{call}: {name} must be {rank}-D {layout}, got shape {tuple(t.shape)}")
        if not sdpa._on_cuda(t):
            raise refusal(f"{call}: {name} is on {t.device}; move it to a CUDA device")
        if t.dtype not in (torch.bfloat16, torch.float16) or t.dtype != first.dtype:
            raise refusal(f"{call}: {name} is {t.dtype}; {names} are all bf16 or all fp16")
        if t.stride(-1) != 1:
            raise refusal(f"{call}: {name}'s last dimension must be contiguous (stride 1)")


def call_geometry(tensors, scale, *settings) -> tuple | None:
    """An eager serving call's geometry: each tensor's shape, strides, dtype and device, the scale (a float or None),
    the call's other `settings` and TLC_ATTENTION_ARCH; None for a traced call or anything odd (a scale not a float,
    NaN), which then takes the checked path. A call keeps its key only after passing every check, so a key found
    names a geometry checked before."""
    import math
    import os

    from tlc.attention.sdpa import _eager

    if scale is not None and (type(scale) is not float or scale != scale):   # NaN: never found again
        return None
    if not _eager(*tensors):
        return None
    try:
        return (tuple((t.shape, t.stride(), t.dtype, t.device) for t in tensors), scale,
                0 if scale is None else math.copysign(1, scale), *settings, os.environ.get("TLC_ATTENTION_ARCH"))
    except (RuntimeError, OverflowError, ValueError, AttributeError):
        return None


def as_storage(t):
    """Rows of a (rows, heads, d) tensor (packed sequences, a flattened page pool) as the (1, heads, rows, d) storage
    a row map reads: a view."""
    return t.permute(1, 0, 2).unsqueeze(0)


@contextlib.contextmanager
def call_errors(call: str) -> Iterator[None]:
    """Building and launching: a TlcError as one line starting `<call>:` (sdpa.call_error)."""
    from tlc.attention.sdpa import call_error
    from tlc.diagnostics import TlcError

    try:
        yield
    except TlcError as exc:
        raise call_error(call, exc) from exc

