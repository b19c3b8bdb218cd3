"""tlc forward attention vs torch SDPA (FlashAttention-2 backend, asserted) and cuDNN, same run.

    python bench/bench_attention.py                # the README's MHA rows with the default tiles
    python bench/bench_attention.py --sweep        # also time (and check) tile/warp/stage variants
    TLC_BENCH_DEFINES="TmaStore=true" python bench/bench_attention.py --bar --arch sm_90a   # a schedule knob on every row
    python bench/bench_attention.py --bar --arch sm_90a   # issue 12's bar table (BAR_ROWS), B·S = 16k everywhere

Checks tlc's output (every swept variant's too, and each baseline's) against the tolerance rule of docs/correctness.md on a (batch 0,
first and last query head) slice of every timed problem, times with triton.testing.do_bench (median, after
WARMUP_MS = 500 ms of untimed calls; TLC_BENCH_WARMUP_MS sets it),
prints a table last and writes JSON under $OUT. GQA/MQA rows give SDPA enable_gqa=True under each
backend; a backend that refuses it (or answers wrongly) is timed on K/V heads expanded once with
repeat_interleave, outside the timed call, and the row's note says so.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import tlc  # noqa: E402
from bench import require_cuda, watchdog  # noqa: E402
from tlc.attention.kernels import attention_spec  # noqa: E402
from tlc.attention.tuning import default_tiles  # noqa: E402
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


def _row(name, d, H, causal, B=4, S=4096, **kw) -> dict:
    return dict(name=name, B=B, H=H, S=S, d=d, causal=causal, **kw)


# Issue 12's bar table (--bar): bf16 forward, B·S = 16k tokens everywhere; H = 32 at d = 64, 16 at d = 128,
# 8 at d = 256; GQA/MQA: 32 query heads (Hkv = 8 / 1); fp16 rows name their bf16 row (the ratio tlc
# fp16/bf16 must be within 3%); the sequence-length rows keep d = 128, H = 16.
BAR_ROWS = [
    *(_row(f"MHA d={d}" + (" causal" if c else ""), d, H, c) for d, H in ((64, 32), (128, 16), (256, 8))
      for c in (False, True)),
    *(_row(f"{kind} 32/{hkv} d=128" + (" causal" if c else ""), 128, 32, c, Hkv=hkv)
      for kind, hkv in (("GQA", 8), ("MQA", 1)) for c in (False, True)),
    _row("MLA prefill causal", 192, 16, True, d_v=128),
    *(_row("MHA d=128 fp16" + (" causal" if c else ""), 128, 16, c, dtype="fp16",
           bf16_row="MHA d=128" + (" causal" if c else "")) for c in (False, True)),
    *(_row(f"MHA d=128 S={k}k" + (" causal" if c else ""), 128, 16, c, B=16 // k, S=1024 * k)
      for k in (1, 16) for c in (False, True)),
]
# Short key sequences (--short; report rows beside the bar, B·S = 16k): where tlc.attention.tuning.short_keys gives the
# sm_90a kernels their persistent schedule (non-causal up to 4k keys, causal up to 1k); each row against the
# one-tile-per-CTA kernel with TLC_BENCH_DEFINES="Persistent=false;StaticTiles=false".
SHORT_ROWS = [
    *(_row(f"MHA d={d} S=1k" + (" causal" if c else ""), d, H, c, B=16, S=1024) for d, H in ((64, 32), (256, 8))
      for c in (False, True)),
    *(_row("GQA 32/8 d=128 S=1k" + (" causal" if c else ""), 128, 32, c, Hkv=8, B=16, S=1024) for c in (False, True)),
    _row("MLA prefill S=1k causal", 192, 16, True, d_v=128, B=16, S=1024),
    *(_row("MHA d=128 S=2k" + (" causal" if c else ""), 128, 16, c, B=8, S=2048) for c in (False, True)),
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
# e.g. "TmaStore=true;Stages=3": -D bindings added to every row (schedule knobs need no Param in the spec)
_DEFINES = [kv for kv in os.environ.get("TLC_BENCH_DEFINES", "").split(";") if kv.strip()]
if any("=" not in kv for kv in _DEFINES):
    sys.exit(f"TLC_BENCH_DEFINES={os.environ['TLC_BENCH_DEFINES']!r}: write NAME=VALUE;NAME=VALUE")
EXTRA_DEFINES = dict(kv.split("=", 1) for kv in _DEFINES)


ARCH = "sm_90"  # --arch: sm_90 (the sm_80-family kernels an H100/H200 runs) or sm_90a (wgmma)


class DefaultTiles(dict):
    """A row's tiles as tlc.attention picks them (row_tiles), as against a sweep's variant of equal values."""


def row_tiles(row, arch: str | None = None) -> DefaultTiles:
    """The tiles a row runs with: tlc.attention's table for the target (tlc/attention/tuning.py)."""
    return DefaultTiles(default_tiles(row["d"], row.get("d_v", row["d"]), arch or ARCH))


