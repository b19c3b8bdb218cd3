"""The lowering passes, run after the TL pipeline on the same graph; state accumulates on the
PassContext (`LoweringState`) and `--print-after` shows the kernel IR after each:

    lower-tile-ops   each TL op by its own rule → kernel IR (no sync, one stage, no swizzle)
    infer-layouts    shared layouts' swizzles from how the tiles are read
    warp-specialize  sm_90a: TMA loads into an mbarrier ring, a producer warp group, consumer warp groups
    insert-sync      cp.async waits and barriers from the shared-memory effects
    pipeline         multi-stage copies of a loop (Param Stages, else 2 where shared memory allows)
    prefetch-operands each GEMM's shared→register loads one k-block ahead of its MMAs
    defer-reductions running row sums reduced across lanes once, after the loop
    overlap-gemms    sm_90a: a warp-specialised loop's next first GEMM overlaps this trip's second and the softmax
    check-resources  shared memory and a register estimate against the arch table
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

from tlc.diagnostics import Diagnostic, Loc, Note, fail
from tlc.ir.graph import Graph
from tlc.ir.ops import GemmOp, LoopOp, MaskOp
from tlc.kir.ops import Exp2ScaleOp, ForOp, KernelOp, MmaOp, RowReduceOp, rewrite_ops, walk
from tlc.kir.ops_sm90 import WarpSpecializeOp, WgmmaOp
from tlc.kir.text import print_kir
from tlc.lowering import layout_check
from tlc.lowering.resources import (register_advice, register_fragments, register_use, shared_buffers,
                                    shared_extent)
from tlc.lowering.switches import fold_partitions_enabled, fold_wgmma_enabled
from tlc.lowering.state import DEFAULT_ARCH, Allocation, LoweringState, ResourceReport, get_state, start_state
from tlc.names import kernel_name
from tlc.passes.base import Pass, PassContext


def _state(ctx: PassContext, pass_name: str) -> LoweringState:
    state = get_state(ctx)
    if state is None or state.kir is None:
        raise fail(f"pass '{pass_name}' needs 'lower-tile-ops' to run first (the lowering order is "
                   f"{', '.join(LOWERING_ORDER)})")
    return state


def _with_kernel(state: LoweringState, kernel: KernelOp) -> None:
    params = [op for op in state.kir.body if not isinstance(op, KernelOp)]
    state.kir = dataclasses.replace(state.kir, body=(*params, kernel))
    state.kir.verify()


def _kernel(state: LoweringState) -> KernelOp:
    return state.kir.kernels()[0]


def _set_on_every(state: LoweringState, cls: type, **values) -> int:
    """Sets `values` on every `cls` op of the kernel; how many there are."""
    kernel = _kernel(state)
    body = rewrite_ops(kernel.body, lambda op: dataclasses.replace(op, **values) if isinstance(op, cls) else op)
    _with_kernel(state, dataclasses.replace(kernel, body=body))
    return sum(isinstance(op, cls) for op in walk(_kernel(state)))


LOWERING_ORDER = ("lower-tile-ops", "infer-layouts", "warp-specialize", "insert-sync", "pipeline", "prefetch-operands",
                  "defer-reductions", "overlap-gemms", "check-resources")


@dataclass(frozen=True)
class LowerTileOpsPass(Pass):
    """Each TL op by its own rule into kernel IR (tlc.lowering.tile_ops)."""

    name: ClassVar[str] = "lower-tile-ops"
    arch: str = ""  # overrides the context's target (tlc show has no --arch)

    def apply(self, ctx: PassContext, graph: Graph) -> None:
        from tlc.lowering.tile_ops import TileOpLowering

        arch = self.arch or ctx.arch or DEFAULT_ARCH
        state = get_state(ctx)
        if state is None or state.arch.name != arch:
            state = start_state(ctx, arch, name=kernel_name(graph.file))
        if state.lse:
            raise fail("tlc build: the log-sum-exp output is not lowered from TL programs yet; build without lse")
        lowering = TileOpLowering(graph, state.arch, state.name)
        state.kir, state.abi = lowering.run(), lowering.abi
        state.partial_copies = list(lowering.partial_copies)
        state.tl_allocs = {b.name: (f"Allocate {b.tl_name} in shared", b.loc) for b in lowering.buffers.values()
                           if not b.reuse}
        state.tl_allocs.update(lowering.register_allocs)
        state.loc = next((op.loc for _, op in graph.walk() if isinstance(op, GemmOp)), None)

    def print_state(self, ctx: PassContext) -> str:
        state = get_state(ctx)
        return print_kir(state.kir) if state and state.kir else "// lower-tile-ops: no kernel IR\n"


def _schedule_param(graph: Graph, name: str, default, ok, want: str):
    """A schedule Param's value (or `default`), refused at its `Param` line unless `ok(value)`."""
    value = graph.params.get(name, default)
    if not ok(value):
        raise fail(f"Param {name} = {value!r}: {want}", graph.param_locs.get(name))
    return value


