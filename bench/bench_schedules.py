"""sm_90a schedule choices side by side, same run, same GPU: the kernel tlc.attention builds with each of
warp-specialize, overlap-gemms and ping-pong switched off in turn (Params appended to the spec's text),
checked against the reference before timing.

    python3 bench/bench_schedules.py [--jobs 16]      # compiles the variants in parallel first

Prints a table last; writes $OUT/bench_schedules.json when OUT is set.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import require_cuda  # noqa: E402

ARCH = "sm_90a"
SCHEDULES = {  # name → Params appended to the spec (each must be a Param the lowering reads)
    "cp.async (no warp-specialize)": {"WarpSpecialize": "false"},
    "warp-specialize": {"Overlap": "false"},
    "+ overlap-gemms": {"PingPong": "false"},
    "+ ping-pong (default)": {},
}
ROWS = [dict(name="MHA d=128", B=4, H=16, S=4096, d=128, causal=False),
        dict(name="MHA d=128 causal", B=4, H=16, S=4096, d=128, causal=True),
        dict(name="MHA d=64", B=4, H=32, S=4096, d=64, causal=False),
        dict(name="MHA d=256", B=4, H=8, S=4096, d=256, causal=False)]


def source(row, schedule: dict) -> tuple[str, str, dict]:
    """The row's spec text with the schedule's Params appended, its path and -D bindings."""
    from bench.bench_attention import row_build, row_tiles

    spec, defines = row_build(row, row_tiles(row, ARCH), ARCH)
    text = spec.read_text() + "".join(f"\nParam {k} = {v}" for k, v in schedule.items())
    return text, str(spec), defines


def build(args):
    row, name = args
    import tlc

    text, _, defines = source(row, SCHEDULES[name])
    try:
        tlc.build(text, arch=ARCH, defines=defines)
        return None
    except Exception as exc:  # noqa: BLE001 - reported in the table
        return f"{row['name']} / {name}: {str(exc)[:300]}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    a = ap.parse_args()
    require_cuda("bench/bench_schedules.py")
    jobs = [(row, name) for row in ROWS for name in SCHEDULES]
    with ProcessPoolExecutor(a.jobs) as pool:
        failures = [f for f in pool.map(build, jobs) if f]
    for f in failures:
        print("build failed:", f)

    import torch

    import tlc
    from bench.bench_attention import bench_ms, check_slice, flops

    results = []
    for row, name in jobs:
        text, _, defines = source(row, SCHEDULES[name])
        entry = dict(row=row["name"], schedule=name)
        try:
            kern = tlc.build(text, arch=ARCH, defines=defines)
        except Exception as exc:  # noqa: BLE001
            results.append(dict(entry, error=str(exc)[:300]))
            continue
        B, H, S, d = row["B"], row["H"], row["S"], row["d"]
        q, k, v = (torch.randn(B, H, S, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        out = torch.full_like(q, float("nan"))
        kern(q, k, v, out=out)
        torch.cuda.synchronize()
        rep = check_slice(out, q, k, v, row["causal"])
        ms = bench_ms(lambda: kern(q, k, v, out=out))
        results.append(dict(entry, check_passed=rep.passed, ms=ms,
                            tflops=flops(B, H, S, d, row["causal"]) / ms / 1e9,
                            registers=kern.attributes(0).get("registers")))
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_schedules.json"), "w") as f:
            json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, arch=ARCH, rows=results), f,
                      indent=1)
    print(f"{torch.cuda.get_device_name()}, tlc {ARCH}, bf16 forward, TFLOP/s (median of do_bench)")
    print(f"{'row':<18} {'schedule':<32} {'TFLOP/s':>8}  check")
    for r in results:
        if "error" in r:
            print(f"{r['row']:<18} {r['schedule']:<32} {'ERROR':>8}  {r['error'][:80]}")
        else:
            print(f"{r['row']:<18} {r['schedule']:<32} {r['tflops']:8.1f}  {'PASS' if r['check_passed'] else 'FAIL'}")
    return 0 if all(r.get("check_passed") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
