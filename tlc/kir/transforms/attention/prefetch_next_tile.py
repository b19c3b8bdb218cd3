"""`prefetch-next-tile` (sm_90a, one tile per CTA; Param PrefetchNext): the producer prefetches into L2 the
tiles it loads once per tile (Q) for the CTA that starts one resident wave later.

With one tile per CTA, a CTA's first GEMM waits on its once-loaded tiles; in attention that is Q, read by that
CTA alone, so it always comes from DRAM (the K/V tiles are shared by a head's query tiles and mostly hit L2). The hardware hands out a grid's
CTAs in linear order (x fastest) as SMs free up, so the CTA P places further on, P = the CTAs the GPU holds
at once (`p.resident_ctas`, filled by the launcher: SMs × occupancy), starts about one CTA's lifetime after
this one. Right after its own once-loads, before the K/V ring, the producer thread issues an L2 prefetch
(`cp.async.bulk.prefetch.tensor`: no shared memory, no barrier, nothing waits on it) of that CTA's boxes:

    next = blockIdx.x + gridDim.x·(blockIdx.y + gridDim.y·blockIdx.z) + p.resident_ctas
    if next < gridDim.x·gridDim.y·gridDim.z: each once-load's box at its coordinates with
        blockIdx = (next % gridDim.x, next / gridDim.x % gridDim.y, next / (gridDim.x·gridDim.y))

The coordinates are the loads' own: each let they read that depends on the block index is declared again
for the next CTA (`<name>_next`, same type), so a grid that l2-sections reordered prefetches by its decode. A persistent kernel already loads its next tile's Q while
it finishes this one, and keeps its schedule.

On an H200 (2026-11-27, `TLC_BENCH_DEFINES="PrefetchNext=true"` against the default, the bar rows alternating
twice, bench/results/2026-11-27-h200-s14-prefetch-next-ab.txt) the one-tile rows moved by -0.3..+1.5 %, and
d = 256 causal lost 9 % in a build whose coordinates (the whole l2-sections decode inlined into each) made
the producer thread spill (ptxas: 268 B stored, 296 B loaded, 72 B of stack, in the build record of
`tlc build specs/gqa_fwd.tl --arch sm_90a -D HeadDim=256 -D BM=128 -D BN=64 -D Warps=8 -D Causal=true
-D L2Sections=true -D PrefetchNext=true` at 8e7a106, NVRTC 13.0, 2026-11-27; no spills since): the
block-index lets the coordinates read are now re-declared once each (`<name>_next`) and keep the kernel's
i32 arithmetic; timed again at 9c8834e (H200, 2026-11-27, bench/results/2026-11-27-h200-s15-prefetch-next-ab.txt):
1.000-1.011x on every bar row it applies to, d = 256 causal 1.000x. Off by default; tlc.attention.tuning sets it
for every one-tile kernel tlc.attention builds (SM90A_ONE_TILE_SCHEDULE). `next` fits an i32: 2^31 CTAs of at
least 64 rows of 64 bf16 columns each would be a 16 TiB Q.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from tlc.expr.rewrite import substitute
from tlc.kir import ops as K
from tlc.kir import ops_sm90 as H
from tlc.kir.expr import BinOp, Expr, Var, free_names
from tlc.kir.transforms.base import Facts, Notes, Transform
from tlc.kir.transforms.schedule import Schedule
from tlc.kir.transforms.warp_specialize import is_ring_loop

NEXT, NEXT_X, NEXT_Y, NEXT_Z = "next_cta", "next_x", "next_y", "next_z"
_GRID = {f"{g}.{a}" for g in ("blockIdx", "gridDim") for a in "xyz"}


class Declined(Exception):
    """The kernel is left as it is; the message says why."""


def prefetch_next_tile(program: K.ProgramOp) -> tuple[K.ProgramOp, list[str]]:
    """`program` whose producer prefetches the next wave's once-loaded tiles, or unchanged with the reason."""
    try:
        return _prefetch(program)
    except Declined as why:
        return program, [f"prefetch-next-tile: kept: {why}"]


def _prefetch(program: K.ProgramOp) -> tuple[K.ProgramOp, list[str]]:
    kernels = program.kernels()
    params = [op for op in program.body if isinstance(op, H.TmaParamsOp)]
    if len(kernels) != 1 or not isinstance(kernels[0], H.Sm90KernelOp) or len(params) != 1:
        raise Declined("not one sm_90a kernel with TMA parameters")
    kernel, struct = kernels[0], params[0]
    if kernel.own_grid_axes():
        raise Declined(f"the grid's z is `{kernel.grid[2]}`: the kernel has grid axes of its own")
    roles = [op for op in kernel.body if isinstance(op, H.WarpSpecializeOp)]
    if len(roles) != 1:
        raise Declined("not warp-specialised")
    if any(isinstance(op, (H.TileSlotOp, H.AtomicAddOp)) for op in K.walk(kernel)):
        raise Declined("persistent: the producer loads its next tile itself")
    if H.RESIDENT_CTAS_FIELD in {n for n, _ in struct.fields}:
        raise Declined(f"the parameter struct already has a field {H.RESIDENT_CTAS_FIELD}")
    defined = {n for op in K.walk(kernel) for n in op.defined_names()}
    if clash := {NEXT, NEXT_X, NEXT_Y, NEXT_Z} & defined:
        raise Declined(f"the kernel already defines {', '.join(sorted(clash))}")
    lets = [op for op in kernel.body if isinstance(op, K.LetOp)]
    producer, found = _insert(roles[0].producer, lets, defined)
    if not found:
        raise Declined("the producer has no tile loaded once before a K/V ring loop")
    new_roles = dataclasses.replace(roles[0], producer=producer)
    new_kernel = dataclasses.replace(kernel, body=tuple(new_roles if op is roles[0] else op for op in kernel.body))
    new_struct = dataclasses.replace(struct, fields=(*struct.fields, (H.RESIDENT_CTAS_FIELD, "i32")))
    body = tuple(new_kernel if op is kernel else new_struct if op is struct else op for op in program.body)
    out = dataclasses.replace(program, body=body)
    out.verify()
    return out, [f"prefetch-next-tile: the producer prefetches {', '.join(found)} of the CTA p.{H.RESIDENT_CTAS_FIELD} "
                 "places on into L2 (cp.async.bulk.prefetch.tensor) before its K/V ring"]


