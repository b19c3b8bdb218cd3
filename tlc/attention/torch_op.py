"""`tlc::attention`, the torch.library custom op that `tlc.attention` runs, so torch.compile
(fullgraph too) traces a call as one graph node: the fake implementation gives the output's
shape without a GPU, the real one (tlc.attention.sdpa.run_attention) builds on first use and launches.
Its schema is SDPA's (`aten::scaled_dot_product_attention`, with `scale` and `enable_gqa` positional too).

Importing this module registers the op; `tlc.attention` imports it on its first call.
"""
from __future__ import annotations

from typing import Optional

import torch

from tlc.diagnostics import fail
from tlc.attention.sdpa import check_heads, check_mask_and_dropout, run_attention


@torch.library.custom_op("tlc::attention", mutates_args=())
def attention_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attn_mask: Optional[torch.Tensor] = None, dropout_p: float = 0.0, is_causal: bool = False,
                 scale: Optional[float] = None, enable_gqa: bool = False) -> torch.Tensor:
    """(batch, heads, seq, dim) query, key, value → (batch, query heads, query seq, value's dim), like SDPA.
    It refuses what the kernel would otherwise ignore (`_check_op_call`); every other check is
    `tlc.attention`'s, so call that."""
    _check_op_call(query, key, value, attn_mask, dropout_p, enable_gqa)
    return run_attention(query, key, value, is_causal, scale)


@attention_op.register_fake
def _attention_fake(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                    enable_gqa=False):
    _check_op_call(query, key, value, attn_mask, dropout_p, enable_gqa)   # tracing refuses what running would
    return query.new_empty((query.shape[0], query.shape[1], query.shape[2], value.shape[3]))


def _check_op_call(query, key, value, attn_mask, dropout_p: float, enable_gqa: bool) -> None:
    """A mask, dropout, or query heads that differ from the key heads without `enable_gqa`: the kernel takes
    none of these arguments, so it would run the call without the mask, the dropout or SDPA's refusal."""
    check_mask_and_dropout(attn_mask, dropout_p)
    check_heads(query.shape[1], key.shape[1], value.shape[1], enable_gqa)


def _setup_context(ctx, inputs, output) -> None:
    pass


def register_no_backward(op, message: str) -> None:
    """A forward-only custom op's backward: the refusal `message` (its Python call refuses grad-requiring inputs up
    front; this is for direct calls of the op)."""
    def backward(ctx, grad):
        raise fail(message)
    op.register_autograd(backward, setup_context=_setup_context)


register_no_backward(attention_op, "tlc.attention: no backward kernel yet: use "
                     "torch.nn.functional.scaled_dot_product_attention for training, and torch.no_grad() / "
                     "torch.inference_mode() around tlc.attention")