def _bool_param(graph: Graph, name: str, default: bool) -> bool:
    return _schedule_param(graph, name, default, lambda v: isinstance(v, bool), "use true or false")


def _needs(graph: Graph, knob: str, on: bool, needed: str, why: str) -> None:
    """A schedule knob that only refines another: set without it, refused at its `Param` line (it would
    change nothing)."""
    if on and not _bool_param(graph, needed, False):
        raise fail(f"{knob} = true needs {needed} = true ({why}); set both, or drop {knob}",
                   graph.param_locs.get(knob))


def _stages(graph: Graph, option: int, most: int, what: str) -> int:
    return option or _schedule_param(graph, "Stages", 2, lambda v: isinstance(v, int) and not isinstance(v, bool)
                                     and 1 <= v <= most, what)


@dataclass(frozen=True)
class InferLayoutsPass(Pass):
    """Swizzled shared layouts from how each tile is read (tlc.lowering.layouts)."""

    name: ClassVar[str] = "infer-layouts"

    def apply(self, ctx: PassContext, graph: Graph) -> None:
        from tlc.lowering.layouts import infer_layouts

        state = _state(ctx, self.name)
        kernel, state.layout_notes = infer_layouts(_kernel(state))
        _with_kernel(state, kernel)
        for problem in layout_check.check_program(state.kir, {}):
            ctx.error(f"internal: a shared layout fails the bank-conflict check: {problem}", state.loc)

    def print_state(self, ctx: PassContext) -> str:
        state = get_state(ctx)
        return ("\n".join(f"// {n}" for n in state.layout_notes) + "\n" + print_kir(state.kir)) if state else ""


@dataclass(frozen=True)
class _KernelPass(Pass):
    """A kernel-IR pass whose printed state is the kernel IR it leaves."""

    def print_state(self, ctx: PassContext) -> str:
        state = get_state(ctx)
        return print_kir(state.kir) if state and state.kir else ""


@dataclass(frozen=True)
class _ScheduleRewritePass(_KernelPass):
    """A kernel-IR rewrite `kernel → (kernel, notes)` whose notes join the schedule listing."""

    def rewrite(self, kernel):
        raise NotImplementedError

    def apply(self, ctx: PassContext, graph: Graph) -> None:
        state = _state(ctx, self.name)
        kernel, notes = self.rewrite(_kernel(state))
        state.schedule = list(state.schedule) + notes
        _with_kernel(state, kernel)


@dataclass(frozen=True)
class _ScheduleProgramRewritePass(_KernelPass):
    """A kernel-IR rewrite of the whole program `(program, arch) → (program, notes)`, for passes that change
    the parameter struct too; its notes join the schedule listing."""

    def rewrite_program(self, program, arch):
        raise NotImplementedError

    def apply(self, ctx: PassContext, graph: Graph) -> None:
        state = _state(ctx, self.name)
        state.kir, notes = self.rewrite_program(state.kir, state.arch)
        state.schedule = list(state.schedule) + notes


@dataclass(frozen=True)
class _ScheduleListingPass(Pass):
    """A pass whose printed state is the schedule's notes so far, then the kernel IR it leaves."""

    def print_state(self, ctx: PassContext) -> str:
        state = get_state(ctx)
        if state is None or state.kir is None:
            return f"// {self.name}: no kernel IR\n"
        return "".join(f"// schedule: {r}\n" for r in state.schedule) + print_kir(state.kir)


