"""The lowering driver: after the TL pipeline, on the same graph, the passes of LOWERING_PIPELINE
(tlc.passes.pipeline) build and rewrite the kernel IR on the PassContext's `LoweringState`.

Three need the TL graph and live here or beside it:

    lower-tile-ops   each TL op by its own rule → kernel IR; parses the schedule knobs from the Params
                     once (tlc.kir.transforms.schedule) and computes what the TL graph proves (facts)
    infer-layouts    shared layouts' swizzles from how the tiles are read, checked for bank conflicts
    check-resources  shared memory and a register estimate against the arch (tlc.lowering.check_resources)

Every other entry is a kernel-IR transform (tlc.kir.transforms: kernel IR → kernel IR with the schedule
and the facts), run here by a `TransformPass` that keeps its notes in the schedule listing
`--print-after` shows.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, ClassVar

from tlc.diagnostics import fail
from tlc.ir.graph import Graph
from tlc.ir.ops import GemmOp
from tlc.kir.ops import ForOp, KernelOp, walk
from tlc.kir.text import print_kir
from tlc.kir.transforms.base import Transform
from tlc.kir.transforms.schedule import Schedule
from tlc.lowering import layout_check
from tlc.lowering.state import DEFAULT_ARCH, LoweringState, get_state, start_state
from tlc.names import kernel_name
from tlc.passes.base import Pass, PassContext

LOWERING_ORDER = ("lower-tile-ops", "infer-layouts", "warp-specialize", "insert-sync", "pipeline", "prefetch-operands",
                  "defer-reductions", "overlap-gemms", "check-resources")


def lowered_state(ctx: PassContext, pass_name: str) -> LoweringState:
    """The lowering state, refused unless lower-tile-ops has built the kernel IR."""
    state = get_state(ctx)
    if state is None or state.kir is None:
        raise fail(f"pass '{pass_name}' needs 'lower-tile-ops' to run first (the lowering order is "
                   f"{', '.join(LOWERING_ORDER)})")
    return state


@dataclass(frozen=True)
class LowerTileOpsPass(Pass):
    """Each TL op by its own rule into kernel IR (tlc.lowering.tile_ops); then the schedule knobs, parsed
    and checked once from the Params, and the facts the transforms need from the TL graph."""

    name: ClassVar[str] = "lower-tile-ops"
    arch: str = ""  # overrides the context's target (tlc show has no --arch)

    def apply(self, ctx: PassContext, graph: Graph) -> None:
        from tlc.lowering.facts import tl_facts
        from tlc.lowering.rules import FAMILIES
        from tlc.lowering.tile_ops import TileOpLowering

        arch = self.arch or ctx.arch or DEFAULT_ARCH
        state = get_state(ctx)
        if state is None or state.arch.name != arch:
            state = start_state(ctx, arch, name=kernel_name(graph.file))
        if state.lse:
            raise fail("tlc build: lse=True adds no output: a program stores its log-sum-exp itself, as a row "
                       "vector (`Allocate LSE in global (seqlen_q) as fp32`, LSE = m + log(l), "
                       "specs/mha_lse_fwd.tl); build without lse")
        lowering = TileOpLowering(graph, state.arch, state.name)
        state.kir, state.abi = lowering.run(), lowering.abi
        state.partial_copies = list(lowering.partial_copies)
        state.tl_allocs = {b.name: (f"Allocate {b.tl_name} in shared", b.loc) for b in lowering.buffers.values()
                           if not b.reuse}
        state.tl_allocs.update(lowering.register_allocs)
        state.loc = next((op.loc for _, op in graph.walk() if isinstance(op, GemmOp)), None)
        family = FAMILIES.get(state.arch.mma_path)
        state.knobs = Schedule.from_params(graph.params, graph.param_locs,
                                           tma_ring=family is not None and family.tma_copies)
        state.facts = tl_facts(graph, state.arch)

    def print_state(self, ctx: PassContext) -> str:
        state = get_state(ctx)
        return print_kir(state.kir) if state and state.kir else "// lower-tile-ops: no kernel IR\n"


@dataclass(frozen=True)
class InferLayoutsPass(Pass):
    """Swizzled shared layouts from how each tile is read (tlc.lowering.layouts)."""

    name: ClassVar[str] = "infer-layouts"

    def apply(self, ctx: PassContext, graph: Graph) -> None:
        from tlc.lowering.layouts import infer_layouts

        state = lowered_state(ctx, self.name)
        kernel, state.layout_notes = infer_layouts(state.kir.kernels()[0])
        params = [op for op in state.kir.body if not isinstance(op, KernelOp)]
        state.kir = dataclasses.replace(state.kir, body=(*params, kernel))
        state.kir.verify()
        for problem in layout_check.check_program(state.kir, {}):
            ctx.error(f"internal: a shared layout fails the bank-conflict check: {problem}", state.loc)

    def print_state(self, ctx: PassContext) -> str:
        state = get_state(ctx)
        return ("\n".join(f"// {n}" for n in state.layout_notes) + "\n" + print_kir(state.kir)) if state else ""


@dataclass(frozen=True)
class TransformPass(Pass):
    """A kernel-IR transform run on the lowering state: the program, the schedule and the facts in, the
    program (verified) and its notes out. Its options are the transform's (see `transform_pass`)."""

    transform: ClassVar[type[Transform]]

    def apply(self, ctx: PassContext, graph: Graph) -> None:
        state = lowered_state(ctx, self.name)
        options = {f.name: getattr(self, f.name) for f in dataclasses.fields(self.transform)}
        before = state.kir
        state.kir, notes = self.transform(**options).apply(state.kir, state.knobs, state.facts)
        if state.kir is not before:
            state.kir.verify()
        state.schedule = [*state.schedule, *notes]
        follow_up = FOLLOW_UPS.get(self.name)
        if follow_up is not None:
            follow_up(state, notes)

    def print_state(self, ctx: PassContext) -> str:
        state = get_state(ctx)
        if state is None or state.kir is None:
            return f"// {self.name}: no kernel IR\n"
        return "".join(f"// schedule: {r}\n" for r in state.schedule) + print_kir(state.kir)