def _insert(body: tuple[K.Op, ...], lets: list[K.LetOp], defined: set[str]) -> tuple[tuple[K.Op, ...], list[str]]:
    """`body` with the prefetches placed before the ring loop of the block that loads a tile once and then runs
    the ring (searched through ifs); the names of the tiles prefetched, none if no such block. `lets`: the
    lets in scope at `body`'s start, in program order."""
    scope = list(lets)
    for i, op in enumerate(body):
        if isinstance(op, K.LetOp):
            scope.append(op)
        if is_ring_loop(op):
            once = [x for x in body[:i] if isinstance(x, H.TmaLoadOp)]
            if not once:
                return body, []
            prefetches = _prefetches(once, scope, defined)
            return (*body[:i], *prefetches, *body[i:]), list(dict.fromkeys(x.dst for x in once))
        if isinstance(op, K.IfOp):
            inner, found = _insert(op.body, scope, defined)
            if found:
                return (*body[:i], dataclasses.replace(op, body=inner), *body[i + 1:]), found
    return body, []


def _moved_lets(coords: list[Expr], scope: list[K.LetOp], defined: set[str]) -> tuple[list[K.LetOp], dict[str, str]]:
    """The lets the coordinates read (transitively) that depend on the block index, re-declared once each for
    the next CTA as `<name>_next` (the same types, so C++ computes them as the kernel does), and the renaming."""
    by_name = {op.name: op for op in scope}
    need: set[str] = set()
    todo = [n for c in coords for n in free_names(c)]
    while todo:
        n = todo.pop()
        if n not in need:
            need.add(n)
            todo.extend(free_names(by_name[n].value) if n in by_name else ())
    if rest := sorted(n for n in need if n not in by_name and n not in _GRID and not n.startswith("p.")):
        raise Declined(f"a once-load's coordinates read {', '.join(rest)}, not only lets of the grid and the parameters")
    renamed = {f"blockIdx.{a}": name for a, name in zip("xyz", (NEXT_X, NEXT_Y, NEXT_Z))}
    copies = []
    for op in scope:
        if op.name in need and free_names(op.value) & renamed.keys():
            new = f"{op.name}_next"
            if new in defined:
                raise Declined(f"the kernel already defines {new}")
            copies.append(dataclasses.replace(op, name=new, value=_renamed(op.value, renamed)))
            renamed[op.name] = new
    return copies, renamed


def _renamed(e: Expr, names: dict[str, str]) -> Expr:
    for old, new in names.items():
        e = substitute(e, old, Var(new))
    return e


def _prefetches(once: list[H.TmaLoadOp], scope: list[K.LetOp], defined: set[str]) -> list[K.Op]:
    gx, gy, gz = (Var(f"gridDim.{a}") for a in "xyz")
    linear = BinOp("+", Var("blockIdx.x"), BinOp("*", gx, BinOp("+", Var("blockIdx.y"),
                                                                    BinOp("*", gy, Var("blockIdx.z")))))
    loc = once[0].loc
    decode = [K.LetOp(name=NEXT, type="i32", value=BinOp("+", linear, Var(f"p.{H.RESIDENT_CTAS_FIELD}")), loc=loc),
              K.LetOp(name=NEXT_X, type="i32", value=BinOp("%", Var(NEXT), gx), loc=loc),
              K.LetOp(name=NEXT_Y, type="i32", value=BinOp("%", BinOp("/", Var(NEXT), gx), gy), loc=loc),
              K.LetOp(name=NEXT_Z, type="i32", value=BinOp("/", Var(NEXT), BinOp("*", gx, gy)), loc=loc)]
    copies, renamed = _moved_lets([c for load in once for c in load.coord], scope, defined)
    ops = [H.TmaPrefetchTileOp(desc=load.desc, coord=tuple(_renamed(c, renamed) for c in load.coord), loc=load.loc)
           for load in once]
    total = BinOp("*", gx, BinOp("*", gy, gz))
    return [*decode, K.IfOp(cond=BinOp("<", Var(NEXT), total), body=(*copies, *ops), loc=loc)]


@dataclass(frozen=True)
class PrefetchNextTileTransform(Transform):
    """`Param PrefetchNext = true` (schedule.prefetch_next; off by default, and tlc.attention.tuning sets it for every
    one-tile kernel tlc.attention builds, tlc/attention/tuning.py SM90A_ONE_TILE_SCHEDULE) turns it on."""

    name: ClassVar[str] = "prefetch-next-tile"

    def apply(self, program: K.ProgramOp, schedule: Schedule, facts: Facts) -> tuple[K.ProgramOp, Notes]:
        if not schedule.prefetch_next:
            return program, []
        return prefetch_next_tile(program)
