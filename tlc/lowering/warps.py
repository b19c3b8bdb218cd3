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

A plan is the target family's answer to "which TiledMMA, and which fragments": `WarpPlan` for
mma.sync, `WgmmaPlan` for wgmma; tlc.lowering.rules names each family's planner, and the rules ask
the plan for accumulators and row references instead of testing the target.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tlc.diagnostics import Loc, fail
from tlc.ir.graph import Graph
from tlc.ir.ops import AllocateOp, CopyOp, GemmOp
from tlc.kir import ops as K
from tlc.kir import ops_sm90 as H

ROW_MMA, SPLIT_MMA = "tiled_mma", "tiled_mma_n"
DEFAULT_WARPS = 4
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

    def accumulator(self, name: str, mma: str, shape: tuple[int, int], loc: Loc | None = None) -> K.Op:
        """fp32 accumulator registers of TiledMMA `mma`."""
        return K.FragmentOp(name=name, mma=mma, role="C", dtype="fp32", shape=shape, loc=loc)

    def row_reference(self, name: str, rows: int) -> K.Op:
        """The fragment whose rows the block's row vectors follow: `tiled_mma`'s, 16 columns wide."""
        return K.FragmentOp(name=name, mma=ROW_MMA, role="C", dtype="fp32", shape=(rows, 16))

    def row_layout(self) -> tuple[str, int]:
        """(TiledMMA, columns) of the row reference fragment: what a row vector's row coordinates come from."""
        return ROW_MMA, 16

    def decls(self, atom: str) -> list[K.Op]:
        out: list[K.Op] = [K.TiledMmaOp(name=ROW_MMA, atom=atom, warps=(self.warps_m, 1, 1),
                                        tile=(16 * self.warps_m, 16, 16), thread_slice=SLICES[ROW_MMA],
                                        replicas=self.replicas)]
        if self.split_targets:
            out.append(K.TiledMmaOp(name=SPLIT_MMA, atom=atom, warps=(self.warps_m, self.replicas, 1),
                                    tile=(16 * self.warps_m, 16 * self.replicas, 16), thread_slice=SLICES[SPLIT_MMA]))
        return out


def plan_warps(graph: Graph, declared: int | None, exprs, names) -> WarpPlan:
    """Choose the layouts from the block's rows (the first GEMM's M) and `Param Warps` (`declared`, else
    4; a kernel without GEMMs, whose warps each hold 16 rows of its register tiles, takes one warp per 16
    rows up to 4). `names` is unused: the mma.sync TiledMMAs have fixed names."""
    warps = DEFAULT_WARPS if declared is None else declared
    gemms = [op for _, op in graph.walk() if isinstance(op, GemmOp)]
    if not gemms:
        rows = _register_rows(graph, exprs) if declared is None else None
        if rows is not None and rows % 16 == 0 and 16 <= rows < 16 * warps:
            warps = rows // 16
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


def _register_rows(graph: Graph, exprs) -> int | None:
    """The rows of a kernel's first register tile (a register Allocate, or a tile loaded into registers)."""
    for _, op in graph.walk():
        if isinstance(op, AllocateOp) and op.space == "register" and op.shape:
            extent = op.shape[0]
        elif isinstance(op, CopyOp) and op.dst_space == "register" and op.src_space == "global" and op.tile:
            extent = op.tile[0]
        else:
            continue
        return exprs.int_value(extent, op.loc, "a tile extent")
    return None


# ----------------------------------------------------------------------------- sm_90a (wgmma)
WARP_GROUP_ROWS = 64   # a wgmma atom is 64 rows: one warp group (4 warps) per 64 rows of the block


