"""Where each tile's time goes: the phases of one bench row's kernel, from the `trace-phases` stamps.

    python3 bench/timeline.py 'MHA d=128 S=1k$' [--arch sm_90a] [--trips] [--json FILE]

Builds the BAR_ROWS row's kernel (bench/bench_attention.py; TLC_BENCH_DEFINES applies) with
`-D Trace=true`, runs it three times untimed, clears the trace buffer, runs it once more, and reads
back each warp group's stamps: (SM, SM clock) at the boundaries `trace-phases` lists. Reports, over
the CTAs (median and 10th / 90th percentiles, in µs at the clock measured against the launch's CUDA
events):
- each phase of the consumers and the producer (start → Q arrived → first GEMM and softmax → the
  loops → the epilogue → end),
- the span of each unit (a CTA; in a persistent kernel one turn of its loop over tiles) from its
  first stamp to its last, and the gap on its SM before the next unit's first stamp (negative where
  a persistent kernel's producer starts the next tile before the consumers end this one),
- how much of each SM's time a unit covered.
The stamps cost a few instructions each, so compare phases, not the traced kernel's total speed.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import tlc  # noqa: E402
from bench import bench_attention as ba  # noqa: E402
from bench import require_cuda  # noqa: E402
from tlc.kir.ops import TimestampOp, TraceBufferOp, walk  # noqa: E402

_CLOCK_MASK = (1 << 56) - 1
TIMED = 10


def _trace_layout(kern) -> tuple[str, int, int, dict[int, str]]:
    program = kern.compiled.program
    buffer = next(op for op in program.body if isinstance(op, TraceBufferOp))
    stamps = [op for op in walk(program) if isinstance(op, TimestampOp)]
    if not stamps:
        sys.exit("timeline: the kernel has no stamps (trace-phases declined it; see `tlc show --emit kir`)")
    labels = {op.slot: op.label for op in stamps}
    starts = sorted(labels) + [stamps[0].slots]
    for op in stamps:   # a trip stamp (TraceTrips) covers the slots up to the next stamp's
        if op.slot_offset is not None:
            end = next(s for s in starts if s > op.slot)
            labels.update({op.slot + j: f"{op.label}{j}" for j in range(end - op.slot)})
    return buffer.name, buffer.entries, stamps[0].slots, labels


def _device_buffer(kern, name: str):
    from cuda.bindings import driver
    loaded = kern._module(torch.cuda.current_device())
    err, ptr, size = driver.cuModuleGetGlobal(loaded.module, name.encode())
    if err != driver.CUresult.CUDA_SUCCESS:
        sys.exit(f"timeline: cuModuleGetGlobal({name}) failed: {err}")
    return driver, ptr, size


def _ok(driver, result, what: str) -> None:
    if result[0] != driver.CUresult.CUDA_SUCCESS:
        sys.exit(f"timeline: {what} failed: {result[0]}")


def _percentiles(values) -> dict:
    a = np.asarray(values, dtype=np.float64)
    if a.size == 0:
        return {"n": 0}
    return {"n": int(a.size), "p10": float(np.percentile(a, 10)), "median": float(np.median(a)),
            "p90": float(np.percentile(a, 90))}


def analyse(raw: np.ndarray, slots: int, labels: dict[int, str], ctas: int, groups: int, mhz: float) -> dict:
    """Phases per warp-group role and per CTA, in µs."""
    stamps = raw[: ctas * groups * slots].reshape(ctas, groups, slots)
    sm = (stamps >> np.uint64(56)).astype(np.int64)
    clk = (stamps & np.uint64(_CLOCK_MASK)).astype(np.int64)
    seen = stamps != 0
    us = 1.0 / mhz
    phases: dict[str, list[float]] = defaultdict(list)
    spans, per_sm = [], defaultdict(list)
    for c in range(ctas):
        if not seen[c].any():
            continue
        first, last = clk[c][seen[c]].min(), clk[c][seen[c]].max()
        spans.append((last - first) * us)
        per_sm[int(sm[c][seen[c]][0])].append((first, last))
        for g in range(groups):
            got = [(s, clk[c, g, s]) for s in range(slots) if seen[c, g, s]]
            for (s0, t0), (s1, t1) in zip(got, got[1:]):
                phases[f"{labels[s0]} -> {labels[s1]}"].append((t1 - t0) * us)
    gaps, resident = [], []
    for runs in per_sm.values():
        runs.sort()
        gaps += [(b[0] - a[1]) * us for a, b in zip(runs, runs[1:])]
        busy = sum(b - a for a, b in runs)
        resident.append(busy / max(1, runs[-1][1] - runs[0][0]))
    return {"phases": {k: _percentiles(v) for k, v in phases.items()},
            "cta_span_us": _percentiles(spans), "sm_gap_us": _percentiles(gaps),
            "sm_resident_fraction": _percentiles(resident), "ctas_traced": len(spans), "sms": len(per_sm)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("row", help="a regex matching one BAR_ROWS name")
    ap.add_argument("--arch", choices=("sm_90", "sm_90a"), default="sm_90a")
    ap.add_argument("--json", help="write the analysis here")
    ap.add_argument("--trips", action="store_true", help="also stamp the first trips of each loop (TraceTrips)")
    a = ap.parse_args()
    rows = [r for r in ba.BAR_ROWS if re.search(a.row, r["name"])]
    if len(rows) != 1:
        sys.exit(f"timeline: {a.row!r} matches {len(rows)} rows ({[r['name'] for r in rows]}); name exactly one")
    require_cuda("bench/timeline.py")
    row = rows[0]
    B, H, S, d = row["B"], row["H"], row["S"], row["d"]
    dv, hkv = row.get("d_v", d), row.get("Hkv", H)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[row.get("dtype", "bf16")]
    torch.manual_seed(0)
    q = torch.randn(B, H, S, d, device="cuda", dtype=dtype)
    k = torch.randn(B, hkv, S, d, device="cuda", dtype=dtype)
    v = torch.randn(B, hkv, S, dv, device="cuda", dtype=dtype)
    spec, defines = ba.row_build(row, ba.row_tiles(row, a.arch), a.arch)
    defines = dict(defines, Trace="true", **({"TraceTrips": "true"} if a.trips else {}))
    kern = tlc.build(spec, arch=a.arch, defines=defines)
    out = torch.empty(B, H, S, dv, device="cuda", dtype=dtype)
    for _ in range(3):
        kern(q, k, v, out=out)
    name, entries, slots, labels = _trace_layout(kern)
    driver, ptr, size = _device_buffer(kern, name)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(TIMED):   # back to back, so the GPU never waits on the host: the clock's calibration
        kern(q, k, v, out=out)
    stop.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(stop) / TIMED
    _ok(driver, driver.cuMemsetD8(ptr, 0, size), "cuMemsetD8")
    kern(q, k, v, out=out)
    torch.cuda.synchronize()
    raw = np.zeros(entries, dtype=np.uint64)
    _ok(driver, driver.cuMemcpyDtoH(raw.ctypes.data, ptr, raw.nbytes), "cuMemcpyDtoH")
    groups = -(-kern.kernel.threads // 128)
    written = np.flatnonzero(raw)
    if written.size == 0:
        sys.exit("timeline: the kernel wrote no stamps")
    ctas = int(written[-1]) // (groups * slots) + 1
    stamps = raw[: ctas * groups * slots].reshape(ctas, groups, slots)
    clk = (stamps & np.uint64(_CLOCK_MASK)).astype(np.int64)
    sm = (stamps >> np.uint64(56)).astype(np.int64)
    seen = stamps != 0
    cycles = np.median([clk[(sm == s) & seen].max() - clk[(sm == s) & seen].min() for s in np.unique(sm[seen])])
    mhz = cycles / (ms * 1e3)
    result = analyse(raw, slots, labels, ctas, groups, mhz)
    result.update(row=row["name"], spec=spec.name, defines=defines, kernel_ms=ms, clock_mhz=mhz, ctas=ctas,
                  warp_groups=groups, device=torch.cuda.get_device_name())
    print(f"timeline: {row['name']}  {spec.name} {defines}  traced run {ms * 1e3:.1f} µs, "
          f"{result['ctas_traced']} CTAs on {result['sms']} SMs, clock ≈ {mhz:.0f} MHz")
    print(f"{'phase (µs)':58s} {'p10':>7s} {'median':>7s} {'p90':>7s} {'n':>7s}")
    totals = [("unit span (a CTA; a tile's turn when persistent)", result["cta_span_us"]),
              ("gap before the SM's next unit (< 0: overlapped)", result["sm_gap_us"]),
              ("SM covered by a unit (fraction of its span)", result["sm_resident_fraction"])]
    for key, p in list(result["phases"].items()) + totals:
        if p.get("n"):
            print(f"{key:58s} {p['p10']:7.2f} {p['median']:7.2f} {p['p90']:7.2f} {p['n']:7d}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
