"""A few odd-size launches of kernels built from the shipped `.tl` specs, for compute-sanitizer:

    compute-sanitizer --tool memcheck --report-api-errors no python3 bench/sanitize_one.py [--arch sm_90a]
    compute-sanitizer --tool racecheck --report-api-errors no python3 bench/sanitize_one.py [--arch sm_90a]

The inputs are drawn and the references computed on the CPU, so the only GPU kernels under the tool are tlc's
(and, for a persistent kernel, the zeroing of its tile counter): a clean run reads 0 errors and 0 hazards.
`--arch sm_90a`: the kernels tlc.attention runs on Hopper (warp-specialised TMA ring, overlapped wgmma,
ping-pong), with a 3-stage ring case and one of 400 tiles (several per CTA of a persistent kernel) besides.
Each case builds what tlc.attention runs for its key length (on sm_90a the cases' short keys take the
persistent kernels); `-D NAME=VALUE` (repeatable) binds a schedule knob on every case, e.g.
`-D Persistent=false` for the one-tile-per-CTA kernels.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import tlc  # noqa: E402
from bench import require_cuda  # noqa: E402
from tlc.attention.kernels import attention_spec  # noqa: E402
from tlc.testing_tolerance import check_attention  # noqa: E402

# (head dim, causal, alignment, stages, B, Hq, Hkv, Sq, Sk): odd lengths, GQA, both alignments, 1 and 2 stages, padding
CASES = [(128, True, "bottom_right", 2, 1, 2, 1, 77, 333), (64, False, "top_left", 2, 1, 2, 2, 1000, 17),
         (128, True, "top_left", 1, 1, 2, 1, 333, 77), (40, True, "top_left", 2, 1, 4, 2, 130, 200)]
ARCH = sys.argv[sys.argv.index("--arch") + 1] if "--arch" in sys.argv else "sm_90"
if ARCH == "sm_90a":
    CASES += [(128, False, "top_left", 3, 2, 4, 2, 1000, 1000), (128, True, "top_left", 2, 2, 40, 8, 555, 555),
              (64, True, "top_left", 2, 1, 2, 1, 1000, 1000)]   # 192-row tiles from the end: the first is partial
_D = [sys.argv[i + 1] for i, a in enumerate(sys.argv[:-1]) if a == "-D"]
if any("=" not in d for d in _D) or sys.argv[-1] == "-D":
    sys.exit("bench/sanitize_one.py: -D takes NAME=VALUE, e.g. -D Persistent=true")
DEFINES = dict(d.split("=", 1) for d in _D)


def defines_of(case) -> tuple:
    """The spec and -D bindings tlc.attention builds for the case's head dim and key length (short keys:
    persistent on sm_90a, tlc.attention.tuning.short_keys), with its alignment, stages and the -D bindings."""
    d, causal, align, stages, *_, sk = case
    spec, defines = attention_spec("bf16", d, d, causal, arch=ARCH, seq_k=sk)
    return spec, dict(defines, Align=align, Stages=stages, **DEFINES)


def warm(case) -> None:
    spec, defines = defines_of(case)
    tlc.build(spec, arch=ARCH, defines=defines)   # the kernel stays in the disk cache; nothing is sent back


if "--build-only" in sys.argv:   # fill the cache in parallel first (NVRTC), outside the sanitizer
    from concurrent.futures import ProcessPoolExecutor
    with ProcessPoolExecutor(len(CASES)) as pool:
        list(pool.map(warm, CASES))
    sys.exit(0)
require_cuda("bench/sanitize_one.py")
for case in CASES:
    d, causal, align, stages, B, Hq, Hkv, Sq, Sk = case
    spec, defines = defines_of(case)
    kern = tlc.build(spec, arch=ARCH, defines=defines)
    # Inputs and references live on the CPU (float32 / bf16 matmuls there): only tlc's kernels run on the GPU,
    # so a sanitizer's report is about them, not about cuBLAS's reference matmuls.
    q = torch.randn(B, Hq, Sq, d, dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, Sk, d, dtype=torch.bfloat16)
    v = torch.randn(B, Hkv, Sk, d, dtype=torch.bfloat16)
    o = kern(q.cuda(), k.cuda(), v.cuda()).cpu()   # .cpu() waits for the kernel
    how = "persistent" if str(defines.get("Persistent")).lower() == "true" else "one tile per CTA"
    print(f"{ARCH} d={d} causal={causal} {align} stages={stages} {Sq}x{Sk} ({how}):",
          check_attention(o, q, k, v, causal=causal, alignment=align))
