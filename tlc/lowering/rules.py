"""The rule table of `lower-tile-ops`: which function lowers each TL op class on each target family,
and what the lowering needs to know of a family besides its rules.

A target family is an arch's `mma_path` (tlc/arch.py): "mma.sync" for the sm_80 family (sm_80 …
sm_90), "wgmma" for sm_90a. A rule is registered under (op class, family), or under (op class,
SHARED) when every family lowers the op alike; `rule_for` takes the family's own rule first, then
the shared one. A rule is `rule(cx, op, region, out)`: the lowering context (tile_ops.TileOpLowering),
the TL op, the region it sits in, and the kernel-IR list it appends to. An op a family cannot lower
is registered as a `Refuse`, so its message is stated here, not left to a missing entry.

A new target family's lowering is registered here only: a `Family` in FAMILIES and, for each op class
it lowers differently or not at all, a rule or a `Refuse` in RULES (docs/lowering.md shows one); its
arches name the family by their `mma_path` in tlc/arch.py.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tlc.arch import SM80_MMA_ATOMS, ArchInfo
from tlc.diagnostics import fail
from tlc.ir.graph import Graph
from tlc.ir.ops import (AllocateOp, CopyOp, ElementwiseOp, FullOp, GemmOp, LoopOp, MaskOp, Op, ReshapeOp, RowReduceOp,
                        ScalarOp, ScaledExpOp, SoftmaxOp)
from tlc.kir import ops as K
from tlc.kir import ops_sm90 as H
from tlc.lowering.tile_alloc import lower_allocate
from tlc.lowering.tile_copies import lower_copy
from tlc.lowering.tile_gemm import lower_mma_sync_gemm
from tlc.lowering.tile_loops import lower_loop
from tlc.lowering.tile_math import (lower_elementwise, lower_full, lower_mask, lower_reshape, lower_row_reduce,
                                    lower_scalar, lower_scaled_exp)
from tlc.lowering.tile_wgmma import lower_wgmma_gemm
from tlc.lowering.warps import plan_warps, plan_wgmma

if TYPE_CHECKING:
    from tlc.lowering.tile_ops import TileOpLowering

Rule = Callable[["TileOpLowering", Op, Graph, list[K.Op]], None]

SHARED = "*"   # the family key of a rule every family uses unless it registers its own


@dataclass(frozen=True)
class Refuse:
    """A rule that refuses its op at its line; `message` is formatted with the op as `{op}`."""

    message: str

    def __call__(self, cx: TileOpLowering, op: Op, region: Graph, out: list[K.Op]) -> None:
        raise fail(self.message.format(op=op), op.loc)


# The refusal of an op no family lowers: the TL passes replace it (softmax → online-softmax's ops), so
# meeting one means they did not run. The driver gives the same answer for a class with no entry at all.
UNLOWERED = Refuse("tlc build: no kernel lowering for '{op.mnemonic}' here (run the TL passes first; the lowering "
                   "handles Allocate, Copy, GEMM, elementwise, Mask, the online softmax's ops, Reshape and loops)")


@dataclass(frozen=True)
class Family:
    """What the lowering asks of a target family besides its op rules (`cx.family.<fact>`)."""

    path: str                  # the arches' `mma_path`: the key of this family's rules
    label: str                 # how messages name the family's lowering
    col_unit: int              # tile widths pad to a multiple of this many elements (tile_copies.padded)
    kernel_op: type[K.Op]      # the kernel-IR op of the kernel
    plan: Callable[..., Any]   # (graph, Param Warps or None, exprs, names) → the warp plan (warps.py)
    tma_copies: bool           # a later pass may turn global→shared copies into TMA boxes, which take any rows
    mma_atoms: dict[str, str] | None = None   # dtype → the MMA atom its TiledMMAs use (None: the arch's)


FAMILIES: dict[str, Family] = {
    # 16-byte cp.async chunks and mma.sync k16/n16 steps: widths pad to 32 (FlashAttention's head dims).
    "mma.sync": Family(path="mma.sync", label="sm_80-family", col_unit=32, kernel_op=K.KernelOp, plan=plan_warps,
                       tma_copies=False, mma_atoms=SM80_MMA_ATOMS),
    # GMMA and TMA read 128-byte swizzle atoms: widths pad to 64; warp-specialize may make copies TMA boxes.
    "wgmma": Family(path="wgmma", label="sm_90a", col_unit=64, kernel_op=H.Sm90KernelOp, plan=plan_wgmma,
                    tma_copies=True),
}

RULES: dict[tuple[type[Op], str], Rule] = {
    (AllocateOp, SHARED): lower_allocate,
    (CopyOp, SHARED): lower_copy,
    (ScalarOp, SHARED): lower_scalar,
    (GemmOp, "mma.sync"): lower_mma_sync_gemm,
    (GemmOp, "wgmma"): lower_wgmma_gemm,
    (ElementwiseOp, SHARED): lower_elementwise,
    (SoftmaxOp, SHARED): UNLOWERED,
    (MaskOp, SHARED): lower_mask,
    (ReshapeOp, SHARED): lower_reshape,
    (FullOp, SHARED): lower_full,
    (RowReduceOp, SHARED): lower_row_reduce,
    (ScaledExpOp, SHARED): lower_scaled_exp,
    (LoopOp, SHARED): lower_loop,
}


def family_of(arch: ArchInfo) -> Family:
    """The family `arch` lowers with; an arch whose path has no family is refused, naming those there are."""
    family = FAMILIES.get(arch.mma_path)
    if family is None:
        raise fail(f"tlc build: --arch {arch.name} uses {arch.mma_path}, which has no lowering rules (target "
                   f"families: {', '.join(FAMILIES)}; tlc/lowering/rules.py)")
    return family


def family_for(arch: ArchInfo, graph: Graph) -> Family:
    """The family a program lowers with on `arch`: the arch's, except that a kernel without GEMMs lowers by
    the sm_80 family's rules on every target — with no wgmma there is nothing for warp groups, TMA rings or
    GMMA layouts to do, and its register tiles take mma.sync's accumulator layout (tile_copies)."""
    family = family_of(arch)
    if family.tma_copies and not any(isinstance(op, GemmOp) for _, op in graph.walk()):
        return FAMILIES["mma.sync"]
    return family


def rule_for(op_class: type[Op], path: str) -> Rule | None:
    """The rule for `op_class` on family `path`: the family's own, else the shared one, else None."""
    return RULES.get((op_class, path)) or RULES.get((op_class, SHARED))
