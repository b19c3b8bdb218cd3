"""MLA decode (absorbed, d_qk = 576, d_v = 512, one latent KV head) built from specs/mla_decode_fwd.tl,
against torch eager (bf16 GEMMs + softmax, the same math) in the same run. Memory-bound: reported
as GB/s of the latent cache read (V is a view of K's first 512 columns, as the spec's note says).

    python bench/bench_decode.py          # table last, JSON under $OUT

Two launches of the same kernel: one block row per query head (q as (B, H, 1, 576)), and the
query heads folded into the rows (q as (B, 1, H, 576)): every head reads the same cache, so one
block of 16 rows serves 16 heads. Output checked with docs/correctness.md's rule.
"""
from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import tlc  # noqa: E402
from tlc.testing_tolerance import check_attention  # noqa: E402

SPEC = Path(__file__).resolve().parents[1] / "specs" / "mla_decode_fwd.tl"
ROWS = [dict(B=64, H=128, Sk=1024), dict(B=64, H=128, Sk=4096), dict(B=16, H=128, Sk=16384)]
DQK, DV = 576, 512


def bench_ms(fn) -> float:
    from triton.testing import do_bench
    return do_bench(fn, warmup=25, rep=200, return_mode="median")


def torch_decode(q, k, v, scale):
    """(B, H, 576) queries against (B, Sk, 576) keys: batched GEMMs with the heads as rows."""
    s = torch.bmm(q, k.transpose(-1, -2)) * scale
    return torch.bmm(torch.softmax(s.float(), dim=-1).to(q.dtype), v)


def main() -> int:
    kern = tlc.build(SPEC, arch="sm_90")
    dev = torch.cuda.get_device_name()
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "gpu": dev,
              "torch": torch.__version__, "registers": kern.attributes(0).get("registers"), "rows": []}
    for row in ROWS:
        B, H, Sk = row["B"], row["H"], row["Sk"]
        scale = DQK ** -0.5
        q = torch.randn(B, H, 1, DQK, device="cuda", dtype=torch.bfloat16)
        cache = torch.randn(B, 1, Sk, DQK, device="cuda", dtype=torch.bfloat16)
        v = cache[..., :DV]  # a view: row stride 576
        bytes_read = cache.numel() * 2 + q.numel() * 2 + B * H * DV * 2
        res = dict(row)
        for label, qq in (("per_head", q), ("heads_as_rows", q.transpose(1, 2).contiguous())):
            out = torch.full((*qq.shape[:3], DV), float("nan"), device="cuda", dtype=torch.bfloat16)
            kern(qq, cache, v, out=out, scale=scale)
            torch.cuda.synchronize()
            o = out if label == "per_head" else out.transpose(1, 2)
            rep = check_attention(o[:2, :4], q[:2, :4], cache[:2].expand(2, 4, Sk, DQK),
                                  v[:2].expand(2, 4, Sk, DV), scale=scale)  # a slice: the reference is fp32
            ms = bench_ms(lambda: kern(qq, cache, v, out=out, scale=scale))
            res[f"{label}_ms"], res[f"{label}_gbps"] = ms, bytes_read / ms / 1e6
            res[f"{label}_check"], res[f"{label}_passed"] = str(rep), rep.passed
        q3, k3, v3 = q[:, :, 0], cache[:, 0], v[:, 0]
        ms = bench_ms(lambda: torch_decode(q3, k3, v3, scale))
        res["torch_ms"], res["torch_gbps"] = ms, bytes_read / ms / 1e6
        report["rows"].append(res)
        torch.cuda.empty_cache()
    out_dir = os.environ.get("OUT") or "."
    with open(os.path.join(out_dir, "bench_decode.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
    print(f"\n{dev}, torch {torch.__version__}: MLA decode 576/512, bf16, one new token, "
          f"{report['registers']} registers; GB/s of cache read (median of do_bench)")
    print(f"{'B x H x Sk':18s} {'per head':>9s} {'heads as rows':>14s} {'torch eager':>12s}  check")
    for r in report["rows"]:
        ok = r["per_head_passed"] and r["heads_as_rows_passed"]
        print(f"{r['B']:>3d} x {r['H']} x {r['Sk']:<6d} {r['per_head_gbps']:9.0f} {r['heads_as_rows_gbps']:14.0f} "
              f"{r['torch_gbps']:12.0f}  {'PASS' if ok else 'FAIL'}")
    return 0 if all(r["per_head_passed"] and r["heads_as_rows_passed"] for r in report["rows"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
