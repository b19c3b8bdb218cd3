"""Benchmarks and GPU probes (not tests): each prints a table last and writes JSON under $OUT."""
from __future__ import annotations

import sys


def require_cuda(script: str) -> None:
    """Exit with one line, not a traceback, where no CUDA GPU is visible."""
    import torch

    if not torch.cuda.is_available():
        sys.exit(f"{script}: needs a CUDA GPU (torch sees none); run it on the GPU machine (bench/README.md)")


def median_block_us(fn, calls: int, blocks: int = 5, sync=lambda: None) -> float:
    """µs per call of `fn`: `blocks` blocks of `calls` calls, each ended by `sync()` (e.g. torch.cuda.synchronize),
    the median block (one block on the device machine's host ranged 105-171 µs for the same call, 2026-11-27)."""
    return median_block_host_wall_us(fn, calls, blocks, sync)[1]


def median_block_host_wall_us(fn, calls: int, blocks: int = 5, sync=lambda: None) -> tuple[float, float]:
    """(host, wall) µs per call of `fn`, each the median over `blocks` blocks of `calls` calls: host is the calls
    alone, wall adds the `sync()` that ends each block (on a GPU: above host when the GPU takes longer per call)."""
    import statistics
    import time

    host, wall = [], []
    for _ in range(blocks):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        issued = time.perf_counter()
        sync()
        host.append((issued - start) / calls * 1e6)
        wall.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(host), statistics.median(wall)


class watchdog:
    """`with watchdog("MHA d=64 causal"):` — a kernel that hangs would stall the whole call with no word
    of which one; past `env` seconds (TLC_BENCH_TIMEOUT, 240; 0: no limit) this prints one line naming
    `label`, flushes what the script printed, and ends the process (exit status 3). `before` runs first
    (pytest's capture suspended, so the line reaches the terminal)."""

    def __init__(self, label: str, env: str = "TLC_BENCH_TIMEOUT", default: float = 240, before=None) -> None:
        import os

        raw = os.environ.get(env, f"{default:g}")
        try:
            self.limit = float(raw or 0)
        except ValueError:
            raise SystemExit(f"{env}={raw!r}: write seconds, e.g. {default:g} (0: no limit)") from None
        self.label, self.env, self.before, self.timer = label, env, before, None

    def _stalled(self) -> None:
        import os

        if self.before is not None:
            self.before()
        sys.stdout.flush()
        sys.stderr.write(f"\n{self.label}: still running after {self.limit:g} s (a kernel that hangs?); "
                         f"stopping ({self.env} sets the limit)\n")
        sys.stderr.flush()
        os._exit(3)

    def __enter__(self) -> "watchdog":
        import threading

        if self.limit > 0:
            self.timer = threading.Timer(self.limit, self._stalled)
            self.timer.daemon = True
            self.timer.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.timer is not None:
            self.timer.cancel()
