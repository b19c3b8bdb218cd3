"""Two forked processes started together (a shared barrier) that each put one result: the harness
of the cache-lock tests, with a fake NVRTC (tests/unit) and the real one (tests/nvrtc)."""
from __future__ import annotations

import multiprocessing

FORK = multiprocessing.get_context("fork")  # children inherit the program and patch their own module


def race(target, *args, timeout: float) -> list:
    """Run `target(*args, barrier, results)` in two processes; their results, in arrival order."""
    barrier, results = FORK.Barrier(2), FORK.Queue()
    procs = [FORK.Process(target=target, args=(*args, barrier, results)) for _ in range(2)]
    for p in procs:
        p.start()
    got = [results.get(timeout=timeout) for _ in procs]
    for p in procs:
        p.join(60)
    return got
