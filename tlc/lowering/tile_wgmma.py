"""GEMM rule of `lower-tile-ops` for the wgmma family (sm_90a): wgmma over the operands the program
names, with the shared copies (cp.async) feeding it. Two forms, the two of attention:

    Compute GEMM Q, K.T and get S         wgmma SS: A and B from shared tiles, both K-major
    Compute GEMM P, V and accumulate O    wgmma RS: A = P's accumulator registers (the Reshape),
                                          B = V read as stored (MN-major)

Operand buffers get GMMA's canonical 128-byte-swizzled layouts (`_smem_decls` of tile_ops reads
`gmma_major`); a `Copy … from shared to register` of an operand is dropped (LANGUAGE.md §5); each
GEMM is fence, arrive, the wgmma, commit and wait<0>, so its accumulator is ready for the fragment
ops after it. Anything else is refused at its line. tlc.lowering.rules registers the rule.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from tlc.diagnostics import Note, fail
from tlc.ir.graph import Graph
from tlc.ir.ops import GemmOp
from tlc.kir import ops as K
from tlc.kir import ops_sm90 as H
from tlc.kir.expr import Var
from tlc.lowering.storage import Buffer
from tlc.lowering.tile_gemm import accumulator, block_rows, shared_operand

if TYPE_CHECKING:
    from tlc.lowering.tile_ops import TileOpLowering

GMMA_SPAN = 64   # elements along a 128-byte swizzled GMMA atom's contiguous mode (bf16/fp16)
FORMS = ("--arch sm_90a lowers two GEMM forms: A and B from shared tiles, both K-major (Q·Kᵀ, wgmma SS), and A a "
         "reshaped accumulator with B a shared tile read as stored (P·V, wgmma RS); --arch sm_90 lowers the rest "
         "with mma.sync")


def lower_wgmma_gemm(cx: TileOpLowering, op: GemmOp, region: Graph, out: list[K.Op]) -> None:
    mma = cx.warp_plan.mma_of_gemm(op)
    a_slot, b_slot = cx.slot(op.operands[0], op), cx.slot(op.operands[1], op)
    a_major, b_major = op.a_major or "k", op.b_major or "k"
    if a_slot.kind == "afrag":
        kind, a_buf = "RS", None
        if b_major != "mn":
            raise fail(f"tlc build: this GEMM reads A from registers and B '{op.operands[1].base}' transposed "
                       f"(K-major); {FORMS}", op.loc)
        am, ak = a_slot.rows, a_slot.cols
    else:
        kind, a_buf = "SS", shared_operand(cx, op.operands[0], a_slot, "A", op)
        if (a_major, b_major) != ("k", "k"):
            which = "A" if a_major != "k" else "B"
            name = op.operands[0 if which == "A" else 1].base
            raise fail(f"tlc build: this GEMM reads {which} '{name}' from shared memory "
                       f"{'transposed' if which == 'A' else 'as stored (MN-major)'}; {FORMS}", op.loc)
        am, ak = a_buf.rows, a_buf.cols
    b_buf = shared_operand(cx, op.operands[1], b_slot, "B", op)
    bk, bn = (b_buf.cols, b_buf.rows) if b_major == "k" else (b_buf.rows, b_buf.cols)
    if ak != bk and min(ak, bk) % GMMA_SPAN and max(ak, bk) % GMMA_SPAN == 0:
        raise fail(f"tlc build ({cx.arch.name}): this GEMM's A is {am}×{ak} and B {bk}×{bn}: sm_90a pads tile "
                   f"widths to multiples of {GMMA_SPAN} (128-byte GMMA rows) but not row counts, so a width of "
                   f"{min(ak, bk)} that is a row count here became {max(ak, bk)} where it was a width; make that "
                   f"dimension a multiple of {GMMA_SPAN}, or build for sm_90", op.loc)
    _wgmma_shapes(cx, op, am, ak, bk, bn, [b for b in (a_buf, b_buf) if b is not None])
    acc, zero_init = _wgmma_acc(cx, op, mma, am, bn, out)
    decl = H.WgmmaTiledMmaOp(name=mma, dtype=b_buf.dtype, kind=kind, tile=(64, bn, 16),
                             warp_groups=(cx.warp_plan.warp_groups, 1, 1), thread_slice=cx.warp_plan.slice_of(mma),
                             a_k_major=True, b_k_major=b_major == "k", loc=op.loc)
    if not any(getattr(d, "name", None) == mma for d in cx.mma_decls):
        cx.mma_decls.append(decl)
    a = a_slot.name if a_buf is None else _descriptors(cx, a_buf, "A", "k", mma, op)
    b = _descriptors(cx, b_buf, "B", b_major, mma, op)
    fenced = (acc,) if a_buf is not None else (acc, a)
    reads = tuple(buf.name for buf in (a_buf, b_buf) if buf is not None)
    out += [H.WgmmaFenceOperandOp(targets=fenced, loc=op.loc), H.WgmmaArriveOp(loc=op.loc),
            H.WgmmaOp(mma=mma, acc=acc, a=Var(a), b=Var(b), zero_init=zero_init, reads=reads, loc=op.loc),
            H.WgmmaCommitOp(loc=op.loc), H.WgmmaWaitOp(pending=0, loc=op.loc),
            H.WgmmaFenceOperandOp(targets=fenced, loc=op.loc)]


def _wgmma_shapes(cx: TileOpLowering, op: GemmOp, am: int, ak: int, bk: int, bn: int, bufs: list[Buffer]) -> None:
    if ak != bk:
        raise fail(f"tlc build: GEMM inner dimensions differ: A is {am}×{ak}, B is {bk}×{bn}", op.loc)
    rows = 64 * cx.warp_plan.warp_groups
    if am != rows:
        raise fail(f"tlc build: GEMM M = {am}, but the block's {cx.warp_plan.warp_groups} warp group(s) take "
                   f"{rows} rows (one wgmma atom of 64 rows each)", op.loc)
    if ak % 16 or bn % 8 or bn > 256:
        raise fail(f"tlc build: GEMM {am}×{bn}×{ak} does not fit wgmma m64nNk16: N must be a multiple of 8 up to "
                   f"256 and K a multiple of 16", op.loc)
    for buf in bufs:
        if buf.cols % GMMA_SPAN or buf.rows % 8:
            raise fail(f"tlc build: shared tile '{buf.tl_name}' is {buf.rows}×{buf.cols}; --arch sm_90a lays GEMM "
                       f"operands out in 128-byte swizzled GMMA atoms, so the width must be a multiple of "
                       f"{GMMA_SPAN} elements (tile widths pad up to one: 40 → 64, 96 → 128) and the rows a "
                       "multiple of 8", op.loc)
    block_rows(cx, am, op)


def _wgmma_acc(cx: TileOpLowering, op: GemmOp, mma: str, am: int, bn: int, out: list[K.Op]) -> tuple[str, bool]:
    """The accumulator's name and whether the wgmma overwrites it (a fresh result: zero_init)."""
    acc, fresh = accumulator(cx, op, mma, am, bn, out)
    if fresh:
        out.append(H.WgmmaFragmentOp(name=acc.name, mma=mma, role="C", shape=(am, bn), loc=op.loc))
    return acc.name, fresh


