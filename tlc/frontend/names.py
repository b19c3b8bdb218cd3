"""Which TL identifiers may reach generated C++ and which names are built in.

Every name in a `.tl` file is checked here before it becomes part of the IR, so the
emitter can print IR names without quoting worries.
"""
from __future__ import annotations

import difflib
import re

BUILTINS = {
    "block_idx": "index of the query tile this thread block computes",
    "head_idx": "query head index",
    "batch_idx": "batch index",
    "group": "query heads per KV head (num_heads / num_kv_heads)",
}
# Positions a mask predicate reads per score (`Compute Mask S where kv_idx > q_idx`); no other
# expression has them, and no Param, Input or loop variable may take their names.
MASK_POSITIONS = {
    "q_idx": "the global query row of a score",
    "kv_idx": "the global key column of a score",
}

CPP_KEYWORDS = frozenset("""
alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t char32_t class
compl concept const consteval constexpr constinit const_cast continue co_await co_return co_yield decltype
default delete do double dynamic_cast else enum explicit export extern false float for friend goto if inline
int long mutable namespace new noexcept not not_eq nullptr operator or or_eq private protected public register
reinterpret_cast requires return short signed sizeof static static_assert static_cast struct switch template
this thread_local throw true try typedef typeid typename union unsigned using virtual void volatile wchar_t
while xor xor_eq cute cutlass std threadIdx blockIdx blockDim gridDim warpSize half float2 int4 uint4
""".split())

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_IDENT = 64


def identifier_problem(name: str) -> str | None:
    """Why `name` cannot be used as an identifier in generated C++, or None if it can."""
    if not _IDENT.match(name):
        return f"'{name}' is not an identifier (letters, digits and '_', not starting with a digit)"
    if len(name) > MAX_IDENT:
        return f"'{name[:20]}…' is {len(name)} characters long; keep names at most {MAX_IDENT}"
    if name.startswith("__") or (name.startswith("_") and len(name) > 1 and name[1].isupper()):
        return f"'{name}' is reserved in C++ (leading '__' or '_' + capital); rename it"
    if "__" in name:
        return f"'{name}' contains '__', which C++ reserves; rename it"
    if name in CPP_KEYWORDS:
        return f"'{name}' is a C++ keyword or a name the generated code uses; rename it"
    return None


def operation_names(*, aliases: bool = True) -> list[str]:
    """Every operation a `Compute` line may name, as the docs spell them (`Sub` and `Mul`
    are aliases of `Subtract` and `Multiply`)."""
    from tlc.ir.ops import ELEMENTWISE  # the elementwise table lives with its op

    seen: set[str] = set()
    out = ["GEMM", "Softmax", "Mask"]
    for spelling, (fn, _) in ELEMENTWISE.items():
        if aliases or fn not in seen:
            out.append(spelling.capitalize())
        seen.add(fn)
    return out


def unknown_operation(op: str) -> str | None:
    """`unknown operation 'Sofmax'; did you mean 'Softmax'?`, or None if `op` is known."""
    by_lower = {n.lower(): n for n in operation_names()}
    if op.lower() in by_lower:
        return None
    close = difflib.get_close_matches(op.lower(), list(by_lower), n=1, cutoff=0.6)
    hint = f"; did you mean '{by_lower[close[0]]}'?" if close else ""
    return f"unknown operation '{op}'{hint} (the operations are {', '.join(operation_names(aliases=False))})"
