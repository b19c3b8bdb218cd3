"""`l2-sections` (sm_90a, causal, one tile per CTA; Param L2Sections): the grid's tiles in an order that
keeps the SMs evenly busy to the end and the K/V they share in L2.

The hardware hands out a grid's CTAs in order, x fastest, each to the next SM that frees up. With the
query tiles on x, it runs one head's tiles, longest to shortest, then the next head's: causal tiles
differ in length up to the sequence, and the last heads' long tiles start when most SMs are about to
finish — a tail (`python3 bench/tail_model.py`, list scheduling of the bar's causal grids on 132 SMs, a
tile costing its trips + 1: 3-14 % past an even spread). Heads fastest would start every head's longest tile first, but the tiles running at once would
then read every head's K/V, which no L2 holds. So the heads go in sections of as many as fit an L2
budget (`L2_BUDGET`, FlashAttention-3's figure, counted in ring trips: the budget over the producer's bytes
per trip, against the longest tile's trips, a runtime value): within a section its query tiles run
longest first, the section's heads fastest; sections follow one another. The grid becomes 1-D and
every read of blockIdx / gridDim reads the decoded tile instead:

    sec_heads = ceil_div(HB, ceil_div(HB, max(1, min(HB, (L2_BUDGET / trip_bytes) / longest_trips))))   (even sections)
    sec = tile / (sec_heads·gx);  r = tile % (sec_heads·gx);  here = min(sec_heads, HB − sec·sec_heads)
    x = r / here (or gx − 1 − r / here when the last query tile is the longest);  hb = sec·sec_heads + r % here

with HB = gy·gz (heads × batches). `Param L2TailOnly = true` (with L2Sections) reorders only the last
section, the `fit` heads whose tiles end the grid: the others keep the hardware's order and its L2 reuse (the
132 running tiles span 4-6 heads at S = 4k), the tail still ends longest first (the same model: within 1 % at
d = 64 and 128, 4 % at d = 256, against 0.1-0.9 % for full sections), but on an H200 it gained nothing at d = 64
causal (1.00x of the hardware's order, alternating twice; bench/results/2026-11-27-h200-s14-l2-tail-only-ab.txt),
1.2-1.5 % on fp16 causal and MLA prefill, lost 1-2 % on GQA, MQA and S = 16k causal: off. Off unless
`Param L2Sections = true`: on an H200 (2026-11-27, alternating twice with the hardware's order, `TLC_BENCH_DEFINES=
"L2Sections=..." python3 bench/bench_attention.py --bar --arch sm_90a --no-baselines --rows causal`,
bench/results/2026-11-27-h200-s13-l2-sections-ab.txt) d = 256 causal ran
1.056x / 1.042x, but d = 64 0.977x / 0.979x, d = 128 0.982x / 0.978x, GQA, MQA and MLA prefill 0.988-0.995x,
S = 16k 0.975-0.978x: the model's tail is real only where it is largest (d = 256: 14 % in the model, eight
heads per section), and elsewhere the x-fastest order's L2 reuse (every running tile of one head) is worth
more. tlc.attention.tuning sets it for d = 256 causal.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from tlc.expr.rewrite import substitute
from tlc.kir import ops as K
from tlc.kir import ops_sm90 as H
from tlc.kir.base import substitute_names
from tlc.kir.expr import BinOp, Call, Const, Expr, Var, free_names
from tlc.kir.transforms.base import Facts, KernelTransform, Notes
from tlc.kir.transforms.schedule import Schedule
from tlc.kir.transforms.warp_specialize import is_ring_loop

L2_BUDGET = 32 * 1024 * 1024   # bytes of K/V a section's heads may keep live (FlashAttention-3's tile scheduler)


class Declined(Exception):
    """The kernel keeps the hardware's order; the message says why."""


def l2_sections(kernel: H.Sm90KernelOp, tail_only: bool = False) -> tuple[H.Sm90KernelOp, list[str]]:
    """`kernel` with its tiles in L2 sections, or unchanged with the reason in the notes; `tail_only`: only
    the last section's heads reordered, the others left in the hardware's order."""
    try:
        return _sections(kernel, tail_only)
    except Declined as why:
        return kernel, [f"l2-sections: kept the hardware's order: {why}"]


