"""Compile many attention specializations in parallel into the tlc cache (used before GPU runs).

    python bench/precompile.py --arch sm_90 --jobs 14 [--set tests|bench|smoke]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tlc.kir.flash_fwd import FlashFwdConfig, default_tiles  # noqa: E402

# (d, BM, BN, warps) per head dim for the sm_80-family path on Hopper.
TILES = {d: default_tiles(d, d) for d in (64, 128)}


def test_configs() -> list[FlashFwdConfig]:
    out = []
    for dtype in ("bf16", "fp16"):
        for d in (128, 64):
            for causal, align in ((False, "top_left"), (True, "top_left"), (True, "bottom_right")):
                out.append(FlashFwdConfig(dtype=dtype, d_qk=d, d_v=d, causal=causal, alignment=align, **TILES[d]))
    out.append(FlashFwdConfig(dtype="bf16", d_qk=128, d_v=128, causal=True, lse=True, **TILES[128]))
    out.append(FlashFwdConfig(dtype="bf16", d_qk=128, d_v=128, softcap=True, **TILES[128]))
    variants = [dict(bm=128, bn=64, warps=4, stages=1), dict(bm=128, bn=32, warps=4, stages=2),
                dict(bm=64, bn=64, warps=4, stages=2), dict(bm=192, bn=64, warps=4, stages=2),
                dict(bm=128, bn=64, warps=4, stages=2, s_prefetch=False, pv_prefetch=False)]
    out += [FlashFwdConfig(d_qk=128, d_v=128, causal=c, **t) for t in variants for c in (False, True)]
    out += [FlashFwdConfig(d_qk=192, d_v=128, causal=True, **default_tiles(192, 128)),
            FlashFwdConfig(d_qk=256, d_v=256, **default_tiles(256, 256))]
    return out


def bench_configs() -> list[FlashFwdConfig]:
    from bench.bench_attention import DEFAULT_TILES, ROWS, SWEEP
    out = []
    for row in ROWS:
        for tiles in [DEFAULT_TILES[row["d"]], *SWEEP]:
            out.append(FlashFwdConfig(dtype="bf16", d_qk=row["d"], d_v=row["d"], causal=row["causal"], **tiles))
    return out


def _compile(args):
    cfg, arch = args
    from tlc.backend_cute.compile import compile_kir
    from tlc.kir.flash_fwd import build_flash_fwd_kir
    t = time.perf_counter()
    try:
        ck = compile_kir(build_flash_fwd_kir(cfg), arch)
        return cfg.key(), round(time.perf_counter() - t, 1), ck.metadata.get("ptxas", {}), ck.cached, None
    except Exception as exc:  # report and continue: one bad config should not hide the others
        return cfg.key(), round(time.perf_counter() - t, 1), {}, False, str(exc)[:2000]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--set", default="tests", choices=["tests", "bench", "all"])
    a = ap.parse_args()
    cfgs = {"tests": test_configs, "bench": bench_configs, "all": lambda: test_configs() + bench_configs()}[a.set]()
    cfgs = list({c.key(): c for c in cfgs}.values())
    failed = 0
    with ProcessPoolExecutor(a.jobs) as ex:
        for key, secs, ptxas, cached, err in ex.map(_compile, [(c, a.arch) for c in cfgs]):
            status = "cached" if cached else f"{secs:6.1f} s"
            print(f"{key:60s} {status}  regs={ptxas.get('registers')} spill={ptxas.get('spill_store_bytes')}"
                  + (f"\n  ERROR {err}" if err else ""), flush=True)
            failed += err is not None
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
