"""Packed variable-length prefill against the same tokens as one dense batch, in the same run: 8 sequences summing to
16k tokens (equal lengths, so the dense batch is the same work), H = 16, d = 128, bf16, causal and not.
tlc.flash_attn_varlen_func (specs/varlen_fwd.tl, rows through row maps) against tlc.attention on the dense batch and
SDPA's flash backend on it. TFLOP/s over the visible pairs.

    python bench/bench_varlen.py        # table last, JSON under $OUT
"""
from __future__ import annotations

import datetime
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

B, S, H, D = 8, 2048, 16, 128


def bench_ms(fn) -> float:
    from triton.testing import do_bench
    return do_bench(fn, warmup=25, rep=200, return_mode="median")


def main() -> int:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import tlc
    from tlc.testing_tolerance import check_attention

    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": []}
    q, k, v = (torch.randn(B * S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cu = torch.arange(0, B * S + 1, S, device="cuda", dtype=torch.int32)
    dense = [t.view(B, S, H, D).transpose(1, 2) for t in (q, k, v)]
    ok = True
    for causal in (False, True):
        flops = 4 * B * H * S * S * D / (2 if causal else 1)
        out = tlc.flash_attn_varlen_func(q, k, v, cu, cu, S, S, causal=causal)
        torch.cuda.synchronize()
        rep = check_attention(out.view(B, S, H, D).transpose(1, 2)[:1, :2], *(t[:1, :2] for t in dense), causal=causal)
        ok &= rep.passed
        row = {"causal": causal, "check": str(rep), "passed": rep.passed}
        with torch.no_grad():
            row["varlen"] = flops / bench_ms(lambda: tlc.flash_attn_varlen_func(q, k, v, cu, cu, S, S, causal=causal)) / 1e9
            row["dense"] = flops / bench_ms(lambda: tlc.attention(*dense, is_causal=causal)) / 1e9
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                row["sdpa_fa2"] = flops / bench_ms(lambda: F.scaled_dot_product_attention(*dense, is_causal=causal)) / 1e9
        report["rows"].append(row)
    with open(os.path.join(os.environ.get("OUT") or ".", "bench_varlen.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(f"\n{report['gpu']}, torch {report['torch']}: {B} sequences of {S} packed (varlen) vs one dense batch, "
          f"H {H}, d {D}, bf16, TFLOP/s")
    print(f"{'causal':8s}{'tlc varlen':>12s}{'tlc dense':>12s}{'SDPA FA2':>12s}{'varlen/dense':>14s}  check")
    for r in report["rows"]:
        print(f"{str(r['causal']):8s}{r['varlen']:12.1f}{r['dense']:12.1f}{r['sdpa_fa2']:12.1f}"
              f"{r['varlen'] / r['dense']:14.3f}  {'PASS' if r['passed'] else 'FAIL ' + r['check']}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
