"""`persistent` (sm_90a, warp-specialised kernels): each CTA loops over output tiles.

A one-tile-per-CTA grid pays each tile's prologue (the Q load, the first GEMM) and epilogue (the
output's staging and store) with the tensor cores idle; with short sequences (8 KV tiles at S = 1k)
that is a large share. Persistent, the grid is min(tiles, resident CTAs) (`launch.ctas`: the SMs
times the CTAs one SM holds, from the driver at launch) and both roles run the kernel's body once per
tile t = blockIdx.x + i·gridDim.x, the grid coordinates recovered from t (x fastest):

    producer: for i: wait empty_<once>(parity of i ^ 1); load the once-tiles; the KV ring loop
    consumers: for i: wait full_<once>(parity of i); the body; release empty_<once> after the last
               op that touches the once-tile's bytes (its readers, and a buffer reusing them)

so the producer loads tile t+1's Q and first K/V stages while the consumers finish tile t. The rings
keep turning across tiles: a counter `ring` (the trips of earlier tiles) is added to the trip each
stage and phase is computed from, identically in both roles. An epilogue buffer that reuses a
once-tile's bytes moves to its own bytes when shared memory allows, so the once-tile is released
after its last GEMM instead of after the store.

Declarations that read the grid coordinates (the block index, the output's head and batch offsets)
move into each role's tile loop. A kernel of another shape keeps one tile per CTA, with the reason
in the schedule notes.
"""
from __future__ import annotations

import dataclasses

from tlc.kir import ops as K
from tlc.kir import ops_sm90 as H
from tlc.kir.expr import BinOp, Call, Const, Expr, Var, free_names, substitute
from tlc.lowering.resources import shared_buffers
from tlc.lowering.sync import effects
from tlc.lowering.warp_specialize import _live

GRID_NAMES = {f"{g}.{a}" for g in ("blockIdx", "gridDim") for a in "xyz"}
RESIDENT_CTAS = "launch.ctas"      # filled by the launcher: SMs × the occupancy of this kernel
ITER, TILE, RING = "tile_iter", "tile", "ring"
# K/V bytes the CTAs at work may share in L2 (an H100's and H200's is 50 MB; Q and O stream past it)
L2_BYTES = 32 << 20
_ORDER_NAMES = ("tile_x", "tile_y", "tile_z", "tile_heads", "tile_section_heads", "tile_section",
                "tile_in_section", "tile_heads_here", "tile_yz")
_MBAR_OPS = (H.MbarrierWaitOp, H.MbarrierArriveOp, H.MbarrierArriveExpectTxOp, H.TmaLoadOp)


class Declined(Exception):
    """The kernel keeps one tile per CTA; the message says why."""


def _names(op: K.Op) -> set[str]:
    return {n for x in K.walk(op) for n in x.used_names()}


