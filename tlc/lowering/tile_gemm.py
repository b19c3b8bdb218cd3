"""GEMM rule of `lower-tile-ops` for the mma.sync family (sm_80 … sm_90): mma.sync over the
operands the program names — A and B from shared tiles through ldmatrix (ldmatrix.trans and a
transposed view for an MN-major B), or A as a regrouped accumulator kept in registers — and the
checks every family's GEMM rule shares (`shared_operand`, `block_rows`, `accumulator`).

Each rule takes the lowering context (tlc.lowering.tile_ops.TileOpLowering), the op, its region and
the kernel-IR list it appends to; tlc.lowering.rules registers them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from tlc.diagnostics import fail
from tlc.ir.graph import Graph
from tlc.ir.ops import GemmOp
from tlc.ir.types import Value
from tlc.kir import ops as K
from tlc.kir.expr import Const, Var
from tlc.lowering.storage import Buffer, Slot
from tlc.lowering.tile_copies import mma_copy

if TYPE_CHECKING:
    from tlc.lowering.tile_ops import TileOpLowering

LDSM_N, LDSM_T = "SM75_U32x4_LDSM_N", "SM75_U16x8_LDSM_T"


def lower_mma_sync_gemm(cx: TileOpLowering, op: GemmOp, region: Graph, out: list[K.Op]) -> None:
    mma = cx.warp_plan.mma_of_gemm(op)
    a, am, ak, a_load = _operand(cx, op.operands[0], "A", op.a_major or "k", op, mma)
    b, bk, bn, b_load = _operand(cx, op.operands[1], "B", op.b_major or "k", op, mma)
    if ak != bk:
        raise fail(f"tlc build: GEMM inner dimensions differ: A is {am}×{ak}, B is {bk}×{bn}", op.loc)
    warps_m, warps_n = cx.warp_plan.warps_of(mma)
    per_warp = 16 * warps_m
    if am % per_warp or bn % (16 * warps_n) or ak % 16:
        raise fail(f"tlc build: GEMM {am}×{bn}×{ak} does not fit mma.sync m16n8k16 on {warps_m}×{warps_n} warps: "
                   f"M must be a multiple of {per_warp}, N of {16 * warps_n} and K of 16", op.loc)
    block_rows(cx, am, op)
    acc, fresh = accumulator(cx, op, mma, am, bn, out)
    if fresh:
        out += [K.FragmentOp(name=acc.name, mma=mma, role="C", dtype="fp32", shape=(am, bn), loc=op.loc),
                K.ClearOp(target=acc.name, loc=op.loc)]
    # One k-block per trip of an unrolled loop: load the shared operands' k-block, then its MMAs.
    # `prefetch-operands` moves each load one trip ahead.
    kb = cx.names.fresh("kb")
    body: list[K.Op] = [
        K.CopyOp(copy=ld["copy"], src=ld["smem"], dst=Var(ld["view"]), kblock=Var(kb), reads=(ld["buf"],),
                 loc=op.loc) for ld in (a_load, b_load) if ld]
    body.append(K.MmaOp(mma=mma, acc=acc.name, a=a, b=b, kblock=Var(kb), loc=op.loc))
    out.append(K.ForOp(var=kb, start=Const(0), stop=Const(ak // 16), step=1, body=tuple(body), unroll=True,
                       loc=op.loc))


def _operand(cx: TileOpLowering, v: Value, role: str, major: str | None, op: GemmOp,
             mma: str) -> tuple[str, int, int, dict]:
    """(fragment, rows, cols, its shared-memory load or {}) for operand `role` of `op`, computed with
    TiledMMA `mma`."""
    s = cx.slot(v, op)
    if s.kind == "afrag" and role == "A":
        return s.name, s.rows, s.cols, {}
    buf = shared_operand(cx, v, s, role, op)
    if role == "A" and major != "k":
        raise fail(f"tlc build: operand A '{v.base}' is read transposed (stored M-contiguous); the "
                   "lowering reads A as stored, rows × K", op.loc)
    trans = role == "B" and major == "mn"
    src = buf.name
    if trans:
        src = _transposed(cx, buf)
    frag_src = f"{buf.name}t_plain" if trans else buf.name
    frag = cx.declare_once(("frag", buf.name, role, trans, mma), f"t{role}r{buf.tl_name}",
                           lambda n: K.FragmentOp(name=n, mma=mma, role=role, dtype=buf.dtype, src=Var(frag_src)))
    copy = mma_copy(cx, ("s2r", role, trans, buf.dtype, mma), f"s2r_{role}{'_trans' if trans else ''}",
                    LDSM_T if trans else LDSM_N, buf.dtype, role, mma)
    smem = cx.partition(("S2R", src, copy), f"t{role}s{buf.tl_name}", f"{copy}_thr", "partition_S", Var(src))
    view = cx.partition(("view", frag, copy), f"{frag}_view", f"{copy}_thr", "retile_D", Var(frag))
    # A: (M, K) as stored. B: (K, N) — a k-major tile is stored (N, K), an mn-major one (K, N).
    rows, cols = (buf.rows, buf.cols) if role == "A" or trans else (buf.cols, buf.rows)
    return frag, rows, cols, {"smem": Var(smem), "copy": copy, "view": view, "buf": buf.name}


def shared_operand(cx: TileOpLowering, v: Value, s: Slot, role: str, op: GemmOp) -> Buffer:
    """The shared buffer GEMM operand `v` reads, checked: written before, not since overwritten."""
    if s.kind != "smem":
        where = {"frag": "an accumulator (Reshape it to MMA_A first)", "afrag": "an A-operand fragment",
                 "row": "a row vector", "scalar": "a scalar", "global": "a global tensor (copy it to shared)"}
        also = " or a reshaped accumulator" if role == "A" else ""
        raise fail(f"tlc build: GEMM operand {role} '{v.base}' is {where.get(s.kind, s.kind)}; the {cx.family.label} "
                   f"lowering reads operand {role} from a shared tile{also}", op.loc)
    buf = s.buffer
    assert buf is not None
    if s.uid == -1:
        raise fail(f"tlc build: GEMM operand '{v.base}' reads shared '{buf.tl_name}' before any copy writes it",
                   op.loc)
    if s.uid != buf.last_write:
        raise fail(f"tlc build: GEMM operand '{v.base}' reads shared '{buf.tl_name}' after a later copy "
                   "overwrote it; copy the tile again or reorder the copies", op.loc)
    for _, written in cx.loops:
        if buf.name in written and s.region != cx.region:
            raise fail(f"tlc build: GEMM operand '{v.base}' was loaded before this loop, but the loop overwrites "
                       f"shared '{buf.tl_name}'", op.loc)
    return buf


def _transposed(cx: TileOpLowering, buf: Buffer) -> str:
    """Views of a (K, N) row-major tile as (N, K) for ldmatrix.trans (and without swizzle for the fragment)."""
    key = ("transposed", buf.name)
    if key not in cx.memo:
        lay = f"{buf.name}_layout"
        cx.layouts += [
            K.SmemTransposeLayoutOp(name=f"{lay}_t", of=lay, shape=(buf.cols, buf.rows)),
            K.SmemTransposeLayoutOp(name=f"{lay}_t_plain", of=lay, shape=(buf.cols, buf.rows), strip_swizzle=True),
            K.SharedViewOp(name=f"{buf.name}t", of=buf.name, layout=f"{lay}_t"),
            K.SharedViewOp(name=f"{buf.name}t_plain", of=buf.name, layout=f"{lay}_t_plain")]
        cx.names.taken.update({f"{buf.name}t", f"{buf.name}t_plain"})
        cx.memo[key] = f"{buf.name}t"
    return cx.memo[key]


def block_rows(cx: TileOpLowering, am: int, op: GemmOp) -> None:
    """Every GEMM of a kernel has the block's rows as its M (every family's rule)."""
    if cx.m_rows is None:
        cx.m_rows = am
    elif am != cx.m_rows:
        raise fail(f"tlc build: every GEMM of a kernel shares the block's rows; this one has M = {am}, an earlier "
                   f"one {cx.m_rows}", op.loc)


def accumulator(cx: TileOpLowering, op: GemmOp, mma: str, am: int, bn: int, out: list[K.Op]) -> tuple[Slot, bool]:
    """The GEMM's accumulator and whether it is fresh (the caller declares and zeroes a fresh one):
    the register tile an accumulating GEMM adds into, checked against `mma` and the product's shape."""
    if op.accumulate:
        acc = cx.in_place(op.operands[2], op.result, out, op.loc)
        if acc.mma != mma:
            raise fail(f"tlc build: accumulator '{op.operands[2].base}' was laid out for another GEMM kind; "
                       "accumulate into a register tile you allocated", op.loc)
        if (acc.rows, acc.cols) != (am, bn):
            raise fail(f"tlc build: accumulator '{op.operands[2].base}' is {acc.rows}×{acc.cols}, the product "
                       f"{am}×{bn}", op.loc)
        return acc, False
    b_slot = cx.slots[op.operands[1].uid]
    logical = b_slot.logical_cols if (op.b_major == "mn" and b_slot.kind == "smem") else bn
    return cx.bind(op.result, Slot("frag", cx.names.fresh(f"acc_{op.result.base}"), am, bn,
                                   region=cx.region, logical_cols=logical, mma=mma)), True
