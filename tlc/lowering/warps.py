"""How the block's warps share the GEMMs: the thread layouts of the kernel's TiledMMAs.

The rule, stated once: a block of BM query rows gives each warp 16 rows when BM ≥ 16 × Warps
(FlashAttention-2's layout: one TiledMMA, warps along M). With fewer rows (decode: a few new
tokens against a long cache) there are more warps than 16-row groups, and two layouts are used:

- `tiled_mma`: the rows' warps only (Warps_M = BM / 16), replicated over the remaining warps.
  Scores, their masks and the softmax stay whole rows inside one warp, so row reductions stay
  shuffles within a quad and P is already an A operand; every replica computes the same values.
- `tiled_mma_n`: Warps_M × (Warps / Warps_M) warps, splitting N. A GEMM that accumulates into a
  register tile (`Compute GEMM P, V and accumulate O`) uses it, so each warp keeps only its
  columns of O: MLA decode's 512-wide O is 64 registers per thread instead of 256.

A tile split across warps by columns cannot be reduced along rows or regrouped as an A operand;
those uses are refused at their line.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tlc.diagnostics import Loc, fail
from tlc.ir.graph import Graph
from tlc.ir.ops import GemmOp
from tlc.kir import ops as K

ROW_MMA, SPLIT_MMA = "tiled_mma", "tiled_mma_n"
SLICES = {ROW_MMA: "thr_mma", SPLIT_MMA: "thr_mma_n"}


@dataclass
class WarpPlan:
    warps: int
    warps_m: int
    split_targets: frozenset[str] = field(default_factory=frozenset)

    @property
    def replicas(self) -> int:
        return self.warps // self.warps_m

    def mma_of_register(self, tl_name: str) -> str:
        """The TiledMMA of `Allocate <tl_name> in register`: split when a GEMM accumulates into it."""
        return SPLIT_MMA if tl_name in self.split_targets else ROW_MMA

    def mma_of_gemm(self, op: GemmOp) -> str:
        return SPLIT_MMA if op.accumulate and op.operands[2].base in self.split_targets else ROW_MMA

    @staticmethod
    def slice_of(mma: str) -> str:
        return SLICES[mma]

    def warps_of(self, mma: str) -> tuple[int, int]:
        return (self.warps_m, self.replicas) if mma == SPLIT_MMA else (self.warps_m, 1)

    def need_whole_rows(self, mma: str, what: str, loc: Loc | None) -> None:
        if mma == SPLIT_MMA:
            raise fail(f"tlc build: {what} of a tile whose columns are split across warps (an accumulator of a "
                       f"block with {16 * self.warps_m} rows on {self.warps} warps) is not supported; use BM ≥ "
                       f"{16 * self.warps} or fewer warps", loc)

    def decls(self, atom: str) -> list[K.Op]:
        out: list[K.Op] = [K.TiledMmaOp(name=ROW_MMA, atom=atom, warps=(self.warps_m, 1, 1),
                                        tile=(16 * self.warps_m, 16, 16), thread_slice=SLICES[ROW_MMA],
                                        replicas=self.replicas)]
        if self.split_targets:
            out.append(K.TiledMmaOp(name=SPLIT_MMA, atom=atom, warps=(self.warps_m, self.replicas, 1),
                                    tile=(16 * self.warps_m, 16 * self.replicas, 16), thread_slice=SLICES[SPLIT_MMA]))
        return out


def plan_warps(graph: Graph, warps: int, exprs) -> WarpPlan:
    """Choose the layouts from the block's rows (the first GEMM's M) and `Param Warps`."""
    gemms = [op for _, op in graph.walk() if isinstance(op, GemmOp)]
    if not gemms:
        return WarpPlan(warps, warps)
    first = gemms[0]
    shape = first.operands[0].type.shape
    if not shape:
        return WarpPlan(warps, warps)
    rows = exprs.int_value(shape[0], first.loc, "a tile extent")
    if rows >= 16 * warps:
        return WarpPlan(warps, warps)
    if rows % 16 or warps % (rows // 16):
        raise fail(f"tlc build: a block of {rows} rows on {warps} warps: the rows must be a multiple of 16 that "
                   f"divides into the warps (16, 32, 64, … rows), or at least {16 * warps}", first.loc)
    targets = frozenset(op.operands[2].base for op in gemms if op.accumulate)
    return WarpPlan(warps, rows // 16, targets)