@dataclass(frozen=True)
class _OptInPass(Pass):
    """A schedule pass that `Param <switch> = true` turns on (off by default), with at most one bool Param
    that refines it (`refinement`: refused at its line without the switch), passed on as `self.refined` (set
    from the Params, so not a pipeline option)."""

    switch: ClassVar[str] = ""
    refinement: ClassVar[str | None] = None
    refinement_why: ClassVar[str] = ""
    refined: ClassVar[bool] = False

    def apply(self, ctx: PassContext, graph: Graph) -> None:
        refined = False
        if self.refinement is not None:
            refined = _bool_param(graph, self.refinement, False)
            _needs(graph, self.refinement, refined, self.switch, self.refinement_why)
        if _bool_param(graph, self.switch, False):
            object.__setattr__(self, "refined", refined)
            super().apply(ctx, graph)


@dataclass(frozen=True)
class WarpSpecializePass(_ScheduleListingPass):
    """sm_90a: TMA loads, mbarrier rings and producer/consumer warp groups (tlc.lowering.warp_specialize).
    Stages: this option, else Param Stages, else 2 where shared memory allows. `Param WarpSpecialize =
    false` keeps the cp.async schedule; other targets and programs it does not cover keep it too.
    `Param TmaStore = true` stores the epilogue's tile with TMA (a fifth less NVRTC time, 1-2 % slower
    on short sequences on an H200: off by default, docs/hopper.md)."""

    name: ClassVar[str] = "warp-specialize"
    stages: int = 0

    def apply(self, ctx: PassContext, graph: Graph) -> None:
        from tlc.lowering.warp_specialize import warp_specialize

        state = _state(ctx, self.name)
        wanted, store = _bool_param(graph, "WarpSpecialize", True), _bool_param(graph, "TmaStore", False)
        from tlc.lowering.rules import FAMILIES

        family = FAMILIES.get(state.arch.mma_path)
        if not wanted or family is None or not family.tma_copies:
            refuse_partial_copies(state, "WarpSpecialize is false" if not wanted else "")
            return
        stages = _stages(graph, self.stages, 4, "the TMA ring takes 1 to 4 stages")
        state.kir, notes = warp_specialize(state.kir, stages, state.arch.smem_per_block, tma_store=store)
        state.schedule = list(state.schedule) + notes
        state.kir.verify()
        refuse_partial_copies(state, "; ".join(n.split(": ", 1)[1] for n in notes
                                               if "kept the cp.async" in n or "keeps its copy" in n))


def refuse_partial_copies(state: LoweringState, why_kept: str) -> None:
    """A cp.async tiled copy lower-tile-ops allowed only for TMA to replace, still in use: its error.
    Checked once: after warp-specialize, or by check-resources in a pipeline without it."""
    if not state.partial_copies:
        return
    used = {n for op in walk(state.kir) for n in op.used_names()}
    for name, why, loc in state.partial_copies:
        if name in used:
            raise fail(why + (f" (the copies stay cp.async: {why_kept})" if why_kept else ""), loc)
    state.partial_copies = []


@dataclass(frozen=True)
class OverlapGemmsPass(_ScheduleListingPass, _ScheduleRewritePass):
    """sm_90a, warp-specialised loops: the next tile's first GEMM and this tile's second overlap the
    softmax, and the consumer warp groups take turns issuing (tlc.lowering.overlap_gemms).
    `Param Overlap = false` keeps each trip's order; `Param PingPong = false` lets the groups issue freely."""

    name: ClassVar[str] = "overlap-gemms"
    pingpong: bool = True

    def apply(self, ctx: PassContext, graph: Graph) -> None:
        overlap, pingpong = _bool_param(graph, "Overlap", True), _bool_param(graph, "PingPong", True)
        if overlap:
            object.__setattr__(self, "pingpong", pingpong)
            super().apply(ctx, graph)

    def rewrite(self, kernel):
        from tlc.lowering.overlap_gemms import overlap_gemms

        return overlap_gemms(kernel, self.pingpong)


