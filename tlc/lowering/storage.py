"""Where TL values live in the kernel: slots, shared buffers, C++ names and liveness.

SSA values of the TL graph become C++ objects: a register fragment, a row vector, a shared
buffer, a global tensor view or a scalar. An op may overwrite its operand's storage when that
operand dies there (the accumulator rescale and P·V update O in place, as FlashAttention does);
otherwise it gets fresh storage and nvcc's register allocator removes the copy.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from tlc.diagnostics import Loc
from tlc.ir.graph import Graph
from tlc.ir.ops import LoopOp, Op
from tlc.ir.types import Value
from tlc.kir.expr import CPP_KEYWORDS
from tlc.names import FreshNames

ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


@dataclass
class Buffer:
    """One `Allocate X in shared` (or an epilogue staging tile): rows × cols of dtype."""

    tl_name: str
    name: str
    rows: int
    cols: int
    dtype: str
    loc: Loc | None
    reuse: bool = False          # may overlap buffers that are dead when it is first written
    logical_cols: int = 0        # the program's width; `cols` is padded (tile_ops.padded)
    last_write: int = -1         # uid of the TL value of its latest write, in program order

    @property
    def bytes(self) -> int:
        return self.rows * self.cols * ELEMENT_BYTES[self.dtype]


@dataclass
class Slot:
    """A TL value's storage. kind: global | smem | frag | afrag | row | scalar."""

    kind: str
    name: str
    rows: int = 0
    cols: int = 0
    region: int = 0
    buffer: Buffer | None = None
    uid: int = -1                # smem: the TL value written (for staleness checks)
    is_float: bool = True
    logical_cols: int = -1       # the program's width when `cols` is padded (-1: not padded)
    mma: str = "tiled_mma"       # frag / afrag / row: the TiledMMA whose thread layout it has
    deferred: object = None      # global: the Allocate whose head offset reads a loop's variable (viewed per copy)

    def __post_init__(self) -> None:
        if self.logical_cols < 0:
            self.logical_cols = self.cols


class Namer(FreshNames):
    """Unique, valid C++ identifiers derived from TL names (`S.1` → `S_1`, `int` → `v_int`; `S_1`
    again → `S_1_1`)."""

    def __init__(self, reserved: tuple[str, ...] = ()) -> None:
        super().__init__(reserved)

    def fresh(self, base: str) -> str:
        name = re.sub(r"\W", "_", base) or "v"
        if name[0].isdigit() or name in CPP_KEYWORDS or name.startswith("__"):
            name = f"v_{name}"
        return super().fresh(name)


def _uses(op: Op) -> list[Value]:
    """Values `op` reads, including those read anywhere inside a loop body (and its yields)."""
    out = list(op.operands)
    if isinstance(op, LoopOp) and op.body is not None:
        for _, inner in op.body.walk():
            out += inner.operands
            if isinstance(inner, LoopOp):
                out += inner.yields
        out += op.yields
    return out


def last_uses(region: Graph, ops: list[Op], yields: tuple[Value, ...] = ()) -> dict[int, int]:
    """uid → index in `ops` of its last use; yielded values are used at len(ops) (the back edge)."""
    last: dict[int, int] = {}
    for i, op in enumerate(ops):
        for v in _uses(op):
            last[v.uid] = i
    for v in yields:
        last[v.uid] = len(ops)
    return last
