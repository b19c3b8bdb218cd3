"""Where decode's time goes: specs/decode_fwd.tl (the program tlc.flash_attn_with_kvcache runs on a contiguous
cache) at bench_kv_decode's shapes for a grid of tiles, splits and targets, each timed whole (do_bench) and per
kernel (torch.profiler: the partial kernel and the combine kernel apart). Every configuration's output is checked
against SDPA on a slice first. For choosing kernel_plan's tiles and split rule from measurements.

    python bench/decode_sweep.py [--quick]      # table last, JSON under $OUT
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import require_cuda  # noqa: E402
from bench.bench_kv_decode import D, SHAPES, SPECS  # noqa: E402 - the same shapes, head dim and specs
# (label, arch, -D bindings without Splits); the API's plan today is "90a 64x128"
VARIANTS = [("90a 64x128", "sm_90a", {"BM": 64, "BN": 128}), ("90a 64x64", "sm_90a", {"BM": 64, "BN": 64}),
            ("90a 128x64", "sm_90a", {"BM": 128, "BN": 64}),
            ("90 64x64", "sm_90", {"BM": 64, "BN": 64}), ("90 16x64 w1", "sm_90", {"BM": 16, "BN": 64, "Warps": 1}),
            ("90 16x128 w1", "sm_90", {"BM": 16, "BN": 128, "Warps": 1})]
SPLITS = (1, 2, 4, 8, 16, 32, 64)


def defines(variant: dict, splits: int) -> dict:
    return {"HeadDim": D, "dtype": "bf16", "Causal": False, "Splits": splits, **variant}


def _build(args):
    arch, defs = args
    import tlc
    try:
        tlc.build(SPECS / "decode_fwd.tl", arch=arch, defines=defs)
        return None
    except Exception as exc:  # noqa: BLE001 - a configuration the compiler refuses: say so in the table
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"


def kernel_times(fn, reps: int = 20) -> dict[str, float]:
    """Mean device µs per call of each kernel `fn` launches, by kernel name."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for e in prof.key_averages():
        if e.device_type.name == "CUDA" and e.count:
            name = "partial" if "partial" in e.key else "combine" if "combine" in e.key else e.key[:30]
            out[name] = out.get(name, 0.0) + e.device_time_total / reps
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="splits 1, 4, 16, 64 only")
    splits = (1, 4, 16, 64) if ap.parse_args().quick else SPLITS
    require_cuda("decode_sweep.py")
    import torch
    import torch.nn.functional as F
    from triton.testing import do_bench

    import tlc
    from tlc.testing_tolerance import check_attention

    configs = [(label, arch, defines(v, s)) for label, arch, v in VARIANTS for s in splits]
    with ProcessPoolExecutor(min(16, os.cpu_count() or 1)) as pool:
        refused = dict(zip([(c[0], c[2]["Splits"]) for c in configs],
                           pool.map(_build, [(arch, d) for _, arch, d in configs])))
    dev = torch.cuda.get_device_name()
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "gpu": dev,
              "torch": torch.__version__, "rows": []}
    for shape in SHAPES:
        B, H, KVH, S = shape["B"], shape["H"], shape["KVH"], shape["S"]
        G, scale = H // KVH, D ** -0.5
        q = torch.randn(B, KVH, G, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, KVH, S, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, KVH, S, D, device="cuda", dtype=torch.bfloat16)
        lengths = torch.full((B,), S, device="cuda", dtype=torch.int32)
        out = torch.empty_like(q)
        gbytes = 2 * B * KVH * S * D * 2 / 1e9
        ref_k, ref_v = (t[:1].repeat_interleave(G, dim=1)[:, :4] for t in (k, v))
        q_heads = q.reshape(B, H, 1, D)
        cudnn = do_bench(lambda: F.scaled_dot_product_attention(q_heads, k, v, scale=scale, enable_gqa=True),
                         warmup=25, rep=200, return_mode="median")
        for label, arch, defs in configs:
            cell = dict(shape, variant=label, splits=defs["Splits"], arch=arch)
            why = refused[(label, defs["Splits"])]
            if why:
                cell["error"] = why
            else:
                kern = tlc.build(SPECS / "decode_fwd.tl", arch=arch, defines=defs)
                call = lambda: kern(q, k, v, out=out, scale=scale, kv_lengths=lengths)  # noqa: E731
                out.fill_(float("nan"))
                call()
                torch.cuda.synchronize()
                rep = check_attention(out.reshape(B, H, 1, D)[:1, :4], q_heads[:1, :4], ref_k, ref_v, scale=scale)
                ms = do_bench(call, warmup=25, rep=200, return_mode="median")
                cell.update(ms=ms, tbps=gbytes / ms, passed=rep.passed, kernels_us=kernel_times(call))
            report["rows"].append(cell)
        report["rows"].append(dict(shape, variant="SDPA default", ms=cudnn, tbps=gbytes / cudnn, passed=True))
        torch.cuda.empty_cache()
    with open(os.path.join(os.environ.get("OUT") or ".", "decode_sweep.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
    print(f"\n{dev}: decode_fwd.tl, one new token, bf16, d {D}; TB/s of K+V (partial µs / combine µs); * = wrong")
    for r in report["rows"]:
        head = f"B{r['B']} {r['H']}/{r['KVH']} {r['S']:>5d} {r['variant']:>14s} s{r.get('splits', '-'):<3}"
        if "error" in r:
            print(f"{head} refused: {r['error'][:90]}")
        else:
            ku = r.get("kernels_us", {})
            print(f"{head} {r['tbps']:5.2f}{'' if r['passed'] else '*'}  ({ku.get('partial', 0):6.1f} / "
                  f"{ku.get('combine', 0):6.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