_PASSES: dict[type[Transform], type[Pass]] = {}


def transform_pass(transform: type[Transform]) -> type[Pass]:
    """The lowering pass running `transform`: its name, and its options as fields (`pipeline{stages=3}`)."""
    if transform not in _PASSES:
        options = [(f.name, f.type, dataclasses.field(default=f.default, default_factory=f.default_factory))
                   for f in dataclasses.fields(transform)]
        _PASSES[transform] = dataclasses.make_dataclass(
            f"{transform.__name__}Pass", options, bases=(TransformPass,), frozen=True,
            namespace={"name": transform.name, "transform": transform, "__doc__": transform.__doc__,
                       "__module__": __name__})
    return _PASSES[transform]


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


def _after_warp_specialize(state: LoweringState, notes: list[str]) -> None:
    """Copies only TMA could carry are refused where warp-specialize kept cp.async, with its reason."""
    why = "WarpSpecialize is false" if not state.knobs.warp_specialize else "; ".join(
        n.split(": ", 1)[1] for n in notes if "kept the cp.async" in n or "keeps its copy" in n)
    refuse_partial_copies(state, why)


def _after_pipeline(state: LoweringState, notes: list[str]) -> None:
    state.stages = max((op.stages for op in walk(state.kir.kernels()[0]) if isinstance(op, ForOp)), default=1)


# What the lowering state takes from a transform's result besides the program and notes.
FOLLOW_UPS: dict[str, Callable[[LoweringState, list[str]], None]] = {
    "warp-specialize": _after_warp_specialize,
    "pipeline": _after_pipeline,
}


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
