"""tlc forward attention vs torch SDPA (FlashAttention-2 backend, asserted) and cuDNN, same run.

    python bench/bench_attention.py                # the README's MHA rows with the default tiles
    python bench/bench_attention.py --sweep        # also time tile/warp/stage variants (regs, spills)

Checks tlc's output against the tolerance rule of docs/correctness.md on a (batch 0, 2 heads) slice of every timed problem,
times with triton.testing.do_bench (median), prints a table last and writes JSON under $OUT.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import tlc  # noqa: E402
from tlc.runtime import attention_spec  # noqa: E402
from tlc.tuning import default_tiles  # noqa: E402
from tlc.testing_tolerance import check_attention  # noqa: E402

ROWS = [  # B = 4, S = 4096, H = 16 at d = 128, H = 32 at d = 64
    dict(name="MHA d=128", B=4, H=16, S=4096, d=128, causal=False),
    dict(name="MHA d=128 causal", B=4, H=16, S=4096, d=128, causal=True),
    dict(name="MHA d=64", B=4, H=32, S=4096, d=64, causal=False),
    dict(name="MHA d=64 causal", B=4, H=32, S=4096, d=64, causal=True),
]
EXTRA_ROWS = [  # rows SDPA's flash backend cannot run (d_qk != d_v) or runs with other tiles
    dict(name="MLA prefill causal", B=4, H=16, S=4096, d=192, d_v=128, causal=True),
    dict(name="MHA d=256", B=4, H=8, S=4096, d=256, causal=False),
]
DEFAULT_TILES = {d: default_tiles(d, d) for d in (64, 128)}
SWEEP = [  # variants around the defaults that fit the register budget at d = 64 and 128 (check-resources
    # refuses 128x128 at d = 128 and 192x64 on 4 warps); measured lists are in bench/README.md
    dict(bm=128, bn=64, warps=4, stages=1), dict(bm=128, bn=64, warps=4, stages=2),
    dict(bm=64, bn=64, warps=4, stages=2), dict(bm=128, bn=32, warps=4, stages=2),
]
WIDE_SWEEP = [  # for d >= 192 (--extra --sweep): FA2 runs d=256 with 128x64 tiles on 8 warps
    dict(bm=128, bn=64, warps=8, stages=2), dict(bm=128, bn=32, warps=8, stages=2),
    dict(bm=64, bn=64, warps=4, stages=2), dict(bm=64, bn=32, warps=4, stages=2),
]
if os.environ.get("TLC_BENCH_WIDE_SWEEP"):  # the same format, for the --extra rows
    WIDE_SWEEP = [dict(zip(("bm", "bn", "warps", "stages"), map(int, v.split("x"))))
                  for v in os.environ["TLC_BENCH_WIDE_SWEEP"].split(";") if v]
if os.environ.get("TLC_BENCH_SWEEP"):  # e.g. "128x48x4x2;128x64x4x1": BMxBNxWARPSxSTAGES, replaces the list
    SWEEP = [dict(zip(("bm", "bn", "warps", "stages"), map(int, v.split("x"))))
             for v in os.environ["TLC_BENCH_SWEEP"].split(";") if v]


ARCH = "sm_90"  # --arch: sm_90 (the sm_80-family kernels an H100/H200 runs) or sm_90a (wgmma)


def row_tiles(row) -> dict:
    """The tiles a row runs with: tlc.attention's table for the target (tlc/tuning.py)."""
    return default_tiles(row["d"], row.get("d_v", row["d"]), ARCH)


def flops(B, H, S, d, causal, d_v=None):
    f = 2.0 * B * H * S * S * (d + (d_v or d))
    return f / 2 if causal else f


def bench_ms(fn) -> float:
    from triton.testing import do_bench
    return do_bench(fn, warmup=50, rep=300, return_mode="median")


