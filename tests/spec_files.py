"""The shipped specs, and those of one kernel: a program of several (`Kernel NAME` lines, specs/split_kv_fwd.tl)
goes through the one-kernel entry points kernel by kernel, and is checked whole by tests/frontend/test_kernels.py
and tests/lowering/test_split_kv_module.py."""
from __future__ import annotations

from pathlib import Path

from tlc.api import kernel_names

ROOT = Path(__file__).resolve().parents[1]
SPECS = sorted((ROOT / "specs").glob("*.tl"))


def one_kernel(paths) -> list[Path]:
    return [p for p in paths if not kernel_names(p.read_bytes(), str(p))]


ONE_KERNEL_SPECS = one_kernel(SPECS)
