"""Types and SSA values of the TL graph.

A `TileType` keeps shapes symbolic (`BM`, `HeadDim`) so passes reason about intent,
not numbers; `role` is the fragment layout a register tile is in (accumulator, A or B
operand) — the thing a Reshape changes and the paper's most common LLM bug breaks.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from tlc.expr import Expr

SPACES = ("global", "shared", "register")
ROLES = ("none", "acc", "A", "B")
# The one table of element types: every spelling the frontend accepts → its canonical
# name. Only the frontend reads aliases; every later layer sees bf16, fp16 or fp32.
DTYPES = {"bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "f16": "fp16", "half": "fp16", "float16": "fp16",
          "fp32": "fp32", "f32": "fp32", "float": "fp32", "float32": "fp32"}
MEMORY_DTYPES = ("bf16", "fp16")  # what `Param dtype` may be: global/shared tiles; fp32 is for accumulators


def canonical_dtype(name: object) -> str | None:
    """`half` → `fp16`; None if `name` is no element type."""
    return DTYPES.get(name) if isinstance(name, str) else None


def dtype_spellings(canonical: tuple[str, ...] | None = None) -> str:
    """`bf16 (bfloat16), fp16 (f16, half, float16), …` for diagnostics."""
    out = []
    for canon in canonical or dict.fromkeys(DTYPES.values()):
        aliases = [k for k, v in DTYPES.items() if v == canon and k != canon]
        out.append(f"{canon} ({', '.join(aliases)})" if aliases else canon)
    return ", ".join(out)
MMA_ROLE = {"MMA_C": "acc", "MMA_A": "A", "MMA_B": "B"}


@dataclass(frozen=True)
class TileType:
    """A tile (or a row vector, or a scalar when `space == "scalar"`)."""

    space: str
    shape: tuple[Expr, ...] | None = None  # None: not inferred yet
    dtype: str | None = None
    role: str = "none"

    def with_(self, **kw) -> "TileType":
        return replace(self, **kw)

    def __str__(self) -> str:
        if self.space == "scalar":
            return f"scalar {self.dtype or '?'}"
        dims = "?" if self.shape is None else ", ".join(str(d) for d in self.shape)
        text = f"{self.space}({dims}) {self.dtype or '?'}"
        return text if self.role == "none" else f"{text} {self.role}"


SCALAR = TileType("scalar", (), "fp32")
TOKEN = TileType("token", (), None)

_ids = itertools.count()


class Value:
    """An SSA value. `base` is the TL name it came from (`S` for `S.2`); the type is
    mutable because inference passes refine it in place, as MLIR's `setType` does."""

    __slots__ = ("name", "type", "base", "uid")

    def __init__(self, name: str, type: TileType, base: str | None = None):
        self.name = name
        self.type = type
        self.base = base or name.split(".")[0]
        self.uid = next(_ids)

    def __repr__(self) -> str:
        return f"%{self.name}"

    def __str__(self) -> str:
        return f"%{self.name}"
