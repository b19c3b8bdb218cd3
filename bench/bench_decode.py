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
# -D bindings timed with the heads folded into the rows; the first also one block row per head
CONFIGS = [dict(BM=16, Warps=4), dict(BM=32, Warps=8)]
DQK, DV = 576, 512


def bench_ms(fn) -> float:
    from triton.testing import do_bench
    return do_bench(fn, warmup=25, rep=200, return_mode="median")


def torch_decode(q, k, v, scale):
    """(B, H, 576) queries against (B, Sk, 576) keys: batched GEMMs with the heads as rows."""
    s = torch.bmm(q, k.transpose(-1, -2)) * scale
    return torch.bmm(torch.softmax(s.float(), dim=-1).to(q.dtype), v)


def main() -> int:
    kerns = {_label(c): tlc.build(SPEC, arch="sm_90", defines=c) for c in CONFIGS}
    dev = torch.cuda.get_device_name()
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "gpu": dev,
              "torch": torch.__version__, "registers": {k: v.attributes(0).get("registers") for k, v in kerns.items()},
              "rows": []}
    for row in ROWS:
        B, H, Sk = row["B"], row["H"], row["Sk"]
        scale = DQK ** -0.5
        q = torch.randn(B, H, 1, DQK, device="cuda", dtype=torch.bfloat16)
        cache = torch.randn(B, 1, Sk, DQK, device="cuda", dtype=torch.bfloat16)
        v = cache[..., :DV]  # a view: row stride 576
        bytes_read = cache.numel() * 2 + q.numel() * 2 + B * H * DV * 2
        res = dict(row)
        first = _label(CONFIGS[0])
        runs = [("per_head " + first, kerns[first], q)] + [
            (f"heads_as_rows {k}", kern, q.transpose(1, 2).contiguous()) for k, kern in kerns.items()]
        for label, kern, qq in runs:
            out = torch.full((*qq.shape[:3], DV), float("nan"), device="cuda", dtype=torch.bfloat16)
            kern(qq, cache, v, out=out, scale=scale)
            torch.cuda.synchronize()
            o = out if label.startswith("per_head") else out.transpose(1, 2)
            rep = check_attention(o[:2, :4], q[:2, :4], cache[:2].expand(2, 4, Sk, DQK),
                                  v[:2].expand(2, 4, Sk, DV), scale=scale)  # a slice: the reference is fp32
            ms = bench_ms(lambda: kern(qq, cache, v, out=out, scale=scale))
            res[label] = dict(ms=ms, gbps=bytes_read / ms / 1e6, check=str(rep), passed=rep.passed)
        q3, k3, v3 = q[:, :, 0], cache[:, 0], v[:, 0]
        ms = bench_ms(lambda: torch_decode(q3, k3, v3, scale))
        res["torch_ms"], res["torch_gbps"] = ms, bytes_read / ms / 1e6
        report["rows"].append(res)
        torch.cuda.empty_cache()
    out_dir = os.environ.get("OUT") or "."
    with open(os.path.join(out_dir, "bench_decode.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
    labels = [k for k in report["rows"][0] if isinstance(report["rows"][0][k], dict)]
    print(f"\n{dev}, torch {torch.__version__}: MLA decode 576/512, bf16, one new token; registers "
          f"{report['registers']}; GB/s of cache read (median of do_bench)")
    print(f"{'B x H x Sk':18s} " + " ".join(f"{k:>26s}" for k in labels) + f" {'torch eager':>12s}  check")
    for r in report["rows"]:
        ok = all(r[k]["passed"] for k in labels)
        print(f"{r['B']:>3d} x {r['H']} x {r['Sk']:<6d} " + " ".join(f"{r[k]['gbps']:26.0f}" for k in labels)
              + f" {r['torch_gbps']:12.0f}  {'PASS' if ok else 'FAIL'}")
    return 0 if all(r[k]["passed"] for r in report["rows"] for k in labels) else 1


def _label(config: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in config.items())


if __name__ == "__main__":
    raise SystemExit(main())
