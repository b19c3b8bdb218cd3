"""Kernel names from the user's file names: a valid C++ identifier, whatever the file is called.

The name becomes an `extern "C"` kernel at the generated file's global scope, so it must not be a
keyword, a reserved identifier, or a name the file's headers already put there.
"""
from __future__ import annotations

import re
import unicodedata
from pathlib import Path

# Global names of the generated .cu (namespaces, CUDA built-ins, the INFINITY macro) and C++/CUDA
# keywords the kernel IR's own keyword list does not cover.
_TAKEN = frozenset(
    "tlc cute cutlass std main threadIdx blockIdx blockDim gridDim warpSize INFINITY NULL "
    "char8_t char16_t char32_t concept consteval constinit co_await co_return co_yield const_cast "
    "dynamic_cast export reinterpret_cast requires static_assert static_cast thread_local typeid "
    "wchar_t xor xor_eq bitand bitor compl not_eq or_eq and_eq".split())


def kernel_name(path: str | Path) -> str:
    """`my-attn.tl` → `my_attn`, `2attn.tl` → `k_2attn`, `ünï.tl` → `uni`, `int.tl` → `k_int`;
    `tl_kernel` when nothing is left. The artifacts keep the user's stem; only the kernel is renamed."""
    from tlc.kir.expr import CPP_KEYWORDS

    stem = Path(str(path)).stem if str(path) not in ("", "<input>", "<text>") else ""
    ascii_stem = unicodedata.normalize("NFKD", stem).encode("ascii", "ignore").decode()
    # `__` anywhere and a leading `_` are reserved at global scope: one `_` between words only.
    name = re.sub(r"_+", "_", re.sub(r"[^A-Za-z0-9_]", "_", ascii_stem)).strip("_")
    if not name:
        return "tl_kernel"
    if name[0].isdigit() or name in CPP_KEYWORDS or name in _TAKEN:
        return f"k_{name}"
    return name