def _sections(kernel: H.Sm90KernelOp, tail_only: bool) -> tuple[H.Sm90KernelOp, list[str]]:
    roles = [op for op in kernel.body if isinstance(op, H.WarpSpecializeOp)]
    if len(roles) != 1:
        raise Declined("not warp-specialised")
    if not any(isinstance(x, K.MaskOp) and x.causal for x in K.walk(roles[0])):
        raise Declined("no causal mask: every tile has the same length")
    if kernel.grid[1] == Const(1) and kernel.grid[2] == Const(1):
        raise Declined("a 1-D grid (persistent, or one head and batch)")
    if kernel.own_grid_axes():
        raise Declined(f"the grid's z is `{kernel.grid[2]}`: the kernel has grid axes of its own")
    ring = _ring_loop(roles[0])
    trip_bytes = sum(x.bytes for x in K.walk(ring) if isinstance(x, H.MbarrierArriveExpectTxOp))
    gx, gy, gz = kernel.grid
    lets = {op.name: op.value for op in kernel.body if isinstance(op, K.LetOp)}
    trips = _inline(ring.stop, lets)
    for name, extent in zip(("gridDim.x", "gridDim.y", "gridDim.z"), (gx, gy, gz)):
        trips = substitute(trips, name, extent)
    if free_names(trips) - {"blockIdx.x"} - {n for n in free_names(trips) if n.startswith("p.")}:
        raise Declined(f"the ring's trip count `{ring.stop}` reads more than the query tile and the parameters")
    first, last = (substitute(trips, "blockIdx.x", x) for x in (Const(0), BinOp("-", gx, Const(1))))
    hb = BinOp("*", gy, gz)
    loc = kernel.loc

    def let(name: str, value: Expr) -> K.LetOp:
        return K.LetOp(name=name, type="i32", value=value, loc=loc)

    def longest_first(step: Expr) -> Expr:   # the step-th query tile, counted from the longest
        return Call("select", (BinOp(">=", first, last), step, BinOp("-", BinOp("-", gx, Const(1)), step)))
    tile = Var("blockIdx.x")
    # the longest tile's trips against the budget in trips (a constant), so nothing multiplies a runtime length
    # by bytes (no i32 overflow at any sequence length)
    budget_trips = L2_BUDGET // max(1, trip_bytes)
    per_head = Call("max", (Const(1), Call("max", (first, last))))
    decode = [let("l2_fit", Call("max", (Const(1), Call("min", (hb, BinOp("/", Const(budget_trips), per_head))))))]
    if tail_only:   # the first hb - fit heads as the hardware runs them (x fastest), the last fit heads one section
        front = BinOp("*", BinOp("-", hb, Var("l2_fit")), gx)
        decode += [let("l2_in_tail", BinOp(">=", tile, front)), let("l2_r", BinOp("-", tile, front)),
                   let("l2_x", Call("select", (Var("l2_in_tail"), longest_first(BinOp("/", Var("l2_r"), Var("l2_fit"))),
                                               BinOp("%", tile, gx)))),
                   let("l2_hb", Call("select", (Var("l2_in_tail"), BinOp("+", BinOp("-", hb, Var("l2_fit")),
                                                                          BinOp("%", Var("l2_r"), Var("l2_fit"))),
                                                BinOp("/", tile, gx))))]
    else:           # sections of even size, one after the other
        span = BinOp("*", Var("l2_heads"), gx)
        decode += [let("l2_heads", Call("ceil_div", (hb, Call("ceil_div", (hb, Var("l2_fit")))))),
                   let("l2_sec", BinOp("/", tile, span)), let("l2_r", BinOp("%", tile, span)),
                   let("l2_here", Call("min", (Var("l2_heads"),
                                               BinOp("-", hb, BinOp("*", Var("l2_sec"), Var("l2_heads")))))),
                   let("l2_x", longest_first(BinOp("/", Var("l2_r"), Var("l2_here")))),
                   let("l2_hb", BinOp("+", BinOp("*", Var("l2_sec"), Var("l2_heads")),
                                      BinOp("%", Var("l2_r"), Var("l2_here"))))]
    decode += [let("l2_y", BinOp("%", Var("l2_hb"), gy)), let("l2_z", BinOp("/", Var("l2_hb"), gy))]
    coords = {"blockIdx.x": Var("l2_x"), "blockIdx.y": Var("l2_y"), "blockIdx.z": Var("l2_z"),
              "gridDim.x": gx, "gridDim.y": gy, "gridDim.z": gz}
    body = [substitute_names(op, coords) for op in kernel.body]
    # the decode reads the hardware's blockIdx.x (the tile number) and the grid's extents, not the substitutes
    new = dataclasses.replace(kernel, grid=(BinOp("*", gx, hb), Const(1), Const(1)), body=(*decode, *body))
    how = ("the heads before the last section in the hardware's order (query tiles fastest), the last section's "
           if tail_only else "each section's ")
    return new, [f"l2-sections: the {gx} x {gy} x {gz} grid as one of `{gx} * {gy} * {gz}` tiles: heads in sections "
                 f"whose K/V fits {L2_BUDGET >> 20} MiB of L2 ({trip_bytes} bytes per trip times the longest tile's "
                 f"trips), {how}query tiles longest first with its heads fastest"]


def _ring_loop(roles: H.WarpSpecializeOp) -> K.ForOp:
    loops = [x for op in roles.producer for x in K.walk(op) if is_ring_loop(x)]
    if len(loops) != 1:
        raise Declined(f"the producer has {len(loops)} ring loops, not one")
    return loops[0]


def _inline(e: Expr, lets: dict[str, Expr]) -> Expr:
    """`e` with the kernel's top-level LetOps substituted until only parameters and grid names remain."""
    for _ in range(16):
        names = free_names(e) & lets.keys()
        if not names:
            return e
        for n in names:
            e = substitute(e, n, lets[n])
    raise Declined(f"`{e}` does not resolve to parameters and grid coordinates")


@dataclass(frozen=True)
class L2SectionsTransform(KernelTransform):
    """`Param L2Sections = true` (schedule.l2_sections; off by default: on an H200 it ran 1.04-1.06x at
    d = 256 causal but 0.975-0.995x on the other causal rows, and tlc.attention.tuning sets it at d = 256):
    the grid's tiles in L2-sized sections of heads, each section's query tiles longest first.
    `Param L2TailOnly = true` reorders only the last section's heads (the grid's tail)."""

    name: ClassVar[str] = "l2-sections"

    def rewrite(self, kernel: K.KernelOp, schedule: Schedule, facts: Facts) -> tuple[K.KernelOp, Notes]:
        if not schedule.l2_sections:
            return kernel, []
        return l2_sections(kernel, schedule.l2_tail_only)
