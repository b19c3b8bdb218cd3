"""SM clock, power and the driver's clock-event reasons while one bar row's tlc kernel runs back to back for a
few seconds, row after row, alternating: whether a row's lower TFLOP/s comes from the kernel's cycles or from
the clock the GPU runs it at (fp16 against bf16 at d = 128 on the H200: the same SASS, fewer TFLOP/s).

    python3 bench/clock_probe.py [--rows 'MHA d=128( fp16)?$'] [--seconds 2] [--rounds 2] [--arch sm_90a]

Per row and round: ms per launch (CUDA events over the steady part, after 0.5 s), the median SM clock and
power of nvidia-smi's samples (every 50 ms) in that window, the clock-event reasons it reported; for an fp16
row, per round, its time and clock against its bf16 row's (time x clock ratio 1 when the clock explains the time).
The first row runs once untimed before the rounds.
Prints a table last; writes $OUT/clock_probe.json when OUT is set. Clocks are only read, never set.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import tlc  # noqa: E402
from bench import require_cuda  # noqa: E402
from bench.bench_attention import BAR_ROWS, flops, row_build, row_tiles  # noqa: E402

STEADY_AFTER_S = 0.5
# nvmlClocksEventReasons bits (clocks_event_reasons.active)
REASONS = {0x1: "idle", 0x2: "app clocks", 0x4: "sw power cap", 0x8: "hw slowdown", 0x10: "sync boost",
           0x20: "sw thermal", 0x40: "hw thermal", 0x80: "hw power brake", 0x100: "display clock"}


class Sampler:
    """nvidia-smi every 50 ms in the background: (receipt time, SM MHz, W, °C, reasons bitmask)."""

    def __init__(self) -> None:
        fields = None
        for reasons in ("clocks_event_reasons.active", "clocks_throttle_reasons.active"):
            query = f"--query-gpu=clocks.sm,power.draw,temperature.gpu,{reasons}"
            try:
                probe = subprocess.run(["nvidia-smi", query, "--format=csv,noheader,nounits"], capture_output=True)
            except OSError as exc:
                sys.exit(f"clock_probe: cannot run nvidia-smi ({exc.strerror or exc}): it reads the clocks")
            if probe.returncode == 0:
                fields = query
                break
        if fields is None:
            sys.exit("clock_probe: nvidia-smi cannot report the SM clock and clock-event reasons here")
        self.samples: list[tuple[float, float, float, float, int]] = []
        self._proc = subprocess.Popen(["nvidia-smi", fields, "--format=csv,noheader,nounits", "-lms", "50"],
                                      stdout=subprocess.PIPE, text=True, bufsize=1)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self._proc.stdout:
            try:
                mhz, watts, celsius, reasons = (x.strip() for x in line.split(","))
                self.samples.append((time.monotonic(), float(mhz), float(watts), float(celsius), int(reasons, 16)))
            except ValueError:
                continue

    def window(self, start: float, end: float) -> list[tuple]:
        return [s for s in self.samples if start <= s[0] <= end]

    def stop(self) -> None:
        self._proc.terminate()


def run_row(row, arch: str, seconds: float, sampler: Sampler) -> dict:
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[row.get("dtype", "bf16")]
    B, H, S, d, dv, hkv = row["B"], row["H"], row["S"], row["d"], row.get("d_v", row["d"]), row.get("Hkv", row["H"])
    spec, defines = row_build(row, row_tiles(row, arch), arch)
    kern = tlc.build(spec, arch=arch, defines=defines)
    q = torch.randn(B, H, S, d, device="cuda", dtype=dtype)
    k = torch.randn(B, hkv, S, d, device="cuda", dtype=dtype)
    v = torch.randn(B, hkv, S, dv, device="cuda", dtype=dtype)
    out = torch.empty(B, H, S, dv, device="cuda", dtype=dtype)
    begin, launches = time.monotonic(), 0
    start_event, end_event = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    steady_from = None
    while time.monotonic() - begin < seconds:
        for _ in range(8):   # a short queue: the host never runs far ahead of the GPU
            kern(q, k, v, out=out)
            launches += steady_from is not None
        torch.cuda.synchronize()
        if steady_from is None and time.monotonic() - begin >= STEADY_AFTER_S:
            steady_from = time.monotonic()
            start_event.record()
    end_event.record()
    torch.cuda.synchronize()
    steady_to = time.monotonic()
    ms = start_event.elapsed_time(end_event) / max(1, launches)
    samples = sampler.window(steady_from, steady_to)
    reasons = 0
    for s in samples:
        reasons |= s[4]
    return dict(name=row["name"], ms=ms, tflops=flops(B, H, S, d, row["causal"], dv) / ms / 1e9, launches=launches,
                samples=len(samples), mhz=statistics.median(s[1] for s in samples) if samples else None,
                watts=statistics.median(s[2] for s in samples) if samples else None,
                max_celsius=max((s[3] for s in samples), default=None),
                reasons=[name for bit, name in REASONS.items() if reasons & bit])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=r"MHA d=128( fp16)?$", help="regex over the --bar rows' names")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--arch", default="sm_90a")
    a = ap.parse_args()
    require_cuda("bench/clock_probe.py")
    try:
        rows = [r for r in BAR_ROWS if re.search(a.rows, r["name"])]
    except re.error as exc:
        sys.exit(f"clock_probe: --rows {a.rows!r} is not a regular expression: {exc}")
    if not rows:
        sys.exit(f"clock_probe: no --bar row matches {a.rows!r}")
    sampler = Sampler()
    results = []
    try:
        run_row(rows[0], a.arch, a.seconds, sampler)   # untimed: the process's first kernels ran slower (2026-11-27)
        for round_ in range(a.rounds):
            for row in rows:
                results.append(dict(run_row(row, a.arch, a.seconds, sampler), round=round_ + 1))
    finally:
        sampler.stop()
    print(f"{'row':<24}{'round':>6}{'ms':>9}{'TFLOP/s':>9}{'MHz':>7}{'W':>7}{'°C max':>7}  reasons")
    for r in results:
        print(f"{r['name']:<24}{r['round']:>6}{r['ms']:>9.4f}{r['tflops']:>9.1f}{r['mhz'] or 0:>7.0f}"
              f"{r['watts'] or 0:>7.0f}{r['max_celsius'] or 0:>7.0f}  {', '.join(r['reasons']) or '-'}")
    by_round = {(r["name"], r["round"]): r for r in results}
    for row in rows:
        base = row.get("bf16_row")
        for round_ in range(1, a.rounds + 1):   # per round: rows of one round ran next to each other
            mine, theirs = by_round[(row["name"], round_)], by_round.get((base, round_))
            if theirs is None or not (mine["mhz"] and theirs["mhz"]):
                continue
            t, c = mine["ms"] / theirs["ms"], mine["mhz"] / theirs["mhz"]
            print(f"{row['name']}, round {round_}: {t:.3f}x the time of {base} at {c:.3f}x its clock "
                  f"(time x clock {t * c:.3f}: 1.000 when the clock explains the time)")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "clock_probe.json"), "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "arch": a.arch, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
