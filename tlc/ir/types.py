"""Types and SSA values of the TL graph.

A `TileType` keeps shapes symbolic (`BM`, `HeadDim`) so passes reason about intent,
not numbers; `role` is the fragment layout a register tile is in (accumulator, A or B
operand) — the thing a Reshape changes and the paper's most common LLM bug breaks.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from tlc.frontend.ast import Expr

SPACES = ("global", "shared", "register")
ROLES = ("none", "acc", "A", "B")
DTYPES = {"bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "f16": "fp16", "half": "fp16", "float16": "fp16",
          "fp32": "fp32", "f32": "fp32", "float": "fp32", "float32": "fp32"}
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