def row_build(row, tiles, arch: str) -> tuple:
    """(spec, -D bindings) of a row's kernel: the shipped .tl tlc.attention builds for the row's dtype and
    head dims on `arch`, with `tiles` (the same cache entry bench/precompile.py fills)."""
    d, dv = row["d"], row.get("d_v", row["d"])
    spec, defines = attention_spec(row.get("dtype", "bf16"), d, dv, row["causal"], arch, row["S"])
    if not isinstance(tiles, DefaultTiles):   # swept tiles replace attention_spec's; the defaults keep its
        defines.update(_tile_defines(tiles))   # schedule's own Stages (d = 64 causal on sm_90a: 3)
    defines.update(EXTRA_DEFINES)
    return spec, defines


def check_slice(out, q, k, v, causal):
    """check_attention on batch 0, the first and last query head with the K/V head each reads (GQA: head
    h reads KV head h // group), so a wrong group mapping fails too."""
    hq, hkv = q.shape[1], k.shape[1]
    qh, kh = [0, hq - 1], [0, (hq - 1) // (hq // hkv)]
    return check_attention(out[:1, qh], q[:1, qh], k[:1, kh], v[:1, kh], causal=causal)


def flops(B, H, S, d, causal, d_v=None):
    f = 2.0 * B * H * S * S * (d + (d_v or d))
    return f / 2 if causal else f


# Milliseconds each timed call runs untimed first. On the H200 every burst of GPU work starts with its SM clock
# at 1620-1845 MHz for 0.3-0.4 s before it settles at 1965-1980 (nvidia-smi every 100 ms over three runs of the
# d = 128 bf16/fp16 rows, 2026-11-27, bench/results/2026-11-27-h200-s15-fp16-clocks.txt), and each backend of a
# row is timed after a host-side gap (checks, profiling), so the rows are timed past that dip. Against do_bench's
# 50 ms (one run each, bench/results/2026-11-27-h200-s15-warmup-ab.txt) the bf16 d = 128 rows moved by 0.1 % and
# the fp16 ones by -1.6 % / -1.0 %: the fp16 rows' lower speed is not the dip.
_WARMUP = os.environ.get("TLC_BENCH_WARMUP_MS", "500")
if not _WARMUP.isdecimal():
    sys.exit(f"TLC_BENCH_WARMUP_MS={_WARMUP!r}: write a whole number of milliseconds, e.g. 500")
WARMUP_MS = int(_WARMUP)


def bench_ms(fn) -> float:
    from triton.testing import do_bench
    return do_bench(fn, warmup=WARMUP_MS, rep=300, return_mode="median")


# A row whose tlc call costs the host at least this share of its kernel's time is flagged in its notes: the GPU
# may then wait on the host between do_bench's launches (each also queues an L2 flush), so the TFLOP/s are the
# host's as much as the kernel's.
HOST_BOUND = 0.8


def host_us(fn, calls: int = 50) -> float:
    """Median host time of one call of `fn` in µs, the calls issued back to back without synchronizing (the GPU
    works through the queue meanwhile): what the CPU spends per launch."""
    torch.cuda.synchronize()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def sdpa_kernel_names(backend, q, k, v, causal, **kw) -> list[str]:
    """Names of the CUDA kernels one SDPA call ran under `backend` (FA2 shows as flash_fwd_kernel)."""
    from torch.profiler import ProfilerActivity, profile
    with sdpa_kernel([backend]), profile(activities=[ProfilerActivity.CUDA]) as prof:
        F.scaled_dot_product_attention(q, k, v, is_causal=causal, **kw)
        torch.cuda.synchronize()
    return sorted({e.name for e in prof.events() if e.device_type.name == "CUDA"})


def run_row(row, tiles, check=True):
    B, H, S, d, causal = row["B"], row["H"], row["S"], row["d"], row["causal"]
    dv, hkv, dt = row.get("d_v", d), row.get("Hkv", H), row.get("dtype", "bf16")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dt]
    spec, defines = row_build(row, tiles, ARCH)
    kern = tlc.build(spec, arch=ARCH, defines=defines)
    key = f"{spec.stem} " + ("" if dt == "bf16" else f"{dt} ") + " ".join(
        f"{k}={v}" for k, v in defines.items() if k not in ("dtype",))
    q = torch.randn(B, H, S, d, device="cuda", dtype=dtype)
    k = torch.randn(B, hkv, S, d, device="cuda", dtype=dtype)  # GQA/MQA: the kernel reads head h // (H / Hkv)
    v = torch.randn(B, hkv, S, dv, device="cuda", dtype=dtype)
    out = torch.full((B, H, S, dv), float("nan"), device="cuda", dtype=dtype)
    kern(q, k, v, out=out)
    torch.cuda.synchronize()
    result = dict(row, dtype=dt, config=key, compile_seconds=round(kern.compiled.compile_seconds, 1),
                  ptxas=kern.compiled.metadata.get("ptxas", {}), attributes=kern.attributes(0))
    if check:
        from bench.sass import sass_summary
        result["sass"] = sass_summary(kern.compiled.cubin)
    if check:
        rep = check_slice(out, q, k, v, causal)
        result["check"] = str(rep)
        result["check_passed"] = rep.passed
    ms = bench_ms(lambda: kern(q, k, v, out=out))
    result["tlc_ms"] = ms
    result["tlc_host_us"] = host_us(lambda: kern(q, k, v, out=out))
    result["tlc_tflops"] = flops(B, H, S, d, causal, dv) / ms / 1e9
    return result, (q, k, v)


