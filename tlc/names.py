"""Kernel names from the user's file names: a valid C++ identifier, whatever the file is called."""
from __future__ import annotations

import re
from pathlib import Path


def kernel_name(path: str | Path) -> str:
    """`my-attn.tl` → `my_attn`, `2attn.tl` → `k_2attn`; `tl_kernel` when nothing is left."""
    stem = Path(str(path)).stem if str(path) not in ("", "<input>", "<text>") else ""
    name = re.sub(r"[^A-Za-z0-9_]", "_", stem.encode("ascii", "replace").decode()).strip("_")
    if not name:
        return "tl_kernel"
    return f"k_{name}" if name[0].isdigit() else name
