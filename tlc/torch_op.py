"""`tlc::attention`, the torch.library custom op that `tlc.attention` runs, so torch.compile
(fullgraph too) traces a call as one graph node: the fake implementation gives the output's
shape without a GPU, the real one (tlc.runtime.run_attention) builds on first use and launches.

Importing this module registers the op; `tlc.attention` imports it on its first call.
"""
from __future__ import annotations

from typing import Optional

import torch

from tlc.diagnostics import fail
from tlc.runtime import run_attention


@torch.library.custom_op("tlc::attention", mutates_args=())
def attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                 scale: Optional[float]) -> torch.Tensor:
    """(batch, heads, seq, dim) q, k, v → (batch, q heads, q seq, v's dim), like SDPA; no checks of its
    own beyond the kernel's: call `tlc.attention`, which checks the call first."""
    return run_attention(q, k, v, is_causal, scale)


@attention_op.register_fake
def _attention_fake(q, k, v, is_causal, scale):
    return q.new_empty((q.shape[0], q.shape[1], q.shape[2], v.shape[3]))


def _setup_context(ctx, inputs, output) -> None:
    pass


def _no_backward(ctx, grad):
    # tlc.attention refuses grad-requiring inputs up front; this is for direct calls of the op.
    raise fail("tlc.attention: no backward kernel yet: use torch.nn.functional.scaled_dot_product_attention "
               "for training, and torch.no_grad() / torch.inference_mode() around tlc.attention")


attention_op.register_autograd(_no_backward, setup_context=_setup_context)
