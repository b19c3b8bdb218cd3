"""Without a GPU, the Python entry points fail with one clear sentence, not a traceback."""
from __future__ import annotations

import pytest
import torch

import tlc
from tlc.diagnostics import TlcError


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_build_without_gpu_says_so() -> None:
    with pytest.raises(TlcError, match="no CUDA GPU"):
        tlc.build("specs/mha_fwd.tl")


def test_attention_rejects_wrong_rank() -> None:
    with pytest.raises(TlcError, match="4-D"):
        tlc.attention(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3))


def test_attention_rejects_float32() -> None:
    t = torch.randn(1, 1, 4, 8)
    with pytest.raises(TlcError, match="bfloat16 or float16"):
        tlc.attention(t, t, t)


def test_attention_takes_sdpas_keyword_names() -> None:
    t = torch.randn(1, 1, 4, 8)
    with pytest.raises(TlcError, match="bfloat16 or float16"):
        tlc.attention(query=t, key=t, value=t, attn_mask=None, dropout_p=0.0, is_causal=True, scale=None,
                      enable_gqa=False)
