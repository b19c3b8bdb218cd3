"""Odd-size launches of the kernels of the newer spec constructs — predicate masks (sliding window, documents),
tensor Inputs and per-sequence row extents, rows gathered through a block table, row-vector and reduce-stores, a kernel without GEMMs, a program of several kernels — each checked against the TL
interpreter (tests/gpu/differential.py), for compute-sanitizer:

    compute-sanitizer --tool memcheck --report-api-errors no python3 bench/sanitize_specs.py --arch sm_90a
    python3 bench/sanitize_specs.py --arch sm_90a --build-only     # fill the cache first (NVRTC, in parallel)

The interpreter runs on the CPU; the GPU runs tlc's kernels and torch's fills of the poisoned outputs.
"""
from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

ARCH = sys.argv[sys.argv.index("--arch") + 1] if "--arch" in sys.argv else "sm_90"
if ARCH not in ("sm_90", "sm_90a"):
    sys.exit(f"bench/sanitize_specs.py: --arch is sm_90 or sm_90a, not {ARCH}")
if ARCH == "sm_90":
    from tests.gpu.test_tl_specs_gpu import CASES, source  # noqa: E402
    NAMES = ["sliding_window64", "documents64_causal_br", "kv_lengths64_causal", "lse64_causal_br",
             "group_sum64_causal", "merge64", "split_kv64", "paged64", "paged_decode64_causal"]
else:
    from tests.gpu.test_sm90a_specs_gpu import CASES, source  # noqa: E402
    NAMES = ["sliding_window128", "documents128_causal", "kv_lengths128_causal", "lse64_bm192_causal_br",
             "group_sum128_causal", "merge128", "split_kv128_bm128", "paged128", "decode128_causal"]
from tests.gpu import differential  # noqa: E402

SIZES = [(17, 33), (333, 77)]   # (seqlen_q, seqlen_k): partial tiles, q shorter and longer than k


def _build(name: str) -> str:
    data, path, defines = source(name)
    import tlc
    tlc.build(data.decode(), arch=ARCH, defines=defines)
    return name


if "--build-only" in sys.argv:
    from concurrent.futures import ProcessPoolExecutor
    with ProcessPoolExecutor(len(NAMES)) as pool:
        print(*pool.map(_build, NAMES))
    sys.exit(0)
for name in NAMES:
    assert name in CASES, name
    for sq, sk in SIZES:
        differential.run_case(name, source, ARCH, sq, sk, B=2, H=4, Hkv=2)
        print(f"{ARCH} {name} {sq}x{sk}: equals the interpreter")