def _descriptors(cx: TileOpLowering, buf: Buffer, role: str, major: str, mma: str, op: GemmOp) -> str:
    """GMMA descriptors of `buf` as operand `role` of `mma` (an MN-major B through its (N, K) view)."""
    seen = cx.gmma_major.setdefault(buf.name, major)
    if seen != major:
        raise fail(f"tlc build: this GEMM reads shared tile '{buf.tl_name}' {major.upper()}-major, an earlier one "
                   f"{seen.upper()}-major; --arch sm_90a gives each operand tile one GMMA layout (copy the tile "
                   "to a second shared buffer, or use --arch sm_90)", op.loc,
                   Note(f"'{buf.tl_name}' is allocated here", buf.loc))
    tag = op.result.base
    src = buf.name if major == "k" else _gmma_view(cx, buf)
    part = cx.partition(("wgmma", role, src, mma), f"t{tag}s{buf.tl_name}", cx.warp_plan.slice_of(mma),
                        f"partition_{role}", Var(src))
    return cx.declare_once(("wgmma_frag", part, mma), f"t{tag}r{buf.tl_name}",
                           lambda n: H.WgmmaFragmentOp(name=n, mma=mma, role=role, src=Var(part)))


def _gmma_view(cx: TileOpLowering, buf: Buffer) -> str:
    """The (cols, rows[, stages]) view of an MN-major operand tile: the transpose of its K-major GMMA layout."""
    key = ("gmma_view", buf.name)
    if key not in cx.memo:
        name = cx.names.fresh(f"{buf.name}t")
        cx.layouts.append(K.SharedViewOp(name=name, of=buf.name, layout=f"{buf.name}_layout_mn"))
        cx.memo[key] = name
    return cx.memo[key]