def sdpa_kernel_names(backend, q, k, v, causal) -> list[str]:
    """Names of the CUDA kernels one SDPA call ran under `backend` (FA2 shows as flash_fwd_kernel)."""
    from torch.profiler import ProfilerActivity, profile
    with sdpa_kernel([backend]), profile(activities=[ProfilerActivity.CUDA]) as prof:
        F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.cuda.synchronize()
    return sorted({e.name for e in prof.events() if e.device_type.name == "CUDA"})


def run_row(row, tiles, dtype=torch.bfloat16, check=True):
    B, H, S, d, causal = row["B"], row["H"], row["S"], row["d"], row["causal"]
    dv = row.get("d_v", d)
    spec, defines = attention_spec("bf16", d, dv, causal)  # the shipped .tl tlc.attention builds
    defines.update(_tile_defines(spec, tiles))  # the swept tiles replace attention_spec's defaults
    kern = tlc.build(spec, arch=ARCH, defines=defines)
    key = f"{spec.stem} " + " ".join(f"{k}={v}" for k, v in defines.items() if k not in ("dtype",))
    q, k = (torch.randn(B, H, S, d, device="cuda", dtype=dtype) for _ in range(2))
    v = torch.randn(B, H, S, dv, device="cuda", dtype=dtype)
    out = torch.full((B, H, S, dv), float("nan"), device="cuda", dtype=dtype)
    kern(q, k, v, out=out)
    torch.cuda.synchronize()
    result = dict(row, config=key, compile_seconds=round(kern.compiled.compile_seconds, 1),
                  ptxas=kern.compiled.metadata.get("ptxas", {}), attributes=kern.attributes(0))
    if check:
        from bench.sass import sass_summary
        result["sass"] = sass_summary(kern.compiled.cubin)
    if check:
        rep = check_attention(out[:1, :2], q[:1, :2], k[:1, :2], v[:1, :2], causal=causal)
        result["check"] = str(rep)
        result["check_passed"] = rep.passed
    ms = bench_ms(lambda: kern(q, k, v, out=out))
    result["tlc_ms"] = ms
    result["tlc_tflops"] = flops(B, H, S, d, causal, dv) / ms / 1e9
    return result, (q, k, v)


def run_baselines(row, qkv, result):
    q, k, v = qkv
    B, H, S, d, causal = row["B"], row["H"], row["S"], row["d"], row["causal"]
    for label, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            names = sdpa_kernel_names(backend, q, k, v, causal)
            with sdpa_kernel([backend]):  # only this backend may run: SDPA raises otherwise
                ms = bench_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
            result[f"{label}_ms"] = ms
            result[f"{label}_tflops"] = flops(B, H, S, d, causal, row.get("d_v")) / ms / 1e9
            result[f"{label}_kernels"] = names
        except RuntimeError as exc:
            result[f"{label}_error"] = str(exc).splitlines()[0][:200]
    if "flash_kernels" in result:
        result["flash_is_fa2"] = any("flash_fwd_kernel" in n for n in result["flash_kernels"])


def _tile_defines(spec, tiles) -> dict:
    """-D bindings for the tiles: BM and BN, and Warps/Stages where the spec declares them."""
    text = spec.read_text()
    out = dict(BM=tiles["bm"], BN=tiles["bn"])
    out.update({p: tiles[k] for p, k in (("Warps", "warps"), ("Stages", "stages")) if f"Param {p} " in text})
    return out


