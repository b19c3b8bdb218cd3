"""Run a few odd-size launches (for compute-sanitizer memcheck / racecheck)."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from tlc.backend_cute.attention import attention_kernel  # noqa: E402
from tlc.kir.flash_fwd import FlashFwdConfig, default_tiles  # noqa: E402

T128, T64 = default_tiles(128, 128), default_tiles(64, 64)
from tlc.testing_tolerance import check_attention  # noqa: E402

CASES = [(FlashFwdConfig(d_qk=128, d_v=128, causal=True, alignment="bottom_right", **T128), 1, 2, 1, 77, 333),
         (FlashFwdConfig(d_qk=64, d_v=64, **T64), 1, 2, 2, 1000, 17),
         (FlashFwdConfig(d_qk=128, d_v=128, causal=True, lse=True, **T128), 1, 2, 1, 200, 130),
         (FlashFwdConfig(d_qk=128, d_v=128, stages=1), 1, 2, 1, 333, 77)]
for cfg, B, Hq, Hkv, Sq, Sk in CASES:
    kern = attention_kernel(cfg, "sm_90")
    q = torch.randn(B, Hq, Sq, cfg.d_qk, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, Sk, cfg.d_qk, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, Hkv, Sk, cfg.d_v, device="cuda", dtype=torch.bfloat16)
    o = kern(q, k, v, return_lse=cfg.lse)
    o = o[0] if cfg.lse else o
    torch.cuda.synchronize()
    print(cfg.key(), Sq, Sk, check_attention(o, q, k, v, causal=cfg.causal, alignment=cfg.alignment))
