"""resolve-transpose: turn each GEMM's symbolic `.T` into the physical majorness of its
operands, repairing a missing or superfluous `.T` when the symbolic shapes leave one
reading only.

Tiles are stored as declared, (rows, cols) with cols contiguous. The MMA wants A as
(M, K) and B as (N, K), both K-contiguous ("k-major"). So K in `Q, K.T` is free (K is
stored (BN, HeadDim): k-major), while V in `P, V` is stored (BN, HeadDim) = (K, N):
N is contiguous ("mn-major"), which needs a transposing load (ldmatrix.trans).

    %S = gemm(%Q.3, %K.4) {trans_b = false, a_major = none, b_major = none}  : register(BM, BN) …
    remark: 'K' needs '.T' here: … ; reading the GEMM as 'Q, K.T'
    %S = gemm(%Q.3, %K.4) {trans_b = true, a_major = k, b_major = k}         : register(BM, BN) …
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from tlc.diagnostics import Note
from tlc.ir.graph import Graph
from tlc.ir.ops import GemmOp
from tlc.passes.base import Pass, PassContext
from tlc.passes.infer_shapes import Reading, gemm_readings, operand_text, shape_text


def a_major(trans_a: bool) -> str:
    """A is read (M, K): stored untransposed its K is contiguous."""
    return "mn" if trans_a else "k"


def b_major(trans_b: bool) -> str:
    """B is read (K, N): `.T` means it is stored (N, K), K contiguous, as the MMA wants."""
    return "k" if trans_b else "mn"


def needs_transposing_load(op: GemmOp) -> dict[str, bool]:
    """Which operand loads (shared → register) need ldmatrix.trans; the rest are free."""
    return {"A": op.a_major == "mn", "B": op.b_major == "mn"}


def _spelling(op: GemmOp, r: Reading) -> str:
    a, b = op.operands[0].base, op.operands[1].base
    return f"'Compute GEMM {a}{'.T' if r.trans_a else ''}, {b}{'.T' if r.trans_b else ''}'"


@dataclass(frozen=True)
class ResolveTransposePass(Pass):
    name: ClassVar[str] = "resolve-transpose"

    def apply(self, ctx: PassContext, graph: Graph) -> None:
        for region, op in list(graph.walk()):
            if isinstance(op, GemmOp):
                self.resolve(ctx, region, op)

    def resolve(self, ctx: PassContext, region: Graph, op: GemmOp) -> None:
        a, b = op.operands[0], op.operands[1]
        ta, tb = op.trans_a, op.trans_b
        if a.type.shape is not None and b.type.shape is not None:
            acc = op.operands[2].type.shape if op.accumulate else None
            readings = gemm_readings(op, a.type.shape, b.type.shape, acc)
            written_ok = any((r.trans_a, r.trans_b) == (ta, tb) for r in readings)
            written = (f"as written, {operand_text(a, ta, a.type.shape)} · "
                       f"{operand_text(b, tb, b.type.shape)} do not share an inner dimension")
            if not written_ok and len(readings) == 1:
                fix = readings[0]
                ctx.remark(f"{self._what(op, fix)}: {written}; reading the GEMM as {_spelling(op, fix)}, "
                           f"which gives {shape_text(fix.shape)}", op.loc)
                ta, tb = fix.trans_a, fix.trans_b
            elif not written_ok and len(readings) > 1:
                notes = [Note(f"reading {i + 1}: {_spelling(op, r)} gives {shape_text(r.shape)}", op.loc)
                         for i, r in enumerate(readings)]
                ctx.error(f"ambiguous '.T' in GEMM: {written}, and {len(readings)} placements of '.T' "
                          "type-check; write the one you mean", op.loc, *notes)
                return
        new = dataclasses.replace(op, trans_a=ta, trans_b=tb, a_major=a_major(ta), b_major=b_major(tb))
        if new.attrs() != op.attrs():
            region.replace(op, new)

    @staticmethod
    def _what(op: GemmOp, fix: Reading) -> str:
        parts = []
        for name, was, now in ((op.operands[0].base, op.trans_a, fix.trans_a),
                               (op.operands[1].base, op.trans_b, fix.trans_b)):
            if was != now:
                parts.append(f"'{name}' needs '.T' here" if now else f"'{name}.T' is superfluous here")
        return " and ".join(parts)
