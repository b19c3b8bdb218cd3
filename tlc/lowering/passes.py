"""The lowering passes, run after the TL pipeline on the same graph: `select-atoms` (target
choices) → `pipeline` (schedule, kernel IR) → `check-resources` (shared memory, registers).

They leave the TL graph alone and accumulate a `LoweringState` on the PassContext;
`--print-after` shows that state (the kernel IR text after `pipeline`):

    S = Q·K.T:  operand B K k-major  → ldmatrix (SM75_U32x4_LDSM_N)
    O += P·V:   operand A P          → registers (accumulator regrouped), B V mn-major → ldmatrix.trans
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from tlc.diagnostics import Diagnostic, Loc, Note, fail
from tlc.ir.graph import Graph
from tlc.ir.ops import AllocateOp, GemmOp, ReshapeOp
from tlc.kir.ops import ForOp, GemmOp as KirGemmOp, RetileAccToAOp, walk
from tlc.kir.text import print_kir
from tlc.lowering import layout_check
from tlc.lowering.resources import register_fragments, shared_buffers, shared_extent
from tlc.lowering.state import (DEFAULT_ARCH, Allocation, LoweringState, OperandLoad, ResourceReport, get_state,
                                start_state)
from tlc.passes.base import Pass, PassContext


def _state(ctx: PassContext, pass_name: str, needs: str) -> LoweringState:
    state = get_state(ctx)
    if state is None or getattr(state, needs) is None:
        raise fail(f"pass '{pass_name}' needs '{'select-atoms' if needs == 'config' else 'pipeline'}' to run "
                   "first (the lowering order is select-atoms, pipeline, check-resources)")
    return state


def _gemm_text(op: GemmOp) -> str:
    a, b = op.operands[0].base, op.operands[1].base
    eq = "+=" if op.accumulate else "="
    return f"{op.results[0].base} {eq} {a}{'.T' if op.trans_a else ''}·{b}{'.T' if op.trans_b else ''}"


def _row_bytes_swizzle(width: int, elem_bytes: int) -> tuple[int, int, int]:
    """Swizzle<B,3,3> over a row atom of 64 (or 32) elements: B = log2(16-byte chunks per row),
    so the 8 rows of an ldmatrix phase land in 8 different bank groups (layout_check (c))."""
    atom = 64 if width % 64 == 0 else 32
    chunks = min(atom * elem_bytes // 16, 8)
    return (chunks.bit_length() - 1, 3, 3)


@dataclass(frozen=True)
class SelectAtomsPass(Pass):
    """Fix the target choices: MMA atom, warps, per-operand loads, swizzles."""

    name: ClassVar[str] = "select-atoms"
    arch: str = ""  # overrides the context's target (tlc show has no --arch)

    def apply(self, ctx: PassContext, graph: Graph) -> None:
        from tlc.lowering.select_atoms import flash_config, select_attention

        arch = self.arch or ctx.arch or DEFAULT_ARCH
        state = get_state(ctx)
        if state is None or state.arch.name != arch:
            state = start_state(ctx, arch, name=Path(graph.file).stem.replace("-", "_") or "tl_kernel")
        gemms = [(region, op) for region, op in graph.walk() if isinstance(op, GemmOp)]
        if state.arch.mma_path != "mma.sync":
            raise fail(f"--arch {arch}: the Hopper path ({state.arch.mma_path}, TMA) is not built yet; "
                       "--arch sm_90 runs the sm_80-family kernels on Hopper", gemms[0][1].loc if gemms else None)
        shape = select_attention(graph, arch)
        state.shape, state.config = shape, flash_config(shape, name=state.name, lse=state.lse)
        state.mma_atom, state.warps = state.arch.mma_atoms[shape.dtype], (state.config.warps, 1, 1)
        state.tl_allocs = {f"{op.name}@{op.space}": (f"Allocate {op.name} in {op.space}", op.loc)
                           for _, op in graph.walk() if isinstance(op, AllocateOp) and op.space != "global"}
        state.loads = [self._load(ctx, state, region, op, role) for region, op in gemms for role in "AB"]
        elem = 2 if shape.dtype in ("bf16", "fp16") else 4
        for ld in state.loads:
            if ld.load != "registers":
                width = shape.d_v if (ld.role, ld.major) == ("B", "mn") else shape.d_qk
                state.swizzles[ld.tensor] = _row_bytes_swizzle(width, elem)

    @staticmethod
    def _load(ctx: PassContext, state: LoweringState, region: Graph, op: GemmOp, role: str) -> OperandLoad:
        value = op.operands[0 if role == "A" else 1]
        if isinstance(region.producer(value), ReshapeOp):
            # P stays in registers: only sound if the accumulator regroup gives the A layout.
            if problems := layout_check.regroup_problems():
                ctx.error(f"internal: accumulator → A regroup is wrong: {problems[0]}", op.loc)
            return OperandLoad(_gemm_text(op), role, value.base, "acc", "registers", "", op.loc)
        major = op.a_major if role == "A" else op.b_major
        if major is None:
            raise fail(f"select-atoms needs 'resolve-transpose' to have run (GEMM operand {value.base} has "
                       "no majorness)", op.loc)
        load = layout_check.required_load(role, major)
        atom = state.arch.copy_atoms["s2r" if load == "ldmatrix" else "s2r_trans"]
        return OperandLoad(_gemm_text(op), role, value.base, major, load, atom, op.loc)

    def print_state(self, ctx: PassContext) -> str:
        state = get_state(ctx)
        return state.describe_atoms() if state and state.shape else "// select-atoms: nothing selected\n"


@dataclass(frozen=True)
class PipelinePass(Pass):
    """Stages (double-buffered K/V by default where shared memory allows), prefetch order,
    then the kernel IR; checked against select-atoms' choices and the swizzle rule."""

    name: ClassVar[str] = "pipeline"
    stages: int = 0  # 0: choose; Param Stages or this option fixes it

    def apply(self, ctx: PassContext, graph: Graph) -> None:
        from tlc.kir.flash_fwd import build_flash_fwd_kir

        state = _state(ctx, self.name, "config")
        cfg, limit = state.config, state.arch.smem_per_block
        if self.stages:
            stages, why = self.stages, f"pipeline{{stages={self.stages}}}"
        elif "Stages" in graph.params:
            stages, why = cfg.stages, "Param Stages"
        else:
            need = dataclasses.replace(cfg, stages=2).smem_bytes()
            stages = 2 if need <= limit else 1
            why = (f"double-buffered K/V fits ({need} of {limit} bytes)" if stages == 2 else
                   f"2 stages would need {need} > {limit} bytes of shared memory; one buffer, FA2's overlap")
        state.config = dataclasses.replace(cfg, stages=stages)
        state.stages, state.stages_reason = stages, why
        state.kir = build_flash_fwd_kir(state.config)
        loops = [op for op in walk(state.kir) if isinstance(op, ForOp)]
        state.prefetch = ("next K/V tile issued before the current tile's compute"
                          if any(lp.prefetch for lp in loops) else "no prefetch")
        for problem in self._disagreements(state):
            ctx.error(f"internal: the kernel IR disagrees with the layout checks: {problem}", state.shape.loc)

    @staticmethod
    def _disagreements(state: LoweringState) -> list[str]:
        kir_gemms = [op for op in walk(state.kir) if isinstance(op, KirGemmOp)]
        tl = [(state.loads[2 * i], state.loads[2 * i + 1]) for i in range(len(state.loads) // 2)]
        chosen, problems = {}, []
        for g, (a, b) in zip(kir_gemms, tl):
            for ld, copy, smem, frag in ((a, g.a_copy, g.a_smem, g.a), (b, g.b_copy, g.b_smem, g.b)):
                if ld.load != "registers":
                    chosen[copy] = ld.load
                elif smem is not None or not any(isinstance(op, RetileAccToAOp) and op.name == frag
                                                  for op in walk(state.kir)):
                    problems.append(f"{ld.tensor} should stay in registers (regrouped accumulator) in {ld.gemm}")
        return problems + layout_check.check_program(state.kir, chosen)

    def print_state(self, ctx: PassContext) -> str:
        state = get_state(ctx)
        if state is None or state.kir is None:
            return "// pipeline: no kernel IR\n"
        return (f"// schedule: {state.stages} stage(s) ({state.stages_reason}); {state.prefetch}\n"
                + print_kir(state.kir))


@dataclass(frozen=True)
class CheckResourcesPass(Pass):
    """Shared memory (from the KIR's buffers and layouts) and a register estimate per thread
    against `tlc.arch`; one error per exhausted resource, at the TL line of its biggest user."""

    name: ClassVar[str] = "check-resources"

    def apply(self, ctx: PassContext, graph: Graph) -> None:
        state = _state(ctx, self.name, "kir")
        arch, where = state.arch, state.shape.loc
        tl_gemms = [op for _, op in graph.walk() if isinstance(op, GemmOp)]
        for kernel in state.kir.kernels():
            smem = []
            for b in shared_buffers(kernel):
                stmt, loc = state.tl_allocs.get(f"{b.name[1:]}@shared", ("", None))
                tile = "×".join(map(str, b.shape[:2]))
                tl = (f"{stmt}: {tile} {b.dtype}" if stmt else "epilogue staging") + (
                    f" × {b.shape[2]} stage(s)" if len(b.shape) == 3 else "")
                smem.append(Allocation(b.name, tl, b.bytes, loc, f"reuses {b.reuses}" if b.reuses else ""))
            extent = shared_extent(shared_buffers(kernel))
            frags, resident, peak = register_fragments(kernel)
            kir_gemms = [op for op in walk(kernel) if isinstance(op, KirGemmOp)]
            regs = []
            for f in (f for f in frags if f.what == "accumulator"):
                tl, loc = self._tl_of_fragment(state, f.name, kir_gemms, tl_gemms)
                regs.append(Allocation(f.name, tl, f.regs, loc, "resident" if f.resident else "per KV tile"))
            rows = [f for f in frags if f.what == "row vector"]
            if rows:
                regs.append(Allocation("row stats", f"per-row statistics ({', '.join(f.name for f in rows)})",
                                       sum(f.regs for f in rows), None, "resident"))
            hard = resident + max((f.regs for f in frags if not f.resident), default=0)
            state.resources = ResourceReport(tuple(smem), extent, arch.smem_per_block, tuple(regs), resident, peak,
                                             arch.regs_per_thread)
            if extent > arch.smem_per_block:
                self._over(ctx, "shared memory", f"{extent} bytes per block", f"{arch.smem_per_block} bytes "
                           f"({arch.smem_per_block // 1024} KB) of {arch.name}", [a for a in smem if not a.note],
                           " bytes", where, "lower BM, BN or the head dim, set Param Stages = 1, or target an arch "
                           "with more shared memory (sm_80: 163 KB, sm_90: 227 KB)")
            if hard > arch.regs_per_thread:
                self._over(ctx, "registers", f"{hard} registers per thread for accumulators and row statistics "
                           "alone", f"{arch.regs_per_thread} per thread", regs,
                           " registers", where, "lower BM or the head dim, or raise Param Warps")
            elif peak > arch.regs_per_thread:
                ctx.sink.extend([Diagnostic("warning", f"registers: about {peak} per thread at the hungriest GEMM "
                                            f"(estimate, data only) exceeds {arch.regs_per_thread}; expect spills",
                                            where)])

    @staticmethod
    def _tl_of_fragment(state: LoweringState, name: str, kir_gemms: list,
                        tl_gemms: list) -> tuple[str, Loc | None]:
        """The TL statement a register fragment implements: an accumulator's Allocate or GEMM."""
        for kg, tg in zip(kir_gemms, tl_gemms):
            if kg.acc == name:
                key = f"{tg.results[0].base}@register"
                if tg.accumulate and key in state.tl_allocs:
                    return state.tl_allocs[key]
                return f"result of GEMM {_gemm_text(tg)}", tg.loc
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


def lowering_pipeline(arch: str | None = None) -> list[str]:
    """The lowering passes as pipeline entries, with the target pinned when given."""
    from tlc.passes.pipeline import LOWERING_PIPELINE

    return [f"select-atoms{{arch={arch}}}" if arch and p == "select-atoms" else p for p in LOWERING_PIPELINE]


def full_pipeline(arch: str | None = None) -> list[str]:
    """DEFAULT_PIPELINE then the lowering: what `tlc show --print-after pipeline` runs."""
    from tlc.passes.pipeline import DEFAULT_PIPELINE

    return [*DEFAULT_PIPELINE, *lowering_pipeline(arch)]


def run_lowering(graph: Graph, arch: str, *, name: str, lse: bool = False,
                 ctx: PassContext | None = None) -> tuple[LoweringState, PassContext]:
    """Run select-atoms → pipeline → check-resources on a graph the TL pipeline has processed."""
    from tlc.passes.pipeline import PassManager, parse_pipeline

    ctx = ctx or PassContext(arch=arch)
    ctx.arch = arch
    start_state(ctx, arch, name=name, lse=lse)
    PassManager(parse_pipeline(",".join(lowering_pipeline()))).run(graph, ctx)
    return get_state(ctx), ctx  # type: ignore[return-value]
