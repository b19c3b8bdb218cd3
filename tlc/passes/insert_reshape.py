"""insert-reshape: an accumulator that reaches a GEMM's A operand (directly or through
elementwise ops, masks and softmax) gets the Reshape the paper's prompts require —
accumulator fragment → A-operand fragment, and fp32 → the program's element type.
The paper's most common LLM failure; a Reshape to the wrong layout is an error.

    %P, %m, %l = softmax(%S.2)                          %P, %m, %l = softmax(%S.2)
    %O.3 = gemm(%P, %V.4, %O.2)               →         %P.1 = reshape(%P) {dst_modes = (MMA_A, …), dtype = bf16}
                                                        %O.3 = gemm(%P.1, %V.4, %O.2)
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, Iterator

from tlc.diagnostics import Note
from tlc.ir.graph import Graph
from tlc.ir.ops import AllocateOp, CopyOp, FullOp, GemmOp, LoopOp, Op, ReshapeOp, RowReduceOp, ScalarOp, SoftmaxOp
from tlc.ir.types import MMA_ROLE, TileType, Value
from tlc.names import fresh_value_name
from tlc.passes.base import Pass, PassContext
from tlc.passes.infer_shapes import program_dtype

SRC_MODES = ("MMA_C", "MMA_M", "MMA_N")
DST_MODES = ("MMA_A", "MMA_M", "MMA_N")
_OPAQUE = (AllocateOp, CopyOp, ScalarOp, FullOp)  # a fresh layout starts here, not an accumulator's


def layout_sources(region: Graph, value: Value) -> Iterator[Op]:
    """The GEMMs and Reshapes whose fragment layout `value` inherits: its producers,
    followed back through every other register op and loop-carried value. Row vectors
    (softmax statistics, row reductions) carry no fragment layout and end a path."""
    producers: dict[int, Op] = {}
    for _, op in region.root().walk():
        producers.update((r.uid, op) for r in op.results)
        if isinstance(op, LoopOp):
            producers.update((a.uid, op) for a in op.args[1:])
    seen: set[int] = set()
    stack = [value]
    while stack:
        v = stack.pop()
        op = producers.get(v.uid)
        if v.uid in seen or op is None or isinstance(op, _OPAQUE):
            continue
        seen.add(v.uid)
        if isinstance(op, (GemmOp, ReshapeOp)):
            yield op
        elif isinstance(op, LoopOp):
            for i, a in enumerate(op.args[1:]):
                if a is v:
                    stack += [op.operands[i], op.yields[i]]
            for i, r in enumerate(op.results):
                if r is v:
                    stack += [op.yields[i]] + ([op.operands[i]] if i < len(op.operands) else [])
        elif isinstance(op, RowReduceOp) or (isinstance(op, SoftmaxOp) and v is not op.results[0]):
            continue
        else:
            stack.extend(op.operands)


def reshape_role(op: ReshapeOp) -> str:
    return MMA_ROLE.get(op.dst_modes[0], "none") if op.dst_modes else "none"


def _region_of(graph: Graph, value: Value) -> tuple[Graph, Op] | None:
    for region, op in graph.walk():
        if any(r is value for r in op.results):
            return region, op
        if isinstance(op, LoopOp) and op.body is not None and any(a is value for a in op.args):
            return op.body, op
    return None




@dataclass(frozen=True)
class InsertReshapePass(Pass):
    name: ClassVar[str] = "insert-reshape"

    def apply(self, ctx: PassContext, graph: Graph) -> None:
        missing: dict[int, list[tuple[Graph, GemmOp]]] = {}
        values: dict[int, Value] = {}
        for region, op in list(graph.walk()):
            if not isinstance(op, GemmOp):
                continue
            a_sources = list(layout_sources(region, op.operands[0]))
            if any(isinstance(s, GemmOp) for s in a_sources):
                missing.setdefault(op.operands[0].uid, []).append((region, op))
                values[op.operands[0].uid] = op.operands[0]
            self.check_reshapes(ctx, op, a_sources, "A")
            b_sources = list(layout_sources(region, op.operands[1]))
            self.check_reshapes(ctx, op, b_sources, "B")
            for src in b_sources:
                if isinstance(src, GemmOp):
                    ctx.error(f"the accumulator of the GEMM at line {src.loc.line} reaches the B operand "
                              f"'{op.operands[1].base}' of this GEMM; no register Reshape makes an accumulator "
                              "a B fragment: copy it through shared memory", op.loc)
        for region, op in graph.walk():
            if isinstance(op, ReshapeOp) and op.src_modes[:1] != ("MMA_C",) and any(
                    isinstance(s, GemmOp) for s in layout_sources(region, op.operands[0])):
                ctx.error(f"'{op.operands[0].base}' is a GEMM accumulator, so its layout is MMA_C: write "
                          f"'Reshape {op.operands[0].base} from (MMA_C, MMA_M, MMA_N) to …', not from "
                          f"{op.src_modes[0] if op.src_modes else '()'}", op.loc)
        for uid, uses in missing.items():
            self.insert(ctx, graph, values[uid], uses)

    @staticmethod
    def check_reshapes(ctx: PassContext, gemm: GemmOp, sources: list[Op], want: str) -> None:
        other = gemm.operands[1 if want == "A" else 0]
        for src in sources:
            if not isinstance(src, ReshapeOp):
                continue
            if reshape_role(src) == want:
                if src.dtype and other.type.dtype and src.dtype != other.type.dtype:
                    ctx.error(f"Reshape of '{src.operands[0].base}' converts to {src.dtype}, but the other operand "
                              f"'{other.base}' of the GEMM at line {gemm.loc.line} is {other.type.dtype}; the MMA "
                              f"takes one element type: write 'as {other.type.dtype}'", src.loc)
                continue
            operand = gemm.operands[0 if want == "A" else 1].base
            dst = src.dst_modes[0] if src.dst_modes else "?"
            ctx.error(f"Reshape of '{src.operands[0].base}' to {dst} feeds the {want} operand '{operand}' of the GEMM "
                      f"at line {gemm.loc.line}, which needs MMA_{want}: write "
                      f"'Reshape {src.operands[0].base} from (MMA_C, MMA_M, MMA_N) to (MMA_{want}, MMA_M, MMA_N)'",
                      src.loc, Note("the GEMM is here", gemm.loc))

    @staticmethod
    def insert(ctx: PassContext, graph: Graph, value: Value, uses: list[tuple[Graph, GemmOp]]) -> None:
        first = uses[0][1]
        dtype = program_dtype(graph) or first.operands[1].type.dtype
        new = Value(fresh_value_name(graph, value.base, bare=False), TileType("register", value.type.shape, dtype, "A"), value.base)
        reshape = ReshapeOp((new,), (value,), src_modes=SRC_MODES, dst_modes=DST_MODES, dtype=dtype, loc=first.loc)
        where = _region_of(graph, value)
        assert where is not None, f"{value} has no producer"
        region, producer = where
        if isinstance(producer, LoopOp) and region is producer.body:
            region.insert_before(region.ops()[0], reshape)
        else:
            region.insert_after(producer, reshape)
        for gregion, gemm in uses:
            gregion.replace(gemm, dataclasses.replace(gemm, operands=(new,) + gemm.operands[1:]))
        ctx.remark(f"'{value.base}' is an accumulator (MMA_C, fp32) used as the A operand of this GEMM; inserted "
                   f"'Reshape {value.base} from ({', '.join(SRC_MODES)}) to ({', '.join(DST_MODES)}) as {dtype}'",
                   first.loc)