@dataclass(frozen=True)
class PersistentPass(_OptInPass, _ScheduleListingPass, _ScheduleProgramRewritePass):
    """sm_90a, warp-specialised kernels: a CTA per resident slot loops over the output tiles, the
    producer loading the next tile while the consumers finish this one (tlc.lowering.persistent).
    `Param Persistent = true` turns it on (off by default); `Param StaticTiles = true` hands each CTA the
    tiles blockIdx.x + k·gridDim.x instead of a dynamic scheduler's (the producer's TMA coordinates then
    stay uniform: no register→uniform moves per load)."""

    name: ClassVar[str] = "persistent"
    switch: ClassVar[str] = "Persistent"
    refinement: ClassVar[str | None] = "StaticTiles"
    refinement_why: ClassVar[str] = "it picks how a persistent kernel's CTAs take their tiles"

    def rewrite_program(self, program, arch):
        from tlc.lowering.persistent import make_persistent

        return make_persistent(program, arch.smem_per_block, self.refined)


@dataclass(frozen=True)
class L2SectionsPass(_OptInPass, _ScheduleListingPass, _ScheduleRewritePass):
    """sm_90a, causal, one tile per CTA: the grid's tiles in L2-sized sections of heads, each section's
    query tiles longest first, so the SMs finish together and the K/V read at once fits L2
    (tlc.lowering.l2_sections). `Param L2Sections = true` turns it on (off by default: on an H200 it ran
    1.04-1.06x at d = 256 causal but 0.975-0.995x on the other causal rows; tlc.tuning sets it at d = 256);
    `Param L2TailOnly = true` reorders only the last section's heads (the grid's tail)."""

    name: ClassVar[str] = "l2-sections"
    switch: ClassVar[str] = "L2Sections"
    refinement: ClassVar[str | None] = "L2TailOnly"
    refinement_why: ClassVar[str] = "it picks which heads l2-sections reorders"

    def rewrite(self, kernel):
        from tlc.lowering.l2_sections import l2_sections

        return l2_sections(kernel, self.refined)


@dataclass(frozen=True)
class PrefetchNextTilePass(_OptInPass, _ScheduleListingPass, _ScheduleProgramRewritePass):
    """sm_90a, one tile per CTA: the producer prefetches into L2 the once-loaded tiles (Q) of the CTA that
    starts one resident wave later (tlc.lowering.prefetch_next_tile), so that CTA's first GEMM does not wait
    on DRAM. `Param PrefetchNext = true` turns it on (off by default; tlc.tuning sets it for every one-tile
    kernel tlc.attention builds: 1.000-1.011x on the H200's bar rows, tlc/tuning.py SM90A_ONE_TILE_SCHEDULE)."""

    name: ClassVar[str] = "prefetch-next-tile"
    switch: ClassVar[str] = "PrefetchNext"

    def rewrite_program(self, program, arch):
        from tlc.lowering.prefetch_next_tile import prefetch_next_tile

        return prefetch_next_tile(program)


@dataclass(frozen=True)
class SplitMaskedTripsPass(_ScheduleListingPass):
    """A loop whose masks apply only from some trip on runs as two loops, the first without the mask
    code (tlc.lowering.split_masks). On by default in warp-specialised kernels, whose consumers have
    registers to spare; the sm_80-family kernels run at the register limit, where the second loop
    cost spills and 2-9 % on an H200, so they keep one loop unless `Param SplitMasked = true`.
    `Param SplitMasked = false` keeps one loop everywhere."""

    name: ClassVar[str] = "split-masked-trips"

    def apply(self, ctx: PassContext, graph: Graph) -> None:
        from tlc.lowering.split_masks import split_masked_trips

        wanted = _schedule_param(graph, "SplitMasked", None, lambda v: v is None or isinstance(v, bool),
                                 "use true or false")
        state = _state(ctx, self.name)
        kernel = _kernel(state)
        if wanted is None and not any(isinstance(op, WarpSpecializeOp) for op in walk(kernel)):
            state.schedule = list(state.schedule) + [
                "split-masked-trips: not warp-specialised, one loop (the second costs registers at the limit; "
                "Param SplitMasked = true splits)"]
            return
        if wanted is False:
            return
        kernel, notes = split_masked_trips(kernel)
        state.schedule = list(state.schedule) + notes
        _with_kernel(state, kernel)


