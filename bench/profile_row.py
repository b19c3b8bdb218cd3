"""Run one bench row's kernel once inside a profiler range, for Nsight Compute:

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section WarpStateStats \
        python3 bench/profile_row.py 'MHA d=128 S=1k$' --backend tlc|cudnn [--arch sm_90a]

The row is a BAR_ROWS name (bench/bench_attention.py, a regex matching exactly one); tlc's kernel is
the one the bar table times (TLC_BENCH_DEFINES applies), cudnn SDPA's cuDNN backend on the same
tensors. Three untimed calls warm up, then one call runs between cudaProfilerStart and Stop, so
`--profile-from-start off` sees that call's kernels only.
"""
from __future__ import annotations

import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import tlc  # noqa: E402
from bench import bench_attention as ba  # noqa: E402
from bench import require_cuda  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("row", help="a regex matching one BAR_ROWS name")
    ap.add_argument("--backend", choices=("tlc", "cudnn"), default="tlc")
    ap.add_argument("--arch", choices=("sm_90", "sm_90a"), default="sm_90a")
    a = ap.parse_args()
    rows = [r for r in ba.BAR_ROWS if re.search(a.row, r["name"])]
    if len(rows) != 1:
        sys.exit(f"profile_row: {a.row!r} matches {len(rows)} rows ({[r['name'] for r in rows]}); name exactly one")
    require_cuda("bench/profile_row.py")
    row = rows[0]
    B, H, S, d, causal = row["B"], row["H"], row["S"], row["d"], row["causal"]
    dv, hkv = row.get("d_v", d), row.get("Hkv", H)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[row.get("dtype", "bf16")]
    torch.manual_seed(0)
    q = torch.randn(B, H, S, d, device="cuda", dtype=dtype)
    k = torch.randn(B, hkv, S, d, device="cuda", dtype=dtype)
    v = torch.randn(B, hkv, S, dv, device="cuda", dtype=dtype)
    if a.backend == "tlc":
        spec, defines = ba.row_build(row, ba.row_tiles(row, a.arch), a.arch)
        kern = tlc.build(spec, arch=a.arch, defines=defines)
        out = torch.empty(B, H, S, dv, device="cuda", dtype=dtype)
        call = lambda: kern(q, k, v, out=out)  # noqa: E731
        print(f"profile_row: {row['name']} tlc {spec.name} {defines}", flush=True)
    else:
        kw = {"enable_gqa": True} if hkv != H else {}

        def call():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, **kw)
        print(f"profile_row: {row['name']} cuDNN", flush=True)
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
