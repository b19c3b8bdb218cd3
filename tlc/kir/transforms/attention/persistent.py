"""`persistent` (sm_90a, warp-specialised kernels): each CTA loops over output tiles a dynamic
scheduler hands out.

A one-tile-per-CTA grid pays each tile's prologue (the Q load, the first GEMM) and epilogue (the
output's staging and store) with the loads idle; with short sequences (8 KV tiles at S = 1k) that is
a large share. Persistent, the grid is min(tiles, resident CTAs) (`launch.ctas`: the SMs times the
CTAs one SM holds, from the driver at launch) and

    producer (one thread): tile = blockIdx.x; loop: if tile >= tiles: hand over the end, break;
        next = atomicAdd(p.tile_counter, 1) + gridDim.x  (drawn early; the launcher zeroes the counter)
        wait empty_<once>(parity of the tile's turn ^ 1); slot = tile; load the once-tiles (Q); the
        KV ring loop; ring += its trips; tile = next
    consumers: loop: wait full_<once>(parity); tile = slot; if tile >= tiles: break; the body;
        release empty_<once> after the last op that touches the once-tile's bytes; ring += trips

Tile numbers map to grid coordinates x fastest, the order the hardware launches a grid in (causal's
reversed query tiles: longest first), and a CTA takes the next number when it is ready for it, as the
hardware assigns CTAs. So the producer loads the next tile's Q and first K/V stages while the
consumers finish this one. With `static` (Param StaticTiles) CTA b takes tiles b, b + gridDim.x, …; a
causal kernel's tiles then number the heads and batches fastest (query tile slowest, longest first), so
each CTA sweeps the tile lengths instead of taking one query tile of every head. The rings keep turning
across tiles: `ring` (the trips of earlier tiles) is added to the trip each stage and phase is computed
from, identically in both roles. An epilogue buffer that reuses a once-tile's bytes moves to its own
bytes when shared memory allows, so the once-tile is released after its last GEMM instead of after the
store.

Declarations that read the grid coordinates (the block index, the output's head and batch offsets)
move into each role's tile loop. A kernel of another shape keeps one tile per CTA, with the reason
in the schedule notes.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from tlc.kir import ops as K
from tlc.kir import ops_sm90 as H
from tlc.kir.base import substitute_names
from tlc.kir.expr import BinOp, Call, Const, Expr, Var, free_names
from tlc.kir.transforms.base import Facts, Notes, Transform
from tlc.kir.transforms.schedule import Schedule
from tlc.kir.transforms.warp_specialize import _live
from tlc.lowering.resources import shared_buffers

GRID_NAMES = {f"{g}.{a}" for g in ("blockIdx", "gridDim") for a in "xyz"}
RESIDENT_CTAS = "launch.ctas"      # filled by the launcher: SMs × the occupancy of this kernel
COUNTER = H.TILE_COUNTER            # the parameter field: a zeroed int per launch, the tiles drawn so far
ITER, TILE, RING, NEXT, SLOT = "tile_iter", "tile", "ring", "tile_next", "tile_slot"
_NAMES = (ITER, TILE, RING, NEXT, "tile_x", "tile_y", "tile_z")
_MBAR_OPS = (H.MbarrierWaitOp, H.MbarrierArriveOp, H.MbarrierArriveExpectTxOp, H.TmaLoadOp)


class Declined(Exception):
    """The kernel keeps one tile per CTA; the message says why."""


def _names(op: K.Op) -> set[str]:
    return K.names_used((op,))


def _shared_touched(op: K.Op) -> frozenset[str]:
    """The shared buffers `op` and the ops inside it read, or write from registers."""
    effects = K.nested_effects(op)
    return effects.shared_reads | effects.shared_writes


def _empty(full: str) -> str:
    return "empty_" + full[len("full_"):]


def _producer_parity() -> Expr:
    """The producer's wait on a once-tile's `empty` barrier: the parity before this tile's (a fresh
    barrier counts that one complete, so the first tile's wait passes)."""
    return BinOp("-", Const(1), BinOp("%", Var(ITER), Const(2)))


