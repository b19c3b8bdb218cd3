"""Host time per call of the serving calls on a decode step too small to keep the GPU busy (B 1, 8/2 heads, a
256-row cache, d 128): what `tlc.flash_attn_with_kvcache` (contiguous and paged), the program it runs called
directly, and `tlc.flash_attn_varlen_func` cost the CPU per call, beside SDPA's in the same run, then the hottest
Python frames (cProfile) of the contiguous call.

    python3 bench/serving_overhead.py [--calls 300]    # table last; $OUT/serving_overhead.json

host: the calls alone (µs per call, the median of 5 blocks); wall: with the GPU drained after each block.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import median_block_host_wall_us, require_cuda  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=300)
    calls = ap.parse_args().calls
    require_cuda("serving_overhead.py")
    import torch
    import torch.nn.functional as F

    import tlc
    from tlc.attention.kernels import spec_kernel
    from tlc.attention.kvcache import kernel_plan

    torch.manual_seed(0)
    make = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    q, k, v = make(1, 1, 8, 128), make(1, 256, 2, 128), make(1, 256, 2, 128)
    lengths = torch.tensor([200], dtype=torch.int32, device="cuda")
    pages_k, pages_v = k.view(16, 16, 2, 128).clone(), v.view(16, 16, 2, 128).clone()
    table = torch.arange(16, dtype=torch.int32, device="cuda").view(1, 16)
    spec, defines = kernel_plan(1, 1, 8, 2, 128, 256, "bf16", False, sms=torch.cuda.get_device_properties(0)
                                .multi_processor_count)
    program = spec_kernel(spec, defines, q.device)
    qk, out = q.view(1, 2, 4, 128), torch.empty(1, 2, 4, 128, device="cuda", dtype=torch.bfloat16)
    kt, vt = k.transpose(1, 2), v.transpose(1, 2)
    cu = torch.tensor([0, 200], dtype=torch.int32, device="cuda")
    qv, kv_, vv = make(200, 8, 128), make(200, 2, 128), make(200, 2, 128)
    qs, ks, vs = q.transpose(1, 2), k[:, :200].transpose(1, 2), v[:, :200].transpose(1, 2)
    rows = {
        "flash_attn_with_kvcache": lambda: tlc.flash_attn_with_kvcache(q, k, v, cache_seqlens=lengths),
        "  paged (16-row pages)": lambda: tlc.flash_attn_with_kvcache(q, pages_k, pages_v, cache_seqlens=lengths,
                                                                      block_table=table),
        "  its program, direct": lambda: program(qk, kt, vt, out=out, scale=0.088, kv_lengths=lengths),
        "flash_attn_varlen_func": lambda: tlc.flash_attn_varlen_func(qv, kv_, vv, cu, cu, 200, 200),
        "SDPA (default backend)": lambda: F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True),
    }
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": {}}
    with torch.inference_mode():
        for label, fn in rows.items():
            fn()
            torch.cuda.synchronize()
            host, wall = median_block_host_wall_us(fn, calls, sync=torch.cuda.synchronize)
            report["rows"][label] = {"host_us": host, "wall_us": wall}
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(calls):
            rows["flash_attn_with_kvcache"]()
        prof.disable()
        torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
    report["profile"] = text.getvalue()
    with open(os.path.join(os.environ.get("OUT") or ".", "serving_overhead.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(text.getvalue()[-6000:])
    print(f"{report['gpu']}, torch {report['torch']}: µs per call (median of 5 blocks of {calls})")
    for label, r in report["rows"].items():
        print(f"  {label:<26s} host {r['host_us']:7.1f}   wall {r['wall_us']:7.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
