"""The sm_90a program that once hung an H200 on its first launch: 256-row query tiles (four consumer warp
groups, 640 threads), 32-row key tiles, a 4-stage ring, one KV head, d = 64. Its consumers asked setmaxnreg
for more registers than the block starts with; now the split fits the pool (tlc.kir.ops_sm90.entry_registers).
Runs it against the interpreter of the program as written at 1×1 and odd sizes (tests/gpu/differential.py):

    timeout 120 python3 bench/hang_case.py       # on the GPU machine; a hang is the timeout's exit 124
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import require_cuda  # noqa: E402
from tests.gpu.differential import run_case  # noqa: E402

TEXT = ((ROOT / "specs" / "mha_fwd.tl").read_text().replace("with offset head_idx / group", "with offset 0")
        + "Param Stages = 4\n")
DEFINES = {"BM": "256", "BN": "32", "HeadDim": "64"}


def source(case: str):
    return TEXT.encode(), "hang_case.tl", dict(DEFINES, Causal=str(case == "causal").lower())


def main() -> None:
    require_cuda("bench/hang_case.py")
    for case in ("plain", "causal"):
        for sq, sk in ((1, 1), (17, 33), (333, 77), (77, 333)):
            run_case(case, source, "sm_90a", sq, sk, B=1, H=2, Hkv=1)
            print(f"{case} {sq}x{sk}: ok", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("TLC_QUIET", "1")
    main()