def _align(n: int, to: int) -> int:
    return -(-n // to) * to


class Persistent:
    def __init__(self, kernel: H.Sm90KernelOp, smem_limit: int, static: bool = False) -> None:
        self.kernel, self.limit, self.static = kernel, smem_limit, static
        self.notes: list[str] = []

    def run(self, params: H.TmaParamsOp) -> tuple[H.Sm90KernelOp, H.TmaParamsOp, list[str]]:
        body = self.kernel.body
        if not body or not isinstance(body[-1], H.WarpSpecializeOp):
            raise Declined("the kernel is not warp-specialised")
        roles: H.WarpSpecializeOp = body[-1]
        defined = {n for op in K.walk(self.kernel) for n in op.defined_names()}
        if clash := {*_NAMES, SLOT} & defined:
            raise Declined(f"the kernel already defines {', '.join(sorted(clash))}")
        if COUNTER in {n for n, _ in params.fields}:
            raise Declined(f"the parameter struct already has a field {COUNTER}")
        gx, gy, gz = self.kernel.grid
        if self.kernel.own_grid_axes():   # the tile decode below reads z as the batch
            raise Declined(f"the grid's z is `{gz}`: the kernel has grid axes of its own")
        for g in (gx, gy, gz):
            if any(not n.startswith("p.") for n in free_names(g)):
                raise Declined(f"the grid `{g}` is not computed from the launch parameters")
        prefix = list(body[:-1])
        moved = self._moved(prefix)
        producer = self._producer_body(roles)
        ring_loop, once_bars = self._producer_shape(producer)
        if not once_bars:
            raise Declined("nothing is loaded once per tile to hand the tile's number over with")
        ring_bars = {x.bar for x in K.walk(ring_loop) if isinstance(x, _MBAR_OPS)} if ring_loop else set()
        position = self._positions(roles, ring_bars)
        trips = Call("max", (BinOp("-", ring_loop.stop, ring_loop.start), Const(0))) if ring_loop else None

        prefix = self._separate_staging(prefix, once_bars)
        empties, inits = self._empty_barriers(once_bars)
        count = BinOp("*", BinOp("*", gx, gy), gz)
        tile = Var(TILE)
        loc = self.kernel.loc
        # Static tiles of different lengths (causal) number the heads and batches fastest: CTA b's tiles
        # b, b + gridDim.x, … then sweep every query tile once instead of landing on one (x fastest with 22
        # query tiles and 132 CTAs gives CTA b query tile b % 22 of every head).
        by_head = self.static and any(isinstance(x, K.MaskOp) and x.causal for x in K.walk(roles))
        if by_head:
            order = [K.LetOp(name="tile_x", type="i32", value=BinOp("/", tile, BinOp("*", gy, gz)), loc=loc),
                     K.LetOp(name="tile_y", type="i32", value=BinOp("%", tile, gy), loc=loc),
                     K.LetOp(name="tile_z", type="i32", value=BinOp("%", BinOp("/", tile, gy), gz), loc=loc)]
        else:
            order = [K.LetOp(name="tile_x", type="i32", value=BinOp("%", tile, gx), loc=loc),
                     K.LetOp(name="tile_y", type="i32", value=BinOp("%", BinOp("/", tile, gx), gy), loc=loc),
                     K.LetOp(name="tile_z", type="i32", value=BinOp("/", tile, BinOp("*", gx, gy)), loc=loc)]
        coords = {f"blockIdx.{a}": Var(f"tile_{a}") for a in "xyz"}
        coords.update({f"gridDim.{a}": e for a, e in zip("xyz", (gx, gy, gz))})
        tile_lets = [substitute_names(op, coords) for op in moved]
        advance = [K.CounterAddOp(counter=RING, value=trips, loc=loc)] if trips is not None else []

        def looped(head: list[K.Op], role: list[K.Op], tail: list[K.Op]) -> list[K.Op]:
            decls = _live(tile_lets, [*role, *tail])
            loop = K.ForOp(var=ITER, start=Const(0), stop=Const(2**31 - 1), step=1,
                           body=(*head, *order, *decls, *role, *tail), loc=loc)
            counter = [K.CounterOp(name=RING, init=Const(0), loc=loc)] if trips is not None else []
            return [*counter, loop]

        handover = once_bars[0]
        consumer = self._consumer(roles, once_bars, position, prefix)
        consumer = self._fence_tiles(consumer, roles, ring_bars, once_bars)
        consumer_head = [H.MbarrierWaitOp(bar=handover, stage=Const(0), phase=BinOp("%", Var(ITER), Const(2)),
                                          loc=loc),
                         H.TileSlotLoadOp(name=TILE, slot=SLOT, loc=loc),
                         K.IfOp(cond=BinOp(">=", tile, count), body=(K.BreakOp(loc=loc),), loc=loc)]
        produce = self._producer(producer, once_bars, position, handover)
        released = H.MbarrierWaitOp(bar=_empty(handover), stage=Const(0), phase=_producer_parity(), loc=loc)
        producer_head = [K.IfOp(cond=BinOp(">=", tile, count), loc=loc, body=(
            released, H.TileSlotStoreOp(slot=SLOT, value=tile, loc=loc),
            H.MbarrierArriveOp(bar=handover, stage=Const(0), loc=loc), K.BreakOp(loc=loc)))]
        # static: tiles blockIdx.x, + gridDim.x, … (the producer's coordinates stay uniform); else the counter's next
        draw = [] if self.static else [H.AtomicAddOp(name=NEXT, ptr=Var(f"p.{COUNTER}"), value=Const(1), loc=loc)]
        base = tile if self.static else Var(NEXT)
        producer_tail = [*advance, K.CounterSetOp(counter=TILE, value=BinOp("+", base, Var("gridDim.x")), loc=loc)]
        first = roles.producer[0]
        producer_body = [K.CounterOp(name=TILE, init=Var("blockIdx.x"), loc=loc),
                         *looped(producer_head, [*draw, *produce], producer_tail)]
        new_roles = dataclasses.replace(roles, consumer=tuple(looped(consumer_head, consumer, advance)),
                                        producer=(dataclasses.replace(first, body=tuple(producer_body)),))

        stay = [op for op in prefix if op not in moved]
        init_at = next(i for i, op in enumerate(stay) if isinstance(op, K.IfOp))
        stay[init_at] = dataclasses.replace(stay[init_at], body=(*stay[init_at].body, *inits))
        at = self._bars_end
        for bar in empties:
            stay.insert(init_at, dataclasses.replace(bar, offset_bytes=at))
            init_at += 1
            at += 8
        stay.insert(init_at, H.TileSlotOp(name=SLOT, offset_bytes=at, loc=loc))
        smem = max(self.kernel.smem_bytes, at + 8, self._staging_end)
        kernel = dataclasses.replace(
            self.kernel, grid=(Call("min", (count, Var(RESIDENT_CTAS))), Const(1), Const(1)), smem_bytes=smem,
            body=(*stay, new_roles))
        if not self.static:   # the dynamic scheduler's counter, zeroed by the launcher per launch
            params = dataclasses.replace(params, fields=(*params.fields, (COUNTER, "ptr<i32>")))
        once = ", ".join(b[len("full_"):] for b in once_bars)
        how = ("takes every gridDim.x-th tile from blockIdx.x on (Param StaticTiles"
               + ("; heads and batches numbered fastest, so each CTA sweeps the causal tile lengths)" if by_head else ")")
               if self.static else f"draws each next tile from p.{COUNTER} (atomicAdd, zeroed per launch)")
        self.notes.append(f"persistent: a CTA per resident slot loops over the tiles (grid min(tiles, {RESIDENT_CTAS})); "
                          f"the producer {how} and "
                          f"hands its number over in shared memory with {once.split(', ')[0]}'s barrier; {once} "
                          f"released per tile through {', '.join(b.name for b in empties)}"
                          + ("; the rings' position carried across tiles" if trips is not None else ""))
        return kernel, params, self.notes

    # ------------------------------------------------------------------ reading the kernel
    def _moved(self, prefix: list[K.Op]) -> list[K.Op]:
        """The declarations that read the grid coordinates, directly or through another one."""
        tainted, moved = set(GRID_NAMES), []
        for op in prefix:
            if _names(op) & tainted:
                if not isinstance(op, (K.LetOp, K.GlobalTensorOp, K.GlobalTileOp, K.PartitionOp, K.IdentityTileOp)):
                    raise Declined(f"{type(op).__name__} {getattr(op, 'name', '')} reads the grid coordinates")
                moved.append(op)
                tainted |= set(op.defined_names())
        roles = self.kernel.body[-1]
        if any(x.used_names() & GRID_NAMES for x in K.walk(roles)):
            raise Declined("the roles read blockIdx or gridDim themselves")
        return moved

    @staticmethod
    def _producer_body(roles: H.WarpSpecializeOp) -> tuple[K.Op, ...]:
        if len(roles.producer) != 1 or not isinstance(roles.producer[0], K.IfOp):
            raise Declined("the producer is not one elected thread")
        return roles.producer[0].body

    @staticmethod
    def _producer_shape(producer: tuple[K.Op, ...]) -> tuple[K.ForOp | None, list[str]]:
        loops = [op for op in producer if isinstance(op, K.ForOp)]
        if len(loops) > 1:
            raise Declined("the producer runs more than one ring loop")
        once = []
        for op in producer:
            if isinstance(op, H.MbarrierArriveExpectTxOp):
                if op.stage != Const(0):
                    raise Declined(f"{op.bar} is armed at stage `{op.stage}` outside a loop")
                once.append(op.bar)
            elif not isinstance(op, (H.TmaLoadOp, K.ForOp)):
                raise Declined(f"the producer runs a {type(op).__name__} outside its loads")
        return (loops[0] if loops else None), once

    @staticmethod
    def _positions(roles: H.WarpSpecializeOp, ring_bars: set[str]) -> set[str]:
        """The scalars the ring barriers' stage and phase are read from (LetOps of both roles)."""
        used: set[str] = set()
        for x in K.walk(roles):
            if isinstance(x, _MBAR_OPS) and x.bar in ring_bars:
                for f in ("stage", "phase"):
                    e = getattr(x, f, None)
                    if e is None:
                        continue
                    names = free_names(e)
                    if not names:
                        raise Declined(f"{x.bar}'s {f} `{e}` is a constant in a ring")
                    used |= names
        return used

    @staticmethod
    def _ring_let(op: K.LetOp) -> K.LetOp:
        """`trip % S` → `(ring + trip) % S`; `trip / S % 2` → `(ring + trip) / S % 2` (warp-specialize's
        stage and phase, after any substitution of the trip by overlap-gemms)."""
        v = op.value
        if not (isinstance(v, BinOp) and v.op == "%" and isinstance(v.rhs, Const)):
            raise Declined(f"ring position {op.name} = `{v}` is not a trip modulo the stages")
        inner = v.lhs
        if isinstance(inner, BinOp) and inner.op == "/" and v.rhs == Const(2):      # the phase
            trip = BinOp("/", BinOp("+", Var(RING), inner.lhs), inner.rhs)
        else:                                                                       # the stage
            trip = BinOp("+", Var(RING), inner)
        return dataclasses.replace(op, value=BinOp("%", trip, v.rhs))

    def _restage(self, ops: tuple[K.Op, ...], position: set[str]) -> tuple[K.Op, ...]:
        out = []
        for op in ops:
            if isinstance(op, K.LetOp) and op.name in position:
                op = self._ring_let(op)
            elif op.regions:
                op = dataclasses.replace(op, **{r: self._restage(getattr(op, r), position) for r in op.regions})
            out.append(op)
        return tuple(out)

    # ------------------------------------------------------------------ shared memory
    def _separate_staging(self, prefix: list[K.Op], once_bars: list[str]) -> list[K.Op]:
        """A buffer reusing a once-tile's bytes (the epilogue's staging) gets its own, where they fit.
        The new barriers and the tile slot go after the old barriers, the moved buffer after them."""
        self._staging_end = 0
        self._bars_end = max([op.offset_bytes + 8 * op.count for op in prefix if isinstance(op, H.MbarrierOp)]
                             + [self.kernel.smem_bytes])
        buffers = {b.name: b for b in shared_buffers(self.kernel)}
        once = [bar[len("full_"):] for bar in once_bars]
        end = _align(self._bars_end + 8 * len(once) + 8, 1024)
        out = []
        for op in prefix:
            if isinstance(op, K.SharedBufferOp) and op.reuse and any(self._overlap(buffers[op.name], buffers[b])
                                                                     for b in once if b in buffers):
                size = buffers[op.name].bytes
                if end + size <= self.limit:
                    op = dataclasses.replace(op, offset_bytes=end, reuse=False)
                    end += size
                    self._staging_end = end
                else:
                    self.notes.append(f"persistent: {op.name} keeps {op.offset_bytes}.. (own bytes would need "
                                      f"{end + size} > {self.limit}); its tile is released after the store")
            out.append(op)
        return out

    @staticmethod
    def _overlap(a, b) -> bool:
        return a.offset < b.offset + b.bytes and b.offset < a.offset + a.bytes

    def _aliases(self, prefix: list[K.Op], buffer: str) -> set[str]:
        """`buffer`, the views over it and the buffers sharing its bytes (after any move)."""
        kernel = dataclasses.replace(self.kernel, body=(*prefix, self.kernel.body[-1]))
        buffers = {b.name: b for b in shared_buffers(kernel)}
        names = {buffer} | {n for n, b in buffers.items() if buffer in buffers and self._overlap(b, buffers[buffer])}
        views = [op for op in prefix if isinstance(op, K.SharedViewOp)]
        grew = True
        while grew:
            new = {v.name for v in views if v.of in names} - names
            names |= new
            grew = bool(new)
        return names

    def _empty_barriers(self, once_bars: list[str]) -> tuple[list[H.MbarrierOp], list[K.Op]]:
        """One `empty` barrier per once-tile, every consumer thread arriving once per tile."""
        consumers = self.kernel.threads - self.kernel.body[-1].producer_threads
        bars, inits = [], []
        for full in once_bars:
            name = _empty(full)
            bars.append(H.MbarrierOp(name=name, count=1, offset_bytes=0, loc=self.kernel.loc))
            inits.append(H.MbarrierInitOp(bar=name, arrivals=consumers, loc=self.kernel.loc))
        return bars, inits

    # ------------------------------------------------------------------ the two roles
    def _consumer(self, roles: H.WarpSpecializeOp, once_bars: list[str], position: set[str],
                  prefix: list[K.Op]) -> list[K.Op]:
        """The consumers' tile body: the once-tiles' waits at this tile's parity (the first one's moves
        to the loop's head, where the tile number is read), each once-tile released after the last op
        that touches its bytes, once its wgmmas retired."""
        body = list(self._restage(roles.consumer, position))
        parity = BinOp("%", Var(ITER), Const(2))
        for full in once_bars:
            buffer = full[len("full_"):]
            waits = [i for i, op in enumerate(body) if isinstance(op, H.MbarrierWaitOp) and op.bar == full]
            if len(waits) != 1 or body[waits[0]].phase != Const(0):
                raise Declined(f"the consumers wait on {full} other than once at phase 0")
            loc = body[waits[0]].loc
            if full == once_bars[0]:
                del body[waits[0]]
            else:
                body[waits[0]] = dataclasses.replace(body[waits[0]], phase=parity)
            touched = self._aliases(prefix, buffer)
            last = max((i for i, op in enumerate(body) if touched & _shared_touched(op)), default=-1)
            release = [H.WgmmaWaitOp(pending=0, loc=loc), H.MbarrierArriveOp(bar=_empty(full), stage=Const(0), loc=loc)]
            if any(touched & K.nested_effects(op).shared_writes for op in body):
                # the consumers wrote these bytes (an epilogue staged over the once-tile) through the generic
                # proxy; the next tile's TMA load writes them through the async proxy: order the two
                release.insert(1, H.FenceProxyAsyncOp(loc=loc))
            body[last + 1:last + 1] = release
        return body

    def _fence_tiles(self, body: list[K.Op], roles: H.WarpSpecializeOp, ring_bars: set[str],
                     once_bars: list[str]) -> list[K.Op]:
        """The one-tile schedule ordered the consumers' own shared memory within a tile; across tiles
        a write at the top of tile t+1 could overtake another thread's read at the end of tile t.
        Each buffer the consumers write must first be touched after a barrier of all consumers in the
        tile body, else one opens the body; a wgmma reading such a buffer (its reads retire
        asynchronously) is declined."""
        loaded = {x.dst for x in K.walk(roles) if isinstance(x, H.TmaLoadOp)}
        written = {b for op in body for b in K.nested_effects(op).shared_writes} - loaded
        if not written:
            return body
        for x in (x for op in body for x in K.walk(op)):
            if isinstance(x, H.WgmmaOp) and written & set(x.reads):
                raise Declined(f"a wgmma reads {', '.join(sorted(written & set(x.reads)))}, which the consumers "
                               "write: its order across tiles is not checked")
        consumers = self.kernel.threads - roles.producer_threads
        fenced: set[str] = set()
        for op in body:
            if isinstance(op, H.NamedBarrierOp) and not op.arrive_only and op.threads == consumers:
                fenced = set(written)
            touched = _shared_touched(op) & written
            if touched - fenced:
                return [H.NamedBarrierOp(id=0, threads=consumers, loc=self.kernel.loc), *body]
        return body

    def _producer(self, producer: tuple[K.Op, ...], once_bars: list[str], position: set[str],
                  handover: str) -> list[K.Op]:
        """The producer's tile body: each once-tile re-armed once the consumers released it; the
        tile's number stored in the slot before the handover barrier is armed."""
        out: list[K.Op] = []
        for op in self._restage(producer, position):
            if isinstance(op, H.MbarrierArriveExpectTxOp) and op.bar in once_bars:
                out.append(H.MbarrierWaitOp(bar=_empty(op.bar), stage=Const(0), phase=_producer_parity(), loc=op.loc))
                if op.bar == handover:
                    out.append(H.TileSlotStoreOp(slot=SLOT, value=Var(TILE), loc=op.loc))
            out.append(op)
        return out


def make_persistent(program: K.ProgramOp, smem_limit: int, static: bool = False) -> tuple[K.ProgramOp, list[str]]:
    """`program` with its kernel looping over its tiles, or unchanged with the reason in the notes; `static`:
    each CTA takes tiles blockIdx.x + k·gridDim.x instead of drawing them from the atomic counter."""
    kernels = program.kernels()
    if not any(isinstance(op, H.WarpSpecializeOp) for op in K.walk(program)):
        return program, ["persistent: kept one tile per CTA: the kernel is not warp-specialised"]
    params = [op for op in program.body if isinstance(op, H.TmaParamsOp)]
    if len(kernels) != 1 or not isinstance(kernels[0], H.Sm90KernelOp) or len(params) != 1:
        return program, ["persistent: kept one tile per CTA: not one sm_90a kernel with TMA parameters"]
    try:
        kernel, new_params, notes = Persistent(kernels[0], smem_limit, static).run(params[0])
    except Declined as why:
        return program, [f"persistent: kept one tile per CTA: {why}"]
    body = tuple(kernel if op is kernels[0] else new_params if op is params[0] else op for op in program.body)
    out = dataclasses.replace(program, body=body)
    out.verify()
    return out, notes


@dataclass(frozen=True)
class PersistentTransform(Transform):
    """`Param Persistent = true` (schedule.persistent; off by default) turns it on; `Param StaticTiles =
    true` (schedule.static_tiles) hands each CTA the tiles blockIdx.x + k·gridDim.x instead of a dynamic
    scheduler's (the producer's TMA coordinates then stay uniform: no register→uniform moves per load)."""

    name: ClassVar[str] = "persistent"

    def apply(self, program: K.ProgramOp, schedule: Schedule, facts: Facts) -> tuple[K.ProgramOp, Notes]:
        if not schedule.persistent:
            return program, []
        return make_persistent(program, facts.arch.smem_per_block, schedule.static_tiles)
