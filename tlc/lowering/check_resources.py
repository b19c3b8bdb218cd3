"""`check-resources`: shared memory (from the kernel IR's buffers and layouts) and a register estimate per
thread against the arch table (tlc.lowering.resources keeps the accounting); an exhausted resource is an
error at the TL line of its biggest user, listing every allocation with the statement it implements.
Runs on the final buffers and fragments, after the schedule transforms that add stages or warp groups.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tlc.diagnostics import Diagnostic, Loc, Note
from tlc.ir.graph import Graph
from tlc.ir.ops import GemmOp
from tlc.kir.ops import MmaOp, walk
from tlc.kir.ops_sm90 import WarpSpecializeOp, WgmmaOp
from tlc.lowering.passes import lowered_state, refuse_partial_copies
from tlc.lowering.resources import (register_advice, register_fragments, register_use, shared_buffers,
                                    shared_extent)
from tlc.lowering.state import Allocation, LoweringState, ResourceReport, get_state
from tlc.passes.base import Pass, PassContext


@dataclass(frozen=True)
class CheckResourcesPass(Pass):
    """Shared memory (from the KIR's buffers and layouts) and a register estimate per thread
    against `tlc.arch`; one error per exhausted resource, at the TL line of its biggest user."""

    name: ClassVar[str] = "check-resources"

    def apply(self, ctx: PassContext, graph: Graph) -> None:
        state = lowered_state(ctx, self.name)
        refuse_partial_copies(state, "")   # a pipeline without warp-specialize
        arch, where = state.arch, state.loc
        tl_gemms = [op for _, op in graph.walk() if isinstance(op, GemmOp)]
        for kernel in state.kir.kernels():
            smem = []
            for b in shared_buffers(kernel):
                stmt, loc = state.tl_allocs.get(b.name, ("", None))
                tile = "×".join(map(str, b.shape[:2]))
                tl = (f"{stmt}: {tile} {b.dtype}" if stmt else "epilogue staging") + (
                    f" × {b.shape[2]} stage(s)" if len(b.shape) == 3 else "")
                smem.append(Allocation(b.name, tl, b.bytes, loc, f"reuses {b.reuses}" if b.reuses else ""))
            extent = shared_extent(shared_buffers(kernel))
            frags, resident, peak = register_fragments(kernel)
            kir_gemms = [op for op in walk(kernel) if isinstance(op, (MmaOp, WgmmaOp))]
            regs = []
            for f in (f for f in frags if f.what == "accumulator"):
                tl, loc = self._tl_of_fragment(state, f.name, kir_gemms, tl_gemms)
                regs.append(Allocation(f.name, tl, f.regs, loc, "resident" if f.resident else "per KV tile"))
            rows = [f for f in frags if f.what == "row vector"]
            if rows:
                regs.append(Allocation("row stats", f"per-row statistics ({', '.join(f.name for f in rows)})",
                                       sum(f.regs for f in rows), None, "resident"))
            hard = resident + max((f.regs for f in frags if not f.resident), default=0)
            # A warp-specialised kernel's consumers run with the registers setmaxnreg gives them.
            limit = min([arch.regs_per_thread] + [op.consumer_regs for op in walk(kernel)
                                                  if isinstance(op, WarpSpecializeOp)])
            state.resources = ResourceReport(tuple(smem), extent, arch.smem_per_block, tuple(regs), resident, peak,
                                             limit)
            if extent > arch.smem_per_block:
                self._over(ctx, "shared memory", f"{extent} bytes per block", f"{arch.smem_per_block} bytes "
                           f"({arch.smem_per_block // 1024} KB) of {arch.name}", [a for a in smem if not a.note],
                           " bytes", where, "lower BM, BN or the head dim, set Param Stages = 1, or target an arch "
                           "with more shared memory (sm_80: 163 KB, sm_90: 227 KB)")
            if hard > limit:
                self._over(ctx, "registers", f"{hard} registers per thread for accumulators and row statistics "
                           "alone", f"{limit} per thread on {arch.name}", regs,
                           " registers", where, "lower BM or the head dim, or raise Param Warps")
            elif peak > limit:
                ctx.sink.extend([Diagnostic("warning", f"registers: about {peak} per thread at the hungriest GEMM "
                                            f"(estimate, data only) exceeds {limit} on {arch.name}; expect spills: "
                                            f"{register_use(state.resources)}; {register_advice(kernel)}",
                                            where)])

    @staticmethod
    def _tl_of_fragment(state: LoweringState, name: str, kir_gemms: list,
                        tl_gemms: list) -> tuple[str, Loc | None]:
        """The TL statement a register fragment implements: an accumulator's Allocate or GEMM."""
        if name in state.tl_allocs:
            return state.tl_allocs[name]
        for kg, tg in zip(kir_gemms, tl_gemms):
            if kg.acc == name:
                key = f"{tg.results[0].base}@register"
                if tg.accumulate and key in state.tl_allocs:
                    return state.tl_allocs[key]
                return f"result of the GEMM at line {tg.loc.line}", tg.loc
        return "per-row statistics (online softmax, epilogue)", None

    @staticmethod
    def _over(ctx: PassContext, what: str, need: str, limit: str, allocs: list[Allocation], unit: str,
              fallback: Loc, fix: str) -> None:
        allocs = sorted(allocs, key=lambda a: -a.bytes)
        listed = ", ".join(f"{a.name} {a.bytes}{unit}" for a in allocs)
        loc = next((a.loc for a in allocs if a.loc is not None), fallback)
        notes = [Note(f"{a.name}: {a.bytes}{unit} for {a.tl}", a.loc) for a in allocs]
        ctx.error(f"{what}: the kernel needs {need}, over the limit of {limit}; allocations: {listed}", loc,
                  *notes, Note(f"to fit: {fix}"))

    def print_state(self, ctx: PassContext) -> str:
        state = get_state(ctx)
        return state.resources.describe() + "\n" if state and state.resources else "// check-resources: no report\n"