@dataclass(frozen=True)
class SkipMaskedTripsPass(_OptInPass, _ScheduleListingPass, _ScheduleRewritePass):
    """sm_90a, causal, two or more consumer warp groups: each group skips the Q·Kᵀ, softmax and P·V of
    the trips its own rows mask entirely (tlc.lowering.skip_masked_trips), keeping every wait, release
    and barrier. `Param SkipMaskedTrips = true` turns it on (off by default: its guarded wgmma cost 0.4-2.3 %
    where little or nothing is skipped; tlc.tuning sets it for the sm_90a d = 64 causal kernels)."""

    name: ClassVar[str] = "skip-masked-trips"
    switch: ClassVar[str] = "SkipMaskedTrips"

    def apply(self, ctx: PassContext, graph: Graph) -> None:
        """Skipping a masked trip is exact only if such a trip changes nothing the loop carries
        (tlc.passes.masked_trips, checked on the TL graph); otherwise every group runs every trip."""
        from tlc.passes.masked_trips import masked_trip_changes

        if _bool_param(graph, self.switch, False):
            for _, op in graph.walk():
                causal = isinstance(op, LoopOp) and op.body is not None and any(
                    isinstance(m, MaskOp) and m.kind == "causal" for m in op.body.ops())
                why = masked_trip_changes(op, lambda m: m.kind == "causal") if causal else None
                if why:
                    state = _state(ctx, self.name)
                    state.schedule = list(state.schedule) + [f"skip-masked-trips: kept: {why}"]
                    return
        super().apply(ctx, graph)

    def rewrite(self, kernel):
        from tlc.lowering.skip_masked_trips import skip_masked_trips

        if not any(isinstance(op, WarpSpecializeOp) for op in walk(kernel)):
            return kernel, ["skip-masked-trips: kept: not warp-specialised (sm_90a only)"]
        return skip_masked_trips(kernel)


@dataclass(frozen=True)
class EmulateExp2Pass(_ScheduleListingPass):
    """`Param Exp2Poly = k` (k > 0): every k-th exp2 of each thread's scores by a polynomial on the FMA
    pipe (tlc::exp2_poly) instead of the MUFU unit, whose 16 results per clock and SM bound the softmax
    when the head dim is small (d = 64: as many cycles of exp2 as of wgmma per tile). 0 (the default):
    every exp2 on MUFU. Measured slower on an H200 at d = 64 (k = 8 0.96×, 4 0.92×, 2 0.82×): each
    emulated exp2 costs about eight issue slots there, and issue, not MUFU, binds."""

    name: ClassVar[str] = "emulate-exp2"

    def apply(self, ctx: PassContext, graph: Graph) -> None:
        every = _schedule_param(graph, "Exp2Poly", 0, lambda v: isinstance(v, int) and not isinstance(v, bool)
                                and 0 <= v <= 64, "use 0 (off) or k from 1 to 64: every k-th exp2 by polynomial")
        if not every:
            return
        state = _state(ctx, self.name)
        count = _set_on_every(state, Exp2ScaleOp, poly_every=every)
        state.schedule = list(state.schedule) + [f"emulate-exp2: every {every}th exp2 of {count} score exp2 "
                                                 f"site(s) by polynomial on the FMA pipe"]


@dataclass(frozen=True)
class ReductionChainsPass(_ScheduleListingPass):
    """`Param ReduceChains = c` (1, 2, 4 or 8): each thread reduces its row of scores (max, sum) in c
    independent partial results combined pairwise, instead of one chain through all its columns (32
    dependent FMNMX or FADD per row at d = 128 on sm_90a, on the softmax's critical path when the warp
    runs alone between GEMMs). The max is unchanged; the sum is added in another order. 1: one chain."""

    name: ClassVar[str] = "reduction-chains"

    def apply(self, ctx: PassContext, graph: Graph) -> None:
        chains = _schedule_param(graph, "ReduceChains", 1, lambda v: v in (1, 2, 4, 8) and not isinstance(v, bool),
                                 "use 1, 2, 4 or 8")
        if chains == 1:
            return
        state = _state(ctx, self.name)
        count = _set_on_every(state, RowReduceOp, chains=chains)
        state.schedule = list(state.schedule) + [f"reduction-chains: {count} row reduction(s) in {chains} chains"]


