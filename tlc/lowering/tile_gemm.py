"""GEMM rule of `lower-tile-ops`: mma.sync over the operands the program names — A and B from
shared tiles through ldmatrix (ldmatrix.trans and a transposed view for an MN-major B), or A as a
regrouped accumulator kept in registers.

A mixin of `TileOpLowering` (tlc.lowering.tile_ops): the methods share its slots, names and memo.
"""
from __future__ import annotations

from tlc.diagnostics import fail
from tlc.ir.graph import Graph
from tlc.ir.ops import GemmOp
from tlc.ir.types import Value
from tlc.kir import ops as K
from tlc.kir.expr import Const, Var
from tlc.lowering.storage import Buffer, Slot

LDSM_N, LDSM_T = "SM75_U32x4_LDSM_N", "SM75_U16x8_LDSM_T"


class GemmRules:
    def _operand(self, v: Value, role: str, major: str | None, op: GemmOp, mma: str) -> tuple[str, int, int, dict]:
        """(fragment, rows, cols, its shared-memory load or {}) for operand `role` of `op`, computed with
        TiledMMA `mma`."""
        s = self.slot(v, op)
        if s.kind == "afrag" and role == "A":
            return s.name, s.rows, s.cols, {}
        buf = self._shared_operand(v, s, role, op)
        if role == "A" and major != "k":
            raise fail(f"tlc build: operand A '{v.base}' is read transposed (stored M-contiguous); the "
                       "lowering reads A as stored, rows × K", op.loc)
        trans = role == "B" and major == "mn"
        src = buf.name
        if trans:
            src = self._transposed(buf)
        frag_src = f"{buf.name}t_plain" if trans else buf.name
        frag = self._memo_decl(("frag", buf.name, role, trans, mma), f"t{role}r{buf.tl_name}",
                               lambda n: K.FragmentOp(name=n, mma=mma, role=role, dtype=buf.dtype,
                                                      src=Var(frag_src)))
        copy = self._memo_copy(("s2r", role, trans, buf.dtype, mma), f"s2r_{role}{'_trans' if trans else ''}",
                               LDSM_T if trans else LDSM_N, buf.dtype, role, mma)
        smem = self._partition(("S2R", src, copy), f"t{role}s{buf.tl_name}", f"{copy}_thr", "partition_S", Var(src))
        view = self._partition(("view", frag, copy), f"{frag}_view", f"{copy}_thr", "retile_D", Var(frag))
        # A: (M, K) as stored. B: (K, N) — a k-major tile is stored (N, K), an mn-major one (K, N).
        rows, cols = (buf.rows, buf.cols) if role == "A" or trans else (buf.cols, buf.rows)
        return frag, rows, cols, {"smem": Var(smem), "copy": copy, "view": view, "buf": buf.name}

    def _shared_operand(self, v: Value, s: Slot, role: str, op: GemmOp) -> Buffer:
        """The shared buffer GEMM operand `v` reads, checked: written before, not since overwritten."""
        if s.kind != "smem":
            where = {"frag": "an accumulator (Reshape it to MMA_A first)", "afrag": "an A-operand fragment",
                     "row": "a row vector", "scalar": "a scalar", "global": "a global tensor (copy it to shared)"}
            path = "sm_90a" if self.arch.mma_path == "wgmma" else "sm_80-family"
            raise fail(f"tlc build: GEMM operand {role} '{v.base}' is {where.get(s.kind, s.kind)}; the {path} lowering "
                       f"reads operand {role} from a shared tile" + (" or a reshaped accumulator" if role == "A" else ""),
                       op.loc)
        buf = s.buffer
        assert buf is not None
        if s.uid == -1:
            raise fail(f"tlc build: GEMM operand '{v.base}' reads shared '{buf.tl_name}' before any copy writes it",
                       op.loc)
        if s.uid != buf.last_write:
            raise fail(f"tlc build: GEMM operand '{v.base}' reads shared '{buf.tl_name}' after a later copy "
                       "overwrote it; copy the tile again or reorder the copies", op.loc)
        for _, written in self.loops:
            if buf.name in written and s.region != self.region:
                raise fail(f"tlc build: GEMM operand '{v.base}' was loaded before this loop, but the loop overwrites "
                           f"shared '{buf.tl_name}'", op.loc)
        return buf

    def _memo_decl(self, key: tuple, base: str, make) -> str:
        if key not in self.memo:
            name = self.names.fresh(base)
            self.decls.append(make(name))
            self.memo[key] = name
        return self.memo[key]

    def _transposed(self, buf: Buffer) -> str:
        """Views of a (K, N) row-major tile as (N, K) for ldmatrix.trans (and without swizzle for the fragment)."""
        key = ("transposed", buf.name)
        if key not in self.memo:
            lay = f"{buf.name}_layout"
            self.layouts += [
                K.SmemTransposeLayoutOp(name=f"{lay}_t", of=lay, shape=(buf.cols, buf.rows)),
                K.SmemTransposeLayoutOp(name=f"{lay}_t_plain", of=lay, shape=(buf.cols, buf.rows), strip_swizzle=True),
                K.SharedViewOp(name=f"{buf.name}t", of=buf.name, layout=f"{lay}_t"),
                K.SharedViewOp(name=f"{buf.name}t_plain", of=buf.name, layout=f"{lay}_t_plain")]
            self.names.taken.update({f"{buf.name}t", f"{buf.name}t_plain"})
            self.memo[key] = f"{buf.name}t"
        return self.memo[key]

    def _block_rows(self, am: int, op: GemmOp) -> None:
        """Every GEMM of a kernel has the block's rows as its M (both targets' rule)."""
        if self.m_rows is None:
            self.m_rows = am
        elif am != self.m_rows:
            raise fail(f"tlc build: every GEMM of a kernel shares the block's rows; this one has M = {am}, an earlier "
                       f"one {self.m_rows}", op.loc)

    def _accumulator(self, op: GemmOp, mma: str, am: int, bn: int, out: list[K.Op]) -> tuple[Slot, bool]:
        """The GEMM's accumulator and whether it is fresh (the caller declares and zeroes a fresh one):
        the register tile an accumulating GEMM adds into, checked against `mma` and the product's shape."""
        if op.accumulate:
            acc = self._target(op.operands[2], op.result, out, op.loc)
            if acc.mma != mma:
                raise fail(f"tlc build: accumulator '{op.operands[2].base}' was laid out for another GEMM kind; "
                           "accumulate into a register tile you allocated", op.loc)
            if (acc.rows, acc.cols) != (am, bn):
                raise fail(f"tlc build: accumulator '{op.operands[2].base}' is {acc.rows}×{acc.cols}, the product "
                           f"{am}×{bn}", op.loc)
            return acc, False
        b_slot = self.slots[op.operands[1].uid]
        logical = b_slot.logical_cols if (op.b_major == "mn" and b_slot.kind == "smem") else bn
        return self._bind(op.result, Slot("frag", self.names.fresh(f"acc_{op.result.base}"), am, bn,
                                          region=self.region, logical_cols=logical, mma=mma)), True

    def _GemmOp(self, op: GemmOp, region: Graph, out: list[K.Op]) -> None:
        mma = self.warp_plan.mma_of_gemm(op)
        a, am, ak, a_load = self._operand(op.operands[0], "A", op.a_major or "k", op, mma)
        b, bk, bn, b_load = self._operand(op.operands[1], "B", op.b_major or "k", op, mma)
        if ak != bk:
            raise fail(f"tlc build: GEMM inner dimensions differ: A is {am}×{ak}, B is {bk}×{bn}", op.loc)
        warps_m, warps_n = self.warp_plan.warps_of(mma)
        per_warp = 16 * warps_m
        if am % per_warp or bn % (16 * warps_n) or ak % 16:
            raise fail(f"tlc build: GEMM {am}×{bn}×{ak} does not fit mma.sync m16n8k16 on {warps_m}×{warps_n} warps: "
                       f"M must be a multiple of {per_warp}, N of {16 * warps_n} and K of 16", op.loc)
        self._block_rows(am, op)
        acc, fresh = self._accumulator(op, mma, am, bn, out)
        if fresh:
            out += [K.FragmentOp(name=acc.name, mma=mma, role="C", dtype="fp32", shape=(am, bn), loc=op.loc),
                    K.ClearOp(target=acc.name, loc=op.loc)]
        # One k-block per trip of an unrolled loop: load the shared operands' k-block, then its MMAs.
        # `prefetch-operands` moves each load one trip ahead.
        kb = self.names.fresh("kb")
        body: list[K.Op] = [
            K.CopyOp(copy=ld["copy"], src=ld["smem"], dst=Var(ld["view"]), kblock=Var(kb), reads=(ld["buf"],),
                     loc=op.loc) for ld in (a_load, b_load) if ld]
        body.append(K.MmaOp(mma=mma, acc=acc.name, a=a, b=b, kblock=Var(kb), loc=op.loc))
        out.append(K.ForOp(var=kb, start=Const(0), stop=Const(ak // 16), step=1, body=tuple(body), unroll=True,
                           loc=op.loc))