def _warm(args) -> str:
    """Build one row's kernel into the disk cache (a child process: NVRTC runs in parallel)."""
    row, tiles, arch = args
    d, dv = row["d"], row.get("d_v", row["d"])
    spec, defines = attention_spec("bf16", d, dv, row["causal"])
    defines.update(_tile_defines(spec, tiles))  # the swept tiles replace attention_spec's defaults
    try:
        tlc.build(spec, arch=arch, defines=defines)
        return f"built {row['name']} {tiles}"
    except Exception as exc:  # noqa: BLE001 - the timed run reports it again
        return f"build failed {row['name']} {tiles}: {exc}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--no-baselines", action="store_true")
    ap.add_argument("--extra", action="store_true", help="also the MLA-prefill and d=256 rows")
    ap.add_argument("--arch", default="sm_90", choices=("sm_90", "sm_90a"),
                    help="tlc's target: sm_90 (mma.sync, the default) or sm_90a (wgmma; tiles get 4 warps per 64 rows)")
    a = ap.parse_args()
    global ARCH
    ARCH = a.arch
    torch.manual_seed(0)
    from concurrent.futures import ProcessPoolExecutor
    rows = ROWS + (EXTRA_ROWS if a.extra else [])
    todo = [(r, row_tiles(r)) for r in rows]
    sweeps = [(r, t) for r in ROWS for t in SWEEP] if a.sweep else []
    sweeps += [(r, t) for r in EXTRA_ROWS for t in WIDE_SWEEP] if a.sweep and a.extra else []
    todo += sweeps
    with ProcessPoolExecutor(max_workers=min(16, len(todo))) as pool:
        for line in pool.map(_warm, [(r, t, ARCH) for r, t in todo]):
            print(line, flush=True)
    dev = torch.cuda.get_device_name()
    report = {"arch": ARCH, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "gpu": dev,
              "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "rows": [], "sweep": []}
    if a.sweep:
        for row, tiles in sweeps:
            try:
                res, _ = run_row(row, tiles, check=False)
                report["sweep"].append(res)
                print(f"sweep {row['name']:18s} {res['config']:58s} {res['tlc_tflops']:6.1f} TFLOP/s "
                      f"regs={res['attributes'].get('registers')} local={res['attributes'].get('local_bytes')}",
                      flush=True)
            except Exception as exc:  # one failing variant must not hide the others
                print(f"sweep {row['name']} {tiles}: ERROR {str(exc)[:300]}", flush=True)
    for row in ROWS + (EXTRA_ROWS if a.extra else []):
        res, qkv = run_row(row, row_tiles(row))
        if not a.no_baselines:
            run_baselines(row, qkv, res)
        report["rows"].append(res)
        del qkv
        torch.cuda.empty_cache()
    out_dir = os.environ.get("OUT") or "."
    with open(os.path.join(out_dir, "bench_attention.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
    print(f"\n{dev}, torch {torch.__version__}, cuDNN {report['cudnn']}, tlc for {ARCH}, bf16 forward, "
          "TFLOP/s (median of do_bench)")
    print(f"{'config':20s} {'tlc':>7s} {'SDPA-FA2':>9s} {'cuDNN':>7s} {'tlc/FA2':>8s} {'tlc/cuDNN':>9s}  check")
    for r in report["rows"]:
        fa, cu = r.get("flash_tflops"), r.get("cudnn_tflops")
        fa_s = f"{fa:9.1f}" if fa else f"{'n/a':>9s}"
        cu_s = f"{cu:7.1f}" if cu else f"{'n/a':>7s}"
        ra = f"{r['tlc_tflops'] / fa:8.2f}" if fa else f"{'':8s}"
        rc = f"{r['tlc_tflops'] / cu:9.2f}" if cu else f"{'':9s}"
        fa2 = "" if r.get("flash_is_fa2", True) else " (SDPA flash kernel not FA2!)"
        print(f"{r['name']:20s} {r['tlc_tflops']:7.1f} {fa_s} {cu_s} {ra} {rc}  "
              f"{'PASS' if r.get('check_passed') else 'FAIL'}{fa2}")
    print("\nkernel                                          regs local  SASS: HMMA HGMMA LDGSTS LDSM LDSM.T LDL STL")
    for r in report["rows"]:
        s, at = r.get("sass", {}), r["attributes"]
        print(f"{r['config']:48s} {at.get('registers', '?'):>4} {at.get('local_bytes', '?'):>5}        "
              f"{s.get('HMMA', 0):4d} {s.get('HGMMA', 0):5d} {s.get('LDGSTS', 0):6d} {s.get('LDSM', 0):4d} {s.get('LDSM.T', 0):6d} "
              f"{s.get('LDL', 0):3d} {s.get('STL', 0):3d}")
    return 0 if all(r.get("check_passed") for r in report["rows"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