def _sdpa_modes(q, k, v):
    """(mode, k, v, SDPA kwargs) to try in order: plain MHA; for GQA/MQA enable_gqa=True, then K/V heads
    expanded (once, outside the timed call) with repeat_interleave for a backend that refuses it."""
    hq, hkv = q.shape[1], k.shape[1]
    if hq == hkv:
        yield "mha", k, v, {}
        return
    yield "enable_gqa", k, v, {"enable_gqa": True}
    g = hq // hkv
    yield "repeat_interleave", k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1), {}


def _reason(message) -> str:
    """An SDPA warning without its C++ location; '' for the '... not used because:' header."""
    text = re.sub(r"\s*\(Triggered internally at [^)]*\)", "", str(message)).strip()
    return "" if text.endswith("because:") else text


def run_baselines(row, qkv, result):
    q, k, v = qkv
    B, H, S, d, causal = row["B"], row["H"], row["S"], row["d"], row["causal"]
    for label, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        errors: dict[str, str] = {}
        for mode, kk, vv, kw in _sdpa_modes(q, k, v):
            caught: list = []
            try:
                with warnings.catch_warnings(record=True) as caught, sdpa_kernel([backend]):
                    warnings.simplefilter("always")  # SDPA warns why a backend cannot run, then raises
                    out = F.scaled_dot_product_attention(q, kk, vv, is_causal=causal, **kw)
                torch.cuda.synchronize()
                rep = check_slice(out, q, kk, vv, causal)  # a baseline that answers wrongly is not timed
                del out
                if not rep.passed:
                    errors[mode] = f"output fails the tolerance check ({rep})"
                    continue
                names = sdpa_kernel_names(backend, q, kk, vv, causal, **kw)
                with sdpa_kernel([backend]):
                    ms = bench_ms(lambda: F.scaled_dot_product_attention(q, kk, vv, is_causal=causal, **kw))
            except Exception as exc:  # noqa: BLE001 - recorded: a baseline that cannot run is unavailable
                why = " ".join(t for t in dict.fromkeys(_reason(w.message) for w in caught) if t)  # SDPA's reasons
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                errors[mode] = (f"{why[:400]} [{first[:200]}]" if why else first[:200])
                continue
            result[f"{label}_ms"] = ms
            result[f"{label}_tflops"] = flops(B, H, S, d, causal, row.get("d_v")) / ms / 1e9
            result[f"{label}_kernels"] = names
            result[f"{label}_mode"] = mode
            result[f"{label}_check"] = str(rep)
            break
        if errors:  # every refused or wrong mode, also when a later one ran
            result[f"{label}_errors"] = errors
            result[f"{label}_error"] = "; ".join(f"{m}: {e}" for m, e in errors.items())
    if "flash_kernels" in result:
        result["flash_is_fa2"] = any("flash_fwd_kernel" in n for n in result["flash_kernels"])