def _align(n: int, to: int) -> int:
    return -(-n // to) * to


class Persistent:
    def __init__(self, kernel: H.Sm90KernelOp, smem_limit: int) -> None:
        self.kernel, self.limit = kernel, smem_limit
        self.notes: list[str] = []

    def run(self) -> tuple[H.Sm90KernelOp, list[str]]:
        body = self.kernel.body
        if not body or not isinstance(body[-1], H.WarpSpecializeOp):
            raise Declined("the kernel is not warp-specialised")
        roles: H.WarpSpecializeOp = body[-1]
        defined = {n for op in K.walk(self.kernel) for n in op.defined_names()}
        if clash := {ITER, TILE, RING, *_ORDER_NAMES} & defined:
            raise Declined(f"the kernel already defines {', '.join(sorted(clash))}")
        gx, gy, gz = self.kernel.grid
        for g in (gx, gy, gz):
            if any(not n.startswith("p.") for n in free_names(g)):
                raise Declined(f"the grid `{g}` is not computed from the launch parameters")
        prefix = list(body[:-1])
        moved = self._moved(prefix)
        producer = self._producer_body(roles)
        ring_loop, once_bars = self._producer_shape(producer)
        ring_bars = {x.bar for x in K.walk(ring_loop) if isinstance(x, _MBAR_OPS)} if ring_loop else set()
        position = self._positions(roles, ring_bars)

        prefix, roles = self._separate_staging(prefix, roles, once_bars)
        empties, inits = self._empty_barriers(prefix, once_bars)
        consumer = self._consumer(roles, once_bars, position, prefix)
        produce = self._producer(producer, once_bars, position)
        trips = None
        if ring_loop is not None:
            trips = Call("max", (BinOp("-", ring_loop.stop, ring_loop.start), Const(0)))

        grid = dict(zip(("x", "y", "z"), (gx, gy, gz)))
        uneven = trips is not None and bool(free_names(trips) & self._x_names(moved))
        order = self._order(gx, gy, gz, ring_loop if uneven else None, prefix)
        coords = {f"blockIdx.{a}": Var(f"tile_{a}") for a in "xyz"}
        coords.update({f"gridDim.{a}": e for a, e in grid.items()})
        tile_lets = [self._retarget(op, coords) for op in moved]
        count = BinOp("*", BinOp("*", gx, gy), gz)

        first_tile, rounds = self._rounds(count, uneven)

        def looped(role: list[K.Op]) -> list[K.Op]:
            decls = _live(tile_lets, role)
            head = [K.LetOp(name=TILE, type="i32", value=first_tile, loc=self.kernel.loc), *order]
            tail = [K.CounterAddOp(counter=RING, value=trips, loc=self.kernel.loc)] if trips is not None else []
            loop = K.ForOp(var=ITER, start=Const(0), stop=rounds, step=1, body=(*head, *decls, *role, *tail),
                           loc=self.kernel.loc)
            counter = [K.CounterOp(name=RING, init=Const(0), loc=self.kernel.loc)] if trips is not None else []
            return [*counter, loop]

        first = roles.producer[0]
        new_roles = dataclasses.replace(
            roles, consumer=tuple(looped(consumer)),
            producer=(dataclasses.replace(first, body=tuple(looped(produce))),))
        stay = [op for op in prefix if op not in moved]
        init_at = next(i for i, op in enumerate(stay) if isinstance(op, K.IfOp))
        init = stay[init_at]
        stay[init_at] = dataclasses.replace(init, body=(*init.body, *inits))
        bars_end = max([op.offset_bytes + 8 * op.count for op in stay if isinstance(op, H.MbarrierOp)] + [0])
        at = bars_end
        for bar in empties:
            stay.insert(init_at, dataclasses.replace(bar, offset_bytes=at))
            init_at += 1
            at += 8
        smem = max(self.kernel.smem_bytes, at, self._staging_end)
        kernel = dataclasses.replace(
            self.kernel, grid=(Call("min", (count, Var(RESIDENT_CTAS))), Const(1), Const(1)), smem_bytes=smem,
            body=(*stay, new_roles))
        once = ", ".join(b[len("full_"):] for b in once_bars)
        order = (f"query tile slowest within sections of heads whose K/V fit {L2_BYTES >> 20} MiB of L2, rounds "
                 "handed out in a snake (their KV trips differ: each CTA's tiles add up to about the others')"
                 if uneven
                 else "query tile fastest")
        self.notes.append(f"persistent: a CTA per resident slot loops over the tiles (grid min(tiles, "
                          f"{RESIDENT_CTAS}); {order}); {once or 'no tile'} released per tile through "
                          f"{', '.join(b.name for b in empties) or 'no barrier'}"
                          + ("; the rings' position carried across tiles" if trips is not None else ""))
        return kernel, self.notes

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
    def _rounds(count: Expr, snake: bool) -> tuple[Expr, Expr]:
        """(`tile` of round `tile_iter`, this CTA's number of rounds). Round k hands the CTAs tiles
        k·G .. k·G + G − 1 (G = gridDim.x); `snake` reverses every other round, so that where tiles come
        longest first the CTA that took a round's longest takes the next round's shortest."""
        cta, grid, it = Var("blockIdx.x"), Var("gridDim.x"), Var(ITER)
        if not snake:
            return (BinOp("+", cta, BinOp("*", it, grid)),
                    Call("ceil_div", (BinOp("-", count, cta), grid)))

        def place(k: Expr) -> Expr:
            return Call("select", (BinOp("==", BinOp("%", k, Const(2)), Const(0)), cta,
                                   BinOp("-", BinOp("-", grid, Const(1)), cta)))

        full = BinOp("/", count, grid)
        partial = Call("select", (BinOp("<", place(full), BinOp("%", count, grid)), Const(1), Const(0)))
        return BinOp("+", place(it), BinOp("*", it, grid)), BinOp("+", full, partial)

    def _order(self, gx: Expr, gy: Expr, gz: Expr, uneven_loop: K.ForOp | None, prefix: list[K.Op]) -> list[K.LetOp]:
        """LetOps `tile_x/y/z`: the grid coordinates of tile number `tile`.

        Even tiles: x fastest, as the hardware launches a grid, so the CTAs at work share K/V in L2.
        Tiles whose KV trips depend on x (causal): heads are cut into sections whose K/V fit L2_BYTES,
        and within a section every head's tile at one x comes before the next x, so a static round
        robin hands each CTA tiles of about the same length while the CTAs at work share a section's
        K/V (x slowest over all heads read every head's K/V once per x: bandwidth-bound at S = 1k)."""
        loc = self.kernel.loc

        def let(name: str, value: Expr) -> K.LetOp:
            return K.LetOp(name=name, type="i32", value=value, loc=loc)

        tile = Var(TILE)
        if uneven_loop is None:
            return [let("tile_x", BinOp("%", tile, gx)), let("tile_y", BinOp("%", BinOp("/", tile, gx), gy)),
                    let("tile_z", BinOp("/", tile, BinOp("*", gx, gy)))]
        row_bytes = self._kv_row_bytes(uneven_loop, prefix)
        heads, per = Var("tile_heads"), Var("tile_section_heads")
        section, within, here = Var("tile_section"), Var("tile_in_section"), Var("tile_heads_here")
        fit = BinOp("/", Const(L2_BYTES // row_bytes), Call("max", (Var("p.seqlen_k"), Const(1))))
        return [
            let("tile_heads", BinOp("*", gy, gz)),
            let("tile_section_heads", Call("max", (Const(1), Call("min", (heads, fit))))),
            let("tile_section", BinOp("/", tile, BinOp("*", per, gx))),
            let("tile_in_section", BinOp("-", tile, BinOp("*", BinOp("*", section, per), gx))),
            let("tile_heads_here", Call("min", (per, BinOp("-", heads, BinOp("*", section, per))))),
            let("tile_yz", BinOp("+", BinOp("*", section, per), BinOp("%", within, here))),
            let("tile_x", BinOp("/", within, here)),
            let("tile_y", BinOp("%", Var("tile_yz"), gy)),
            let("tile_z", BinOp("/", Var("tile_yz"), gy)),
        ]

    def _kv_row_bytes(self, loop: K.ForOp, prefix: list[K.Op]) -> int:
        """Bytes of one row of every tile the ring loop loads (K and V: one key's row of each)."""
        if "p.seqlen_k" not in free_names(loop.stop):
            raise Declined(f"the ring loop's trips (`{loop.stop}`) do not follow p.seqlen_k")
        descs = {op.name: op for op in prefix if isinstance(op, H.TmaDescriptorOp)}
        rows = {x.bar: descs[x.desc].box[2] for x in K.walk(loop) if isinstance(x, H.TmaLoadOp)}
        total = sum(x.bytes // rows[x.bar] for x in K.walk(loop) if isinstance(x, H.MbarrierArriveExpectTxOp))
        if not total:
            raise Declined("the ring loop loads nothing")
        return total

    @staticmethod
    def _x_names(moved: list[K.Op]) -> set[str]:
        """The declarations that read the grid's x coordinate (the query tile), directly or not."""
        names = {"blockIdx.x", "gridDim.x"}
        for op in moved:
            if op.used_names() & names:
                names |= set(op.defined_names())
        return names

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

    @staticmethod
    def _retarget(op: K.Op, coords: dict[str, Expr]) -> K.Op:
        changes = {}
        for f in dataclasses.fields(op):
            v = getattr(op, f.name)
            if isinstance(v, Expr):
                for name, value in coords.items():
                    v = substitute(v, name, value)
                changes[f.name] = v
            elif isinstance(v, tuple) and v and all(isinstance(x, Expr) for x in v):
                new = []
                for x in v:
                    for name, value in coords.items():
                        x = substitute(x, name, value)
                    new.append(x)
                changes[f.name] = tuple(new)
        return dataclasses.replace(op, **changes)

    # ------------------------------------------------------------------ shared memory
    def _separate_staging(self, prefix: list[K.Op], roles: H.WarpSpecializeOp, once_bars: list[str]):
        """A buffer reusing a once-tile's bytes (the epilogue's staging) gets its own, where they fit."""
        self._staging_end = 0
        self._prefix = prefix
        buffers = {b.name: b for b in shared_buffers(self.kernel)}
        once = [bar[len("full_"):] for bar in once_bars]
        end = _align(self.kernel.smem_bytes + 8 * len(once), 1024)
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
        return out, roles

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

    def _empty_barriers(self, prefix, once_bars: list[str]) -> tuple[list[H.MbarrierOp], list[K.Op]]:
        consumers = self.kernel.threads - self.kernel.body[-1].producer_threads
        bars, inits = [], []
        for full in once_bars:
            name = "empty_" + full[len("full_"):]
            bars.append(H.MbarrierOp(name=name, count=1, offset_bytes=0, loc=self.kernel.loc))
            inits.append(H.MbarrierInitOp(bar=name, arrivals=consumers, loc=self.kernel.loc))
        return bars, inits

    # ------------------------------------------------------------------ the two roles
    def _consumer(self, roles: H.WarpSpecializeOp, once_bars: list[str], position: set[str],
                  prefix: list[K.Op]) -> list[K.Op]:
        body = list(self._restage(roles.consumer, position))
        parity = BinOp("%", Var(ITER), Const(2))
        for full in once_bars:
            buffer = full[len("full_"):]
            waits = [i for i, op in enumerate(body) if isinstance(op, H.MbarrierWaitOp) and op.bar == full]
            if len(waits) != 1 or body[waits[0]].phase != Const(0):
                raise Declined(f"the consumers wait on {full} other than once at phase 0")
            body[waits[0]] = dataclasses.replace(body[waits[0]], phase=parity)
            touched = self._aliases(prefix, buffer)
            last = max((i for i, op in enumerate(body)
                        if any(touched & (effects(x)[1] | effects(x)[2]) for x in K.walk(op))), default=waits[0])
            loc = body[waits[0]].loc
            release = [H.WgmmaWaitOp(pending=0, loc=loc),
                       H.MbarrierArriveOp(bar=f"empty_{buffer}", stage=Const(0), loc=loc)]
            body[last + 1:last + 1] = release
        return body

    def _producer(self, producer: tuple[K.Op, ...], once_bars: list[str], position: set[str]) -> list[K.Op]:
        body = list(self._restage(producer, position))
        parity = BinOp("-", Const(1), BinOp("%", Var(ITER), Const(2)))
        out: list[K.Op] = []
        for op in body:
            if isinstance(op, H.MbarrierArriveExpectTxOp) and op.bar in once_bars:
                out.append(H.MbarrierWaitOp(bar="empty_" + op.bar[len("full_"):], stage=Const(0), phase=parity,
                                            loc=op.loc))
            out.append(op)
        return out


def make_persistent(kernel: H.Sm90KernelOp, smem_limit: int) -> tuple[H.Sm90KernelOp, list[str]]:
    """`kernel` looping over its tiles, or unchanged with the reason in the notes."""
    try:
        return Persistent(kernel, smem_limit).run()
    except Declined as why:
        return kernel, [f"persistent: kept one tile per CTA: {why}"]
