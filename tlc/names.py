"""Names tlc makes up: kernel names from the user's file names, and fresh names for new values and
C++ identifiers that collide with no name already taken.

A kernel name becomes an `extern "C"` kernel at the generated file's global scope, so it must not be a
keyword, a reserved identifier, or a name the file's headers already put there.
"""
from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from tlc.ir.graph import Graph

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


class FreshNames:
    """Names nothing has taken: `base` itself when free (and `bare`), else `base<sep>k` for the smallest
    free k from `first` on. Every name given out, and every name in `taken`, is taken from then on.

    The TL graph numbers a name's versions with "." (`S`, `S.1`, `S.2`): TL identifiers have no dots, so
    a version never collides with a name the user wrote. Kernel-IR names become C++ identifiers and are
    numbered with "_". `first` and `bare` keep each pass's spelling: the lowering's `S_1` follows `S`,
    split-masked-trips' `n_masked_from_2` follows `n_masked_from`, a reshape's result is always numbered."""

    def __init__(self, taken: Iterable[str] = (), *, sep: str = "_", first: int = 1, bare: bool = True) -> None:
        self.taken: set[str] = set(taken)
        self.sep, self.first, self.bare = sep, first, bare

    def fresh(self, base: str) -> str:
        name, k = (base, self.first - 1) if self.bare else (f"{base}{self.sep}{self.first}", self.first)
        while name in self.taken:
            k += 1
            name = f"{base}{self.sep}{k}"
        self.taken.add(name)
        return name


def fresh_value_name(graph: Graph, base: str, taken: set[str] | None = None, *, bare: bool = True) -> str:
    """A name for a new TL value: `base` or `base.k` (`FreshNames`) that no value of `graph` has (results
    and loop arguments, nested regions included) nor `taken`; the name is added to `taken`, so values
    not yet in the graph never collide."""
    from tlc.ir.ops import LoopOp

    used = {r.name for _, op in graph.walk() for r in op.results}
    used |= {a.name for _, op in graph.walk() if isinstance(op, LoopOp) for a in op.args}
    name = FreshNames(used | (taken or set()), sep=".", bare=bare).fresh(base)
    if taken is not None:
        taken.add(name)
    return name