@dataclass(frozen=True)
class LazyRescalePass(_ScheduleListingPass):
    """The online softmax's running max moves only when a row's scores outgrow it by more than 2^8 after
    exp2; the output is rescaled only when a row of the warp moved (tlc.lowering.lazy_rescale). On by
    default in warp-specialised kernels; elsewhere `Param LazyRescale = true` asks for it, `false` turns
    it off everywhere."""

    name: ClassVar[str] = "lazy-rescale"

    def apply(self, ctx: PassContext, graph: Graph) -> None:
        from tlc.lowering.lazy_rescale import lazy_rescale
        from tlc.lowering.stale_max import stale_max_blocker

        wanted = _schedule_param(graph, "LazyRescale", None, lambda v: v is None or isinstance(v, bool),
                                 "use true or false")
        state = _state(ctx, self.name)
        kernel = _kernel(state)
        if wanted is False or (wanted is None and not any(isinstance(op, WarpSpecializeOp) for op in walk(kernel))):
            return
        blocker = stale_max_blocker(graph)
        if blocker is not None:
            state.schedule = list(state.schedule) + [f"lazy-rescale: not applied: {blocker} (a stale running "
                                                     "max would change the result)"]
            return
        kernel, notes = lazy_rescale(kernel)
        state.schedule = list(state.schedule) + list(dict.fromkeys(notes))
        _with_kernel(state, kernel)


@dataclass(frozen=True)
class PrefetchTmaPass(_ScheduleListingPass):
    """sm_90a: the TMA descriptors are prefetched while the mbarriers are set up
    (tlc.lowering.tma_prefetch). `Param PrefetchTma = true` turns it on."""

    name: ClassVar[str] = "prefetch-tma-descriptors"

    def apply(self, ctx: PassContext, graph: Graph) -> None:
        from tlc.lowering.tma_prefetch import prefetch_descriptors

        if not _bool_param(graph, "PrefetchTma", False):
            return
        state = _state(ctx, self.name)
        kernel, notes = prefetch_descriptors(_kernel(state))
        state.schedule = list(state.schedule) + notes
        _with_kernel(state, kernel)


@dataclass(frozen=True)
class TracePhasesPass(_ScheduleListingPass):
    """`Param Trace = true`: timestamps at each warp group's phase boundaries into a device buffer, for
    bench/timeline.py (tlc.lowering.trace_phases); `Param TraceTrips = true` also the first trips of
    each loop. Off by default."""

    name: ClassVar[str] = "trace-phases"

    def apply(self, ctx: PassContext, graph: Graph) -> None:
        from tlc.lowering.trace_phases import trace_phases

        trips = _bool_param(graph, "TraceTrips", False)
        if not (_bool_param(graph, "Trace", False) or trips):
            return
        state = _state(ctx, self.name)
        state.kir, notes = trace_phases(state.kir, trips)
        state.kir.verify()
        state.schedule = list(state.schedule) + notes


@dataclass(frozen=True)
class InsertSyncPass(_KernelPass):
    """cp.async waits and barriers from the shared-memory effects (tlc.lowering.sync)."""

    name: ClassVar[str] = "insert-sync"

    def apply(self, ctx: PassContext, graph: Graph) -> None:
        from tlc.lowering.sync import insert_sync

        state = _state(ctx, self.name)
        _with_kernel(state, insert_sync(_kernel(state)))


@dataclass(frozen=True)
class PipelinePass(_ScheduleListingPass):
    """Multi-stage software pipelining of loop copies (tlc.lowering.software_pipeline). Stages:
    this option, else Param Stages, else 2 where shared memory allows (one otherwise)."""

    name: ClassVar[str] = "pipeline"
    stages: int = 0

    def apply(self, ctx: PassContext, graph: Graph) -> None:
        from tlc.lowering.software_pipeline import pipeline_kernel

        state = _state(ctx, self.name)
        if any(isinstance(op, WarpSpecializeOp) for op in walk(_kernel(state))):
            state.stages = max((op.stages for op in walk(_kernel(state)) if isinstance(op, ForOp)), default=1)
            return   # warp-specialize built the TMA ring: nothing is left for cp.async stages
        stages = _stages(graph, self.stages, 2, "the cp.async pipeline runs 1 or 2 stages (the sm_90a "
                         "TMA ring takes up to 4)")
        kernel, reports = pipeline_kernel(_kernel(state), stages, state.arch.smem_per_block)
        state.schedule = list(state.schedule) + reports
        _with_kernel(state, kernel)
        state.stages = max((op.stages for op in walk(kernel) if isinstance(op, ForOp)), default=1)