@dataclass
class WgmmaPlan:
    """sm_90a: one warp group per 64 rows (Warps = 4 · BM / 64) and one wgmma TiledMMA per GEMM,
    all with the same rows per thread (rows r and r + 8 of its warp's 16), so row vectors, masks
    and row reductions are shared by every GEMM's accumulator. The GEMM rule declares the MMAs."""

    warps: int
    gemm_mma: dict[int, str]        # a GEMM's result uid → its wgmma TiledMMA
    register_mma: dict[str, str]    # `Allocate X in register` accumulated by a GEMM → that GEMM's MMA
    row_mma: str                    # the first GEMM's: row vectors are laid out like its accumulator
    row_n: int                      # its N (the row reference fragment's columns)
    replicas: int = 1
    split_targets: frozenset[str] = field(default_factory=frozenset)

    @property
    def warp_groups(self) -> int:
        return self.warps // 4

    def mma_of_register(self, tl_name: str) -> str:
        return self.register_mma.get(tl_name, self.row_mma)

    def mma_of_gemm(self, op: GemmOp) -> str:
        return self.gemm_mma[op.result.uid]

    @staticmethod
    def slice_of(mma: str) -> str:
        return f"thr_{mma}"

    def need_whole_rows(self, mma: str, what: str, loc: Loc | None) -> None:
        """Every wgmma accumulator holds whole rows within a warp (nothing is split by columns)."""

    def accumulator(self, name: str, mma: str, shape: tuple[int, int], loc: Loc | None = None) -> K.Op:
        """fp32 accumulator registers of wgmma TiledMMA `mma`."""
        return H.WgmmaFragmentOp(name=name, mma=mma, role="C", shape=shape, loc=loc)

    def row_reference(self, name: str, rows: int) -> K.Op:
        """Any wgmma accumulator of the block's rows lays its rows out alike: the first GEMM's."""
        return self.accumulator(name, self.row_mma, (rows, self.row_n))

    def row_layout(self) -> tuple[str, int]:
        """(TiledMMA, columns) of the row reference fragment: what a row vector's row coordinates come from."""
        return self.row_mma, self.row_n

    def decls(self, atom: str) -> list[K.Op]:
        return []


def plan_wgmma(graph: Graph, declared: int | None, exprs, names) -> WgmmaPlan:
    """The sm_90a warp plan from the block's rows (the first GEMM's M); `declared`: Param Warps if set."""
    gemms = [op for _, op in graph.walk() if isinstance(op, GemmOp)]
    if not gemms:
        raise fail("tlc build: the program has no GEMM; the sm_90a lowering needs one to fix the thread layout")
    first = gemms[0]
    shape = first.operands[0].type.shape
    if not shape or len(shape) != 2:
        raise fail("tlc build: --arch sm_90a needs the GEMM's operand shapes (rows, cols)", first.loc)
    rows = exprs.int_value(shape[0], first.loc, "a tile extent")
    if rows % WARP_GROUP_ROWS or not 64 <= rows <= 256:
        raise fail(f"tlc build: --arch sm_90a runs one warp group (4 warps) per 64 rows of the block; this GEMM has "
                   f"M = {rows} (supported: BM = 64, 128, 192 or 256; --arch sm_90 takes other tiles)", first.loc)
    need = 4 * rows // WARP_GROUP_ROWS
    if declared is not None and declared != need:
        raise fail(f"tlc build: Param Warps = {declared}, but --arch sm_90a runs one warp group per 64 rows: "
                   f"BM = {rows} needs Warps = {need} (set -D Warps={need}, or leave Warps unset)", first.loc)
    gemm_mma: dict[int, str] = {}
    register_mma: dict[str, str] = {}
    for op in gemms:
        name = names.fresh(f"wgmma_{op.result.base}")
        names.taken.add(f"thr_{name}")
        gemm_mma[op.result.uid] = name
        if op.accumulate:
            target = op.operands[2].base
            if target in register_mma:
                raise fail(f"tlc build: a second GEMM accumulates into '{target}'; the sm_90a lowering gives each "
                           "register accumulator one GEMM", op.loc)
            register_mma[target] = name
    # The first GEMM's N as its rule will see it: B is stored (N, K) when k-major, (K, N) with the
    # columns padded to a multiple of 32 when mn-major.
    b = first.operands[1].type.shape
    if not b or len(b) != 2:
        raise fail("tlc build: --arch sm_90a needs the GEMM's operand shapes (rows, cols)", first.loc)
    if first.b_major == "mn":
        row_n = -(-exprs.int_value(b[1], first.loc, "a tile extent") // 32) * 32
    else:
        row_n = exprs.int_value(b[0], first.loc, "a tile extent")
    return WgmmaPlan(need, gemm_mma, register_mma, gemm_mma[first.result.uid], row_n)
