"""`prefetch-next-tile` (sm_90a, one tile per CTA; Param PrefetchNext): the producer prefetches into L2 the
tiles it loads once per tile (Q) for the CTA that starts one resident wave later.

With one tile per CTA, a CTA's first GEMM waits on its Q, and Q, read by that CTA alone, always comes from
DRAM; the K/V tiles are shared by a head's query tiles and mostly hit L2. The hardware hands out a grid's
CTAs in linear order (x fastest) as SMs free up, so the CTA P places further on, P = the CTAs the GPU holds
at once (`p.resident_ctas`, filled by the launcher: SMs × occupancy), starts about one CTA's lifetime after
this one. Right after its own once-loads, before the K/V ring, the producer thread issues an L2 prefetch
(`cp.async.bulk.prefetch.tensor`: no shared memory, no barrier, nothing waits on it) of that CTA's boxes:

    next = blockIdx.x + gridDim.x·(blockIdx.y + gridDim.y·blockIdx.z) + p.resident_ctas
    if next < gridDim.x·gridDim.y·gridDim.z: each once-load's box at its coordinates with
        blockIdx = (next % gridDim.x, next / gridDim.x % gridDim.y, next / (gridDim.x·gridDim.y))

The coordinates are the loads' own, their names resolved through the kernel's lets, so a grid that
l2-sections reordered prefetches by its decode. A persistent kernel already loads its next tile's Q while
it finishes this one, and keeps its schedule.

On an H200 (2026-11-27, `TLC_BENCH_DEFINES="PrefetchNext=true"` against the default, the bar rows alternating
twice, bench/results/2026-11-27-h200-s14-prefetch-next-ab.txt) the one-tile rows moved by -0.3..+1.5 %, and
d = 256 causal lost 9 %: its l2-sections hold 32 MiB of K/V in L2, and a wave of 64 KiB Q tiles more evicts
them. Off by default; tlc.tuning sets it, with a 3-stage ring, for d = 64 causal (1.007x and 1.013x of two
stages without it, in two calls). `next` fits an i32: 2^31 CTAs of at least 64 rows of 64
bf16 columns each would be a 16 TiB Q.
"""
from __future__ import annotations

import dataclasses

from tlc.expr.rewrite import substitute
from tlc.kir import ops as K
from tlc.kir import ops_sm90 as H
from tlc.kir.expr import BinOp, Expr, Var, free_names

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
    roles = [op for op in kernel.body if isinstance(op, H.WarpSpecializeOp)]
    if len(roles) != 1:
        raise Declined("not warp-specialised")
    if any(isinstance(op, (H.TileSlotOp, H.AtomicAddOp)) for op in K.walk(kernel)):
        raise Declined("persistent: the producer loads its next tile itself")
    if H.RESIDENT_CTAS in {n for n, _ in struct.fields}:
        raise Declined(f"the parameter struct already has a field {H.RESIDENT_CTAS}")
    defined = {n for op in K.walk(kernel) for n in op.defined_names()}
    if clash := {NEXT, NEXT_X, NEXT_Y, NEXT_Z} & defined:
        raise Declined(f"the kernel already defines {', '.join(sorted(clash))}")
    lets = {op.name: op.value for op in kernel.body if isinstance(op, K.LetOp)}
    producer, found = _insert(roles[0].producer, lets)
    if not found:
        raise Declined("the producer has no tile loaded once before a K/V ring loop")
    new_roles = dataclasses.replace(roles[0], producer=producer)
    new_kernel = dataclasses.replace(kernel, body=tuple(new_roles if op is roles[0] else op for op in kernel.body))
    new_struct = dataclasses.replace(struct, fields=(*struct.fields, (H.RESIDENT_CTAS, "i32")))
    body = tuple(new_kernel if op is kernel else new_struct if op is struct else op for op in program.body)
    out = dataclasses.replace(program, body=body)
    out.verify()
    return out, [f"prefetch-next-tile: the producer prefetches {', '.join(found)} of the CTA p.{H.RESIDENT_CTAS} "
                 "places on into L2 (cp.async.bulk.prefetch.tensor) before its K/V ring"]


def _is_ring(op: K.Op) -> bool:
    return isinstance(op, K.ForOp) and any(isinstance(x, H.MbarrierArriveExpectTxOp) for x in K.walk(op))


def _insert(body: tuple[K.Op, ...], lets: dict[str, Expr]) -> tuple[tuple[K.Op, ...], list[str]]:
    """`body` with the prefetches placed before the ring loop of the block that loads a tile once and then runs
    the ring (searched through ifs); the names of the tiles prefetched, none if no such block."""
    scope = dict(lets)
    for i, op in enumerate(body):
        if isinstance(op, K.LetOp):
            scope[op.name] = op.value
        if _is_ring(op):
            once = [x for x in body[:i] if isinstance(x, H.TmaLoadOp)]
            if not once:
                return body, []
            prefetches = _prefetches(once, scope)
            return (*body[:i], *prefetches, *body[i:]), list(dict.fromkeys(x.dst for x in once))
        if isinstance(op, K.IfOp):
            inner, found = _insert(op.body, scope)
            if found:
                return (*body[:i], dataclasses.replace(op, body=inner), *body[i + 1:]), found
    return body, []


def _resolved(e: Expr, scope: dict[str, Expr]) -> Expr:
    """`e` with the lets in scope substituted until only grid names and parameters remain."""
    for _ in range(16):
        names = free_names(e) & scope.keys()
        if not names:
            break
        for n in names:
            e = substitute(e, n, scope[n])
    if rest := {n for n in free_names(e) if n not in _GRID and not n.startswith("p.")}:
        raise Declined(f"a once-load's coordinate `{e}` reads {', '.join(sorted(rest))}, not only the grid "
                       "and the parameters")
    return e


def _prefetches(once: list[H.TmaLoadOp], scope: dict[str, Expr]) -> list[K.Op]:
    gx, gy, gz = (Var(f"gridDim.{a}") for a in "xyz")
    linear = BinOp("+", Var("blockIdx.x"), BinOp("*", gx, BinOp("+", Var("blockIdx.y"),
                                                                    BinOp("*", gy, Var("blockIdx.z")))))
    loc = once[0].loc
    decode = [K.LetOp(name=NEXT, type="i32", value=BinOp("+", linear, Var(f"p.{H.RESIDENT_CTAS}")), loc=loc),
              K.LetOp(name=NEXT_X, type="i32", value=BinOp("%", Var(NEXT), gx), loc=loc),
              K.LetOp(name=NEXT_Y, type="i32", value=BinOp("%", BinOp("/", Var(NEXT), gx), gy), loc=loc),
              K.LetOp(name=NEXT_Z, type="i32", value=BinOp("/", Var(NEXT), BinOp("*", gx, gy)), loc=loc)]
    moved = {"blockIdx.x": Var(NEXT_X), "blockIdx.y": Var(NEXT_Y), "blockIdx.z": Var(NEXT_Z)}
    ops = []
    for load in once:
        coord = []
        for c in load.coord:
            c = _resolved(c, scope)
            for name, value in moved.items():
                c = substitute(c, name, value)
            coord.append(c)
        ops.append(H.TmaPrefetchTileOp(desc=load.desc, coord=tuple(coord), loc=load.loc))
    total = BinOp("*", gx, BinOp("*", gy, gz))
    return [*decode, K.IfOp(cond=BinOp("<", Var(NEXT), total), body=tuple(ops), loc=loc)]