@dataclass(frozen=True)
class PrefetchOperandsPass(_ScheduleRewritePass):
    """Shared→register operand loads one k-block ahead of the MMAs (tlc.lowering.prefetch)."""

    name: ClassVar[str] = "prefetch-operands"

    def rewrite(self, kernel):
        from tlc.lowering.prefetch import prefetch_operands

        return prefetch_operands(kernel)


@dataclass(frozen=True)
class DeferReductionsPass(_ScheduleRewritePass):
    """Running row sums stay per lane in the loop; one cross-lane sum after (tlc.lowering.reductions)."""

    name: ClassVar[str] = "defer-reductions"

    def rewrite(self, kernel):
        from tlc.lowering.reductions import defer_reductions

        return defer_reductions(kernel)


@dataclass(frozen=True)
class CheckResourcesPass(Pass):
    """Shared memory (from the KIR's buffers and layouts) and a register estimate per thread
    against `tlc.arch`; one error per exhausted resource, at the TL line of its biggest user."""

    name: ClassVar[str] = "check-resources"

    def apply(self, ctx: PassContext, graph: Graph) -> None:
        state = _state(ctx, self.name)
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


@dataclass(frozen=True)
class FoldPartitionsPass(_KernelPass):
    """Partitions, fragments and tiled copies as flat layouts computed by tlc/layout
    (tlc.lowering.fold_partitions, imported only when the pass is on). `Param FoldLdmatrix = false`
    keeps the ldmatrix sources CuTe's partitions (slower to compile, faster at d = 64 on an H200:
    tlc.tuning binds it there)."""

    name: ClassVar[str] = "fold-partitions"
    enable: bool = field(default_factory=fold_partitions_enabled)   # TLC_FOLD_PARTITIONS=0: off
    wgmma: bool = field(default_factory=fold_wgmma_enabled)         # TLC_FOLD_PARTITIONS=no-wgmma: off

    def apply(self, ctx: PassContext, graph: Graph) -> None:
        state = _state(ctx, self.name)
        kernel = _kernel(state)
        ldsm = _bool_param(graph, "FoldLdmatrix", True)
        if not self.enable:
            return
        from tlc.lowering.fold_partitions import fold_partitions

        kernel, notes = fold_partitions(kernel, wgmma=self.wgmma, ldsm=ldsm)
        state.schedule = list(state.schedule) + notes
        _with_kernel(state, kernel)

    def print_state(self, ctx: PassContext) -> str:
        state = get_state(ctx)
        notes = [n for n in (state.schedule if state else []) if n.startswith(("fold-partitions", "  "))
                 or ": kept (" in n]
        return "".join(f"// {n}\n" for n in notes) + super().print_state(ctx)


def lowering_pipeline(arch: str | None = None) -> list[str]:
    """The lowering passes as pipeline entries, with the target pinned when given."""
    from tlc.passes.pipeline import LOWERING_PIPELINE

    return [f"lower-tile-ops{{arch={arch}}}" if arch and p == "lower-tile-ops" else p for p in LOWERING_PIPELINE]


def full_pipeline(arch: str | None = None) -> list[str]:
    """DEFAULT_PIPELINE then the lowering: what `tlc show --print-after pipeline` runs."""
    from tlc.passes.pipeline import DEFAULT_PIPELINE

    return [*DEFAULT_PIPELINE, *lowering_pipeline(arch)]


def run_lowering(graph: Graph, arch: str, *, name: str, lse: bool = False,
                 ctx: PassContext | None = None) -> tuple[LoweringState, PassContext]:
    """Run the lowering passes on a graph the TL pipeline has processed."""
    from tlc.passes.pipeline import PassManager, parse_pipeline

    ctx = ctx or PassContext(arch=arch)
    ctx.arch = arch
    start_state(ctx, arch, name=name, lse=lse)
    PassManager(parse_pipeline(",".join(lowering_pipeline()))).run(graph, ctx)
    return get_state(ctx), ctx  # type: ignore[return-value]