def add_notes(rows) -> None:
    """Each row's `notes`: how its baselines ran (GQA: enable_gqa or expanded K/V), why one is n/a, whether
    SDPA's flash kernel was FA2, tlc's error, a tlc call whose host time nears its kernel's (HOST_BOUND), and for
    fp16 rows tlc's fp16/bf16 ratio against its bf16 row."""
    by_name = {r["name"]: r for r in rows}
    for r in rows:
        notes = []
        if "error" in r:
            notes.append(f"tlc: {r['error'][:160]}")
        for label, what in (("flash", "FA2"), ("cudnn", "cuDNN")):
            mode = r.get(f"{label}_mode")
            if mode == "enable_gqa":
                notes.append(f"{what}: SDPA enable_gqa=True")
            elif mode == "repeat_interleave":
                why = r.get(f"{label}_errors", {}).get("enable_gqa", "")
                notes.append(f"{what}: K/V heads expanded with repeat_interleave (outside the timing); "
                             f"enable_gqa refused: {why[:90]}")
            elif f"{label}_errors" in r:
                notes.append(f"{what} n/a: " + "; ".join(f"{m}: {e[:100]}" for m, e in r[f"{label}_errors"].items()))
        if r.get("flash_is_fa2") is False:
            notes.append("SDPA flash kernel not FA2!")
        if r.get("tlc_host_us") and r.get("tlc_ms") and r["tlc_host_us"] >= HOST_BOUND * r["tlc_ms"] * 1e3:
            notes.append(f"tlc host {r['tlc_host_us']:.0f} us a call against its {r['tlc_ms'] * 1e3:.0f} us kernel: "
                         "may be host-bound")
        base = by_name.get(r.get("bf16_row", ""))
        if base and r.get("tlc_tflops") and base.get("tlc_tflops"):
            ratio = r["tlc_tflops"] / base["tlc_tflops"]
            r["fp16_over_bf16"] = ratio
            notes.append(f"tlc fp16/bf16 {ratio:.3f} ({'within' if abs(ratio - 1) <= 0.03 else 'OUTSIDE'} 3%)")
        r["notes"] = notes


def _build_key(spec, defines) -> tuple:
    from tlc.runtime import normal_defines
    return str(spec), tuple(sorted(normal_defines(defines).items()))


def _tile_defines(tiles) -> dict:
    """-D bindings for the tiles: BM and BN, and the Warps and Stages schedule options (any spec takes them)."""
    return dict(BM=tiles["bm"], BN=tiles["bn"], Warps=tiles["warps"], Stages=tiles["stages"])


def _warm(args) -> str:
    """Build one row's kernel into the disk cache (a child process: NVRTC runs in parallel)."""
    row, tiles, arch = args
    spec, defines = row_build(row, tiles, arch)
    shape = {k: defines[k] for k in ("BM", "BN", "Warps", "Stages") if k in defines}   # what is built (a schedule
    try:                                                                              # may set its own Stages)
        tlc.build(spec, arch=arch, defines=defines)
        return f"built {row['name']} {shape}"
    except Exception as exc:  # noqa: BLE001 - the timed run reports it again
        return f"build failed {row['name']} {shape}: {exc}"


def _regex(text: str) -> re.Pattern:
    try:
        return re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a regular expression: {exc}") from None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--no-baselines", action="store_true")
    ap.add_argument("--extra", action="store_true", help="also the MLA-prefill and d=256 rows")
    ap.add_argument("--bar", action="store_true",
                    help="issue 12's bar table instead of the README rows: BAR_ROWS (MHA d=64/128/256, GQA 32/8, "
                    "MQA 32/1, MLA prefill, fp16, S=1k and 16k; B·S = 16k)")
    ap.add_argument("--short", action="store_true",
                    help="the short-sequence rows instead (SHORT_ROWS: S=1k and 2k, where sm_90a kernels run persistent)")
    ap.add_argument("--rows", metavar="REGEX", type=_regex, help="only the rows whose name matches (e.g. 'S=1k|d=64 causal')")
    ap.add_argument("--arch", default="sm_90", choices=("sm_90", "sm_90a"),
                    help="tlc's target: sm_90 (mma.sync, the default) or sm_90a (wgmma; tiles get 4 warps per 64 rows)")
    a = ap.parse_args()
    require_cuda("bench/bench_attention.py")
    global ARCH
    ARCH = a.arch
    torch.manual_seed(0)
    from concurrent.futures import ProcessPoolExecutor
    rows = SHORT_ROWS if a.short else BAR_ROWS if a.bar else ROWS + (EXTRA_ROWS if a.extra else [])
    if a.rows:
        rows = [r for r in rows if a.rows.search(r["name"])]
    todo = [(r, row_tiles(r)) for r in rows]
    sweeps = [(r, t) for r in ROWS for t in SWEEP] if a.sweep else []
    sweeps += [(r, t) for r in EXTRA_ROWS for t in WIDE_SWEEP] if a.sweep and a.extra else []
    sweeps = [(r, t) for r, t in sweeps if not a.rows or a.rows.search(r["name"])]
    todo += sweeps
    todo = list({_build_key(*row_build(r, t, ARCH)): (r, t) for r, t in todo}.values())  # one build per kernel
    with ProcessPoolExecutor(max_workers=min(16, len(todo))) as pool:
        for line in pool.map(_warm, [(r, t, ARCH) for r, t in todo]):
            print(line, flush=True)
    dev = torch.cuda.get_device_name()
    report = {"arch": ARCH, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "gpu": dev,
              "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "warmup_ms": WARMUP_MS, "rows": [],
              "sweep": []}
    if a.sweep:
        for row, tiles in sweeps:
            try:
                with watchdog(f"sweep {row['name']} {tiles}"):
                    res, _ = run_row(row, tiles)
                report["sweep"].append(res)
                print(f"sweep {row['name']:18s} {res['config']:58s} {res['tlc_tflops']:6.1f} TFLOP/s "
                      f"regs={res['attributes'].get('registers')} local={res['attributes'].get('local_bytes')} "
                      f"{'PASS' if res['check_passed'] else 'FAIL ' + res['check']}", flush=True)
            except Exception as exc:  # one failing variant must not hide the others
                print(f"sweep {row['name']} {tiles}: ERROR {str(exc)[:300]}", flush=True)
    for row in rows:
        try:
            with watchdog(row["name"]):
                res, qkv = run_row(row, row_tiles(row))
        except Exception as exc:  # noqa: BLE001 - one failing row must not lose the others
            report["rows"].append(dict(row, error=str(exc)[:500], check_passed=False))
            print(f"{row['name']}: ERROR {str(exc)[:300]}", flush=True)
            torch.cuda.empty_cache()
            continue
        if not a.no_baselines:
            with watchdog(f"{row['name']} baselines"):
                run_baselines(row, qkv, res)
        report["rows"].append(res)
        del qkv
        torch.cuda.empty_cache()
    add_notes(report["rows"])
    out_dir = os.environ.get("OUT") or "."
    with open(os.path.join(out_dir, "bench_attention.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
    print(f"\n{dev}, torch {torch.__version__}, cuDNN {report['cudnn']}, tlc for {ARCH}, forward (bf16 unless "
          f"the row says fp16), TFLOP/s (median of do_bench after {WARMUP_MS} ms of warm-up), B·H·S as in the JSON")
    print(f"{'config':24s} {'tlc':>7s} {'SDPA-FA2':>9s} {'cuDNN':>7s} {'tlc/FA2':>8s} {'tlc/cuDNN':>9s}  check  note")
    for r in report["rows"]:
        tl, fa, cu = r.get("tlc_tflops"), r.get("flash_tflops"), r.get("cudnn_tflops")
        tl_s = f"{tl:7.1f}" if tl else f"{'ERROR':>7s}"
        fa_s = f"{fa:9.1f}" if fa else f"{'n/a':>9s}"
        cu_s = f"{cu:7.1f}" if cu else f"{'n/a':>7s}"
        ra = f"{tl / fa:8.2f}" if fa and tl else f"{'':8s}"
        rc = f"{tl / cu:9.3f}" if cu and tl else f"{'':9s}"
        print(f"{r['name']:24s} {tl_s} {fa_s} {cu_s} {ra} {rc}  "
              f"{'PASS' if r.get('check_passed') else 'FAIL'}   {'; '.join(r.get('notes', []))}")
    print("\nkernel                                          regs local  SASS: HMMA HGMMA LDGSTS LDSM LDSM.T LDL STL")
    seen = set()
    for r in report["rows"]:
        if "config" not in r or r["config"] in seen:
            continue
        seen.add(r["config"])
        s, at = r.get("sass", {}), r["attributes"]
        print(f"{r['config']:48s} {at.get('registers', '?'):>4} {at.get('local_bytes', '?'):>5}        "
              f"{s.get('HMMA', 0):4d} {s.get('HGMMA', 0):5d} {s.get('LDGSTS', 0):6d} {s.get('LDSM', 0):4d} {s.get('LDSM.T', 0):6d} "
              f"{s.get('LDL', 0):3d} {s.get('STL', 0):3d}")
    return 0 if all(r.get("check_passed") for r in report["rows"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
