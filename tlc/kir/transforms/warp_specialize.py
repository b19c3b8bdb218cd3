"""`warp-specialize` (sm_90a): TMA box loads, an mbarrier ring per loaded tile, warp-group roles.

Runs after `infer-layouts` and before `insert-sync`, on the cp.async copies `lower-tile-ops` emitted.
When every global→shared copy can be a TMA load of a GMMA 128-byte-swizzled tile, the kernel becomes

    TMA descriptors (one per global tensor), mbarriers `full_<tile>` (and `empty_<tile>` for a tile
    loaded in a loop: one per ring stage); thread 0 initialises them; __syncthreads
    consumers (warp groups 0..C-1, setmaxnreg.inc): the program without its copies; before the first
        read of a tile: wait full[stage] (phase); after the read retires (the wgmma's wait, or the
        copy): arrive on empty[stage], one thread per warp group for wgmma reads
    producer (warp group C, setmaxnreg.dec), one thread: the copies' loops, each copy as wait
        empty[stage] (parity phase ^ 1), arrive_expect_tx(full[stage], bytes), one TMA box per 64
        columns (128 bytes: the swizzle span)

With `tma_store` (`Param TmaStore = true`; off by default: 1-2 % slower at S = 1k) the epilogue's
staged tile is stored by thread 0 with TMA boxes instead of the consumers' predicated copy.

A tile loaded in a loop gets `stages` ring slots (its shared layout a stage mode); one loaded once
gets one barrier. The consumers keep thread indices 0.. (the producer is the last warp group), so
every thread slice and the epilogue's copies are unchanged; the CTA grows by one warp group. TMA
zero-fills rows past a tensor's end, so the edge tiles need no predicates. A program this does not
cover keeps the cp.async schedule (`insert-sync`, `pipeline`) and the schedule notes say why.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from tlc.kir import ops as K
from tlc.kir import ops_sm90 as H
from tlc.kir.effects import Effect
from tlc.kir.expr import BinOp, Const, Expr, Index, Var, free_names
from tlc.kir.transforms.base import Facts, Notes, Transform
from tlc.kir.transforms.pipeline import Pipeliner
from tlc.kir.transforms.schedule import Schedule

WARP_GROUP = H.WARP_GROUP
PRODUCER_REGS = 24     # the producer only issues TMA: FlashAttention-3's count
MAX_CONSUMER_REGS = 240
SWIZZLE = 128          # bytes: one TMA box row, the GMMA atom's row

# Ops every role needs (names, layouts, views, thread slices): they stay ahead of the roles.
_DECLS = (K.LetOp, K.SmemLayoutOp, K.SmemTransposeLayoutOp, H.GmmaSmemLayoutOp, K.SharedBufferOp, K.SharedViewOp,
          K.GlobalTensorOp, K.GlobalTileOp, K.TiledCopyOp, K.TiledMmaOp, K.PartitionOp, K.IdentityTileOp,
          K.FragmentOp, H.WgmmaTiledMmaOp, H.WgmmaFragmentOp)
_WGMMA_ISSUE = (H.WgmmaFenceOperandOp, H.WgmmaArriveOp)


class Declined(Exception):
    """The kernel keeps its cp.async schedule; the message says why."""


@dataclass(frozen=True)
class Load:
    """One TL `Copy … from global to shared`, as lower-tile-ops emitted it (cp.async group + commit)."""

    buffer: str
    tensor: K.GlobalTensorOp
    rows: int
    cols: int
    row: Expr           # the tile's row index (in tiles)
    col: Expr           # the tile's column index (in tiles)
    batch: Expr
    head: Expr
    loc: object
    row_shift: Expr | None = None   # the tiling starts this many rows before the tensor (rows counted from the end)

    @property
    def name(self) -> str:
        return self.tensor.ptr.name[2:-4]          # p.K_ptr → K

    @property
    def row0(self) -> Expr:
        """The tile's first row in the tensor (negative for a partial first tile: TMA zero-fills and clips it)."""
        row0 = BinOp("*", self.row, Const(self.rows))
        return row0 if self.row_shift is None else BinOp("-", row0, self.row_shift)


def _copies(op: K.Op) -> list[K.AsyncCopyOp]:
    if isinstance(op, K.AsyncCopyOp):
        return [op]
    if isinstance(op, K.IfOp) and op.body and all(isinstance(c, K.AsyncCopyOp) for c in op.body):
        return list(op.body)
    return []


def _has_copy(op: K.Op) -> bool:
    return any(isinstance(x, K.AsyncCopyOp) for x in K.walk(op))


def _terms(e: Expr) -> list[Expr]:
    if isinstance(e, BinOp) and e.op == "+":
        return _terms(e.lhs) + _terms(e.rhs)
    return [e]


def _coefficient(term: Expr, stride: str) -> Expr | None:
    if isinstance(term, BinOp) and term.op == "*":
        if isinstance(term.rhs, Var) and term.rhs.name == stride:
            return term.lhs
        if isinstance(term.lhs, Var) and term.lhs.name == stride:
            return term.rhs
    return None


class WarpSpecializer:
    def __init__(self, program: K.ProgramOp, stages: int, smem_limit: int, tma_store: bool = False) -> None:
        self.program, self.stages, self.limit, self.tma_store = program, stages, smem_limit, tma_store
        self.kernel: H.Sm90KernelOp = program.kernels()[0]
        self.defs = {name: op for op in K.walk(self.kernel) for name in op.defined_names()}

    # ------------------------------------------------------------------ reading the copies
    def _global_tile(self, e: Expr, where: str) -> Load:
        """The tile `e` (`tXgX[_, _, _, row, col]`, a thread's partition of a global tile) names: its
        tensor, size, tile coordinates and the batch and head coordinates of the tensor's offset."""
        if not (isinstance(e, Index) and len(e.indices) == 5):
            raise Declined(f"{where}: `{e}` is not a tile of a global tensor")
        part = self.defs.get(e.base.name)
        tile = self.defs.get(part.src.name) if isinstance(part, K.PartitionOp) and isinstance(part.src, Var) else None
        tensor = self.defs.get(tile.src) if isinstance(tile, K.GlobalTileOp) else None
        if not isinstance(tensor, K.GlobalTensorOp):
            raise Declined(f"{where}: `{e}` is not a tile of a global tensor")
        field = tensor.ptr.name if isinstance(tensor.ptr, Var) else ""
        if not (field.startswith("p.") and field.endswith("_ptr")):
            raise Declined(f"{where}: global tensor {tensor.name} is not a kernel argument")
        if not (isinstance(tensor.rows, Const) or (isinstance(tensor.rows, Var) and tensor.rows.name.startswith("p."))):
            # TMA zero-fills past the tensor's own rows: they must be the rows the kernel bounds its tiles by
            raise Declined(f"{where}: {tensor.name} has `{tensor.rows}` rows, not a launch input or a constant")
        base = field[:-4]
        terms = _terms(tensor.offset)
        batch = [c for t in terms if (c := _coefficient(t, f"{base}_batch_stride")) is not None]
        head = [c for t in terms if (c := _coefficient(t, f"{base}_head_stride")) is not None]
        if len(terms) != 2 or len(batch) != 1 or len(head) != 1:
            raise Declined(f"{where}: the offset of {tensor.name} (`{tensor.offset}`) is not batch and head strides")
        rows, cols = tile.tile
        span = SWIZZLE // H.ELEMENT_BYTES[tensor.dtype]
        if cols % span or rows > 256:
            raise Declined(f"{where}: a {rows}×{cols} tile is not whole TMA boxes of at most 256×{span}")
        return Load("", tensor, rows, cols, e.indices[3], e.indices[4], batch[0], head[0], None, tile.row_shift)

    def _load(self, group: list[K.AsyncCopyOp]) -> Load:
        first = group[0]
        where = f"the copy into {first.buffer}"
        if len({c.buffer for c in group}) != 1 or len({str(c.src) for c in group}) != 1:
            raise Declined(f"{where}: one group writes several tiles")
        if any(c.gather for c in group):
            raise Declined(f"{where}: its rows are gathered through a row map (a TMA box cannot gather rows)")
        tile = self._global_tile(first.src, where)
        buf = self.defs.get(first.buffer)
        layout = self.defs.get(buf.layout) if isinstance(buf, K.SharedBufferOp) else None
        if not (isinstance(layout, H.GmmaSmemLayoutOp) and layout.k_major and layout.swizzle == SWIZZLE
                and tuple(layout.shape[:2]) == (tile.rows, tile.cols)):
            raise Declined(f"{where}: its shared layout is not a {tile.rows}×{tile.cols} GMMA K-major 128-byte tile")
        return dataclasses.replace(tile, buffer=first.buffer, loc=first.loc)

    def _groups(self, body: tuple[K.Op, ...]) -> tuple[list[tuple[int, int, Load]], list[int]]:
        """(start, end, load) of each copy group at the top of `body`, and the other ops' indices."""
        loads, others, i = [], [], 0
        while i < len(body):
            group, j = [], i
            while j < len(body) and _copies(body[j]):
                group += _copies(body[j])
                j += 1
            if group:
                if j == len(body) or not isinstance(body[j], K.CommitOp):
                    raise Declined(f"the copy into {group[0].buffer} is not one committed group")
                loads.append((i, j + 1, self._load(group)))
                i = j + 1
                continue
            others.append(i)
            i += 1
        return loads, others

    # ------------------------------------------------------------------ the plan
    def run(self) -> tuple[K.ProgramOp, list[str]]:
        kernel = self.kernel
        body = kernel.body
        split = next((i for i, op in enumerate(body) if not isinstance(op, _DECLS)), len(body))
        decls, rest = list(body[:split]), body[split:]
        if any(_has_copy(op) for op in decls):
            raise Declined("a copy sits among the declarations")
        if kernel.threads % WARP_GROUP:
            raise Declined(f"{kernel.threads} threads are not whole warp groups")
        once, loops = self._plan(rest)
        if not once and not loops:
            raise Declined("the kernel copies nothing from global memory")
        self._check_producer_names(decls, once, loops)
        consumers = kernel.threads // WARP_GROUP
        ring = sorted({ld.buffer for _, loads in loops for ld in loads})
        stages, notes = self._stage(ring)
        prefix = self.kernel.body[:split]          # the declarations, after _stage grew the ring's layouts
        rank = self._pipeliner.ranks(ring) if ring and stages > 1 else {}
        descriptors = self._descriptors(once + [ld for _, loads in loops for ld in loads])
        arrive_per_group = {b: self._wgmma_only(b, loops) for b in ring}
        bars, inits, end = self._barriers(once, ring, stages, consumers, arrive_per_group)
        consumer = self._consumer(rest, once, loops, stages, rank, arrive_per_group)
        producer = self._producer(rest, once, loops, stages, descriptors, consumers)
        self._notes: list[str] = []
        self._relayout: dict[str, K.Op] = {}
        if self.tma_store:
            consumer = self._stores(consumer, descriptors)
        prefix = tuple(self._relayout.get(getattr(op, "name", None), op) for op in prefix)
        pool = H.entry_registers(kernel.threads + WARP_GROUP) * (kernel.threads + WARP_GROUP)
        regs = min(MAX_CONSUMER_REGS, (pool - PRODUCER_REGS * WARP_GROUP) // (WARP_GROUP * consumers) // 8 * 8)
        roles = H.WarpSpecializeOp(group="warp_group", producer_regs=PRODUCER_REGS, consumer_regs=regs,
                                   producer=tuple(producer), consumer=tuple(consumer), producer_last=True,
                                   loc=kernel.loc)
        new_kernel = dataclasses.replace(
            self.kernel, threads=kernel.threads + WARP_GROUP, smem_bytes=end,
            body=(*_live(prefix, consumer), *descriptors.values(), *bars,
                  K.IfOp(cond=BinOp("==", Var("threadIdx.x"), Const(0)), body=tuple(inits), loc=kernel.loc),
                  K.BarrierOp(loc=kernel.loc), roles))
        params = [op for op in self.program.body if isinstance(op, K.ParamsOp) and op.name == kernel.params][0]
        tma_params = H.TmaParamsOp(name=params.name, fields=params.fields,
                                   descriptors=tuple(descriptors), loc=params.loc)
        program = dataclasses.replace(self.program, body=tuple(
            tma_params if op is params else new_kernel if op is kernel else op for op in self.program.body))
        program.verify()
        loaded = ", ".join([f"{ld.buffer} once" for ld in once] + [f"{b} ({stages} stage(s))" for b in ring])
        stored = f"; thread 0 stores {', '.join(self._relayout_buffers())} with TMA" if self._relayout else ""
        notes.append(f"warp-specialize: warp group {consumers} loads {loaded} with TMA (one thread); warp groups "
                     f"0..{consumers - 1} compute; setmaxnreg {PRODUCER_REGS}/{regs}{stored}")
        return program, notes + self._notes

    def _relayout_buffers(self) -> list[str]:
        return [op.name for op in self.kernel.body if isinstance(op, K.SharedBufferOp) and op.layout in self._relayout]

    def _plan(self, rest: tuple[K.Op, ...]) -> tuple[list[Load], list[tuple[K.ForOp, list[Load]]]]:
        loads, others = self._groups(rest)
        once = [ld for _, _, ld in loads]
        self._once_at = {start: ld for start, _, ld in loads}
        loops = []
        for i in others:
            op = rest[i]
            if isinstance(op, K.ForOp) and not op.unroll and _has_copy(op):
                inner, inner_others = self._groups(op.body)
                if any(_has_copy(op.body[j]) for j in inner_others):
                    raise Declined(f"loop {op.var} copies from global under a condition")
                if op.step != 1:
                    raise Declined(f"loop {op.var} steps by {op.step}")
                loops.append((op, [ld for _, _, ld in inner]))
            elif _has_copy(op):
                raise Declined("a copy from global sits under a condition or in a nested loop")
        buffers = [ld.buffer for ld in once] + [ld.buffer for _, lds in loops for ld in lds]
        if len(set(buffers)) != len(buffers):
            raise Declined("a shared tile is loaded by more than one copy")
        for op in K.walk(self.kernel):
            if written := set(buffers) & op.effects().shared_writes:
                raise Declined(f"registers also write a tile the copies load ({', '.join(sorted(written))})")
        for loop, lds in loops:
            inside = {id(x) for x in K.walk(loop)}
            for ld in lds:
                if any(ld.buffer in x.effects().shared_reads for x in K.walk(self.kernel) if id(x) not in inside):
                    raise Declined(f"{ld.buffer} is loaded in loop {loop.var} and read after it")
        return once, loops

    def _check_producer_names(self, decls: list[K.Op], once: list[Load], loops) -> None:
        """The producer runs the copies' loops alone: their bounds and coordinates may only use
        names every thread has (the declarations), parameters and built-ins."""
        known = {name for op in decls for name in op.defined_names()}
        for loop, loads in [(None, once)] + [(lp, lds) for lp, lds in loops]:
            exprs = [e for ld in loads for e in (ld.row0, ld.col, ld.batch, ld.head)]
            if loop is not None:
                exprs += [loop.start, loop.stop]
            for e in exprs:
                for name in free_names(e):
                    if "." not in name and name not in known and (loop is None or name != loop.var):
                        raise Declined(f"the copies' coordinates or loop bounds use `{name}`, which only the "
                                       "computing threads define")

    def _stage(self, ring: list[str]) -> tuple[int, list[str]]:
        """Grow the ring's tiles a stage mode (fewer stages where shared memory is short)."""
        self._pipeliner = Pipeliner(self.kernel, self.stages, self.limit)
        if not ring or self.stages < 2:
            return max(self.stages, 1), []
        grown = self._pipeliner.grow(ring)
        from tlc.lowering.tile_ops import smem_extent
        need = smem_extent(grown)
        if need + 64 > self.limit:
            return 1, [f"warp-specialize: one stage; {self.stages} stages of {', '.join(ring)} would need {need} > "
                       f"{self.limit} bytes of shared memory"]
        self._pipeliner.apply_growth(grown)
        self.kernel = self._pipeliner.kernel
        self.defs = {name: op for op in K.walk(self.kernel) for name in op.defined_names()}
        return self.stages, []

    def _stores(self, consumer: list[K.Op], descriptors: dict[str, H.TmaDescriptorOp]) -> list[K.Op]:
        """The epilogue's shared→global copies of a staged tile as TMA stores by one thread (after the
        writers' proxy fence and barrier, which insert-sync places); the staging tile takes the GMMA
        K-major 128-byte layout the boxes read. A copy this does not cover stays as it is."""
        out: list[K.Op] = []
        for op in consumer:
            try:
                ld = self._store_of(op)
            except Declined as why:
                self._notes.append(f"warp-specialize: the epilogue keeps its copy: {why}")
                out.append(op)
                continue
            if ld is None:
                out.append(op)
                continue
            desc = self._descriptor(ld, descriptors)
            span = desc.box[-1]
            row0 = ld.row0
            stores = [H.TmaStoreOp(desc=desc.name, src=ld.buffer, src_coord=(0, j * span), loc=op.loc,
                                   coord=(ld.batch, ld.head, row0,
                                          BinOp("+", BinOp("*", ld.col, Const(ld.cols)), Const(j * span))))
                      for j in range(ld.cols // span)]
            by_tma = K.IfOp(cond=BinOp("==", Var("threadIdx.x"), Const(0)), loc=op.loc,
                            body=(*stores, H.TmaStoreWaitOp(loc=op.loc)))
            if ld.row_shift is None:
                out.append(by_tma)
            else:
                # A box that starts before row 0 is an illegal TMA store (the H200 stops the kernel with
                # an illegal instruction; loads zero-fill): the partial first tile of rows counted from
                # the end keeps the threads' predicated copy. The TMA branch comes first, so insert-sync
                # puts the writers' proxy fence and barrier ahead of both.
                out += [K.IfOp(cond=BinOp(">=", row0, Const(0)), body=(by_tma,), loc=op.loc),
                        K.IfOp(cond=BinOp("<", row0, Const(0)), body=(op,), loc=op.loc)]
                self._notes.append("warp-specialize: the TMA store's first tile of rows counted from the end "
                                   "starts before row 0; that tile keeps the threads' predicated copy")
            buf = self.defs[ld.buffer]
            self._relayout[buf.layout] = H.GmmaSmemLayoutOp(name=buf.layout, dtype=buf.dtype, swizzle=SWIZZLE,
                                                            shape=(ld.rows, ld.cols), k_major=True, loc=buf.loc)
        return out

    def _store_of(self, op: K.Op) -> Load | None:
        """The staged tile a shared→global CopyOp stores (None for other ops)."""
        if not (isinstance(op, K.CopyOp) and len(op.reads) == 1 and not op.writes and isinstance(op.src, Var)):
            return None
        buffer = op.reads[0]
        part = self.defs.get(op.src.name)
        if not (isinstance(part, K.PartitionOp) and isinstance(part.src, Var) and part.src.name == buffer):
            return None
        tile = self._global_tile(op.dst, f"the store of {buffer}")
        buf = self.defs.get(buffer)
        layout = self.defs.get(buf.layout) if isinstance(buf, K.SharedBufferOp) else None
        if buf.offset_bytes % 1024 or getattr(layout, "shape", None) != (tile.rows, tile.cols):
            raise Declined(f"the store of {buffer}: its tile is not {tile.rows}×{tile.cols} at a 1024-byte boundary")
        return dataclasses.replace(tile, buffer=buffer, loc=op.loc)

    def _descriptor(self, ld: Load, out: dict[str, H.TmaDescriptorOp]) -> H.TmaDescriptorOp:
        span = SWIZZLE // H.ELEMENT_BYTES[ld.tensor.dtype]
        desc = H.TmaDescriptorOp(name=f"tma_{ld.name}", ptr=ld.tensor.ptr, dtype=ld.tensor.dtype,
                                 box=(1, 1, ld.rows, span), swizzle=SWIZZLE, loc=ld.loc)
        seen = out.setdefault(desc.name, desc)
        if seen.box != desc.box:
            raise Declined(f"tensor {ld.name} is copied in tiles of two sizes")
        return seen

    def _descriptors(self, loads: list[Load]) -> dict[str, H.TmaDescriptorOp]:
        out: dict[str, H.TmaDescriptorOp] = {}
        for ld in loads:
            self._descriptor(ld, out)
        return out

    def _wgmma_only(self, buffer: str, loops) -> bool:
        """Whether every read of `buffer` is a wgmma (then one thread per warp group releases it)."""
        readers = [op.effects() for lp, _ in loops for op in K.walk(lp) if buffer in op.effects().shared_reads]
        return all(Effect.WGMMA in e.kinds for e in readers)

    def _barriers(self, once: list[Load], ring: list[str], stages: int, consumers: int,
                  per_group: dict[str, bool]) -> tuple[list[K.Op], list[K.Op], int]:
        from tlc.lowering.tile_ops import smem_extent
        offset = -(-smem_extent(list(self.kernel.body)) // 8) * 8
        bars, inits = [], []
        for name, count, arrivals in ([(f"full_{ld.buffer}", 1, 1) for ld in once]
                                      + [(f"{kind}_{b}", stages, 1 if kind == "full" else
                                          consumers * (1 if per_group[b] else WARP_GROUP))
                                         for b in ring for kind in ("full", "empty")]):
            bars.append(H.MbarrierOp(name=name, count=count, offset_bytes=offset))
            inits.append(H.MbarrierInitOp(bar=name, arrivals=arrivals))
            offset += 8 * count
        return bars, inits, offset

    # ------------------------------------------------------------------ the two roles
    def _consumer(self, rest, once, loops, stages, rank, per_group) -> list[K.Op]:
        loaded = {ld.buffer for ld in once}
        loop_of = {id(lp): lds for lp, lds in loops}
        out: list[K.Op] = []
        for op in rest:
            if _copies(op) or isinstance(op, K.CommitOp):
                continue                                   # the producer's now
            for b in sorted(loaded):
                if b in K.nested_effects(op).shared_reads:
                    out.append(H.MbarrierWaitOp(bar=f"full_{b}", stage=Const(0), phase=Const(0), loc=op.loc))
                    loaded.discard(b)
            if isinstance(op, K.ForOp) and id(op) in loop_of:
                out.append(self._consumer_loop(op, loop_of[id(op)], stages, rank, per_group))
            else:
                out.append(op)
        return out

    def _consumer_loop(self, loop: K.ForOp, loads: list[Load], stages: int, rank, per_group) -> K.ForOp:
        stage, phase = Var(f"{loop.var}_stage"), Var(f"{loop.var}_phase")
        body = [op for op in loop.body if not (_copies(op) or isinstance(op, K.CommitOp))]
        body = [self._pipeliner.restage(op, rank, stage) if rank else op for op in body]
        for ld in loads:
            b = ld.buffer
            readers = [i for i, op in enumerate(body) if b in K.nested_effects(op).shared_reads]
            if not readers:
                raise Declined(f"loop {loop.var} loads {b} but nothing in it reads {b}")
            first, last = readers[0], readers[-1]
            release = last + 1
            if isinstance(body[last], H.WgmmaOp):
                waits = [i for i in range(last + 1, len(body)) if isinstance(body[i], H.WgmmaWaitOp)]
                if not waits or body[waits[0]].pending != 0:
                    raise Declined(f"the last wgmma reading {b} is not retired by a wait<0> in loop {loop.var}")
                release = waits[0] + 1
            arrive: K.Op = H.MbarrierArriveOp(bar=f"empty_{b}", stage=stage, loc=ld.loc)
            if per_group[b]:
                arrive = K.IfOp(cond=BinOp("==", BinOp("%", Var("threadIdx.x"), Const(WARP_GROUP)), Const(0)),
                                body=(arrive,), loc=ld.loc)
            body.insert(release, arrive)
            while first and isinstance(body[first - 1], _WGMMA_ISSUE):
                first -= 1                                  # before the wgmma's operand fences
            body.insert(first, H.MbarrierWaitOp(bar=f"full_{b}", stage=stage, phase=phase, loc=ld.loc))
        return dataclasses.replace(loop, body=(*self._position(loop, stages), *body), stages=stages, prefetch=False)

    @staticmethod
    def _position(loop: K.ForOp, stages: int) -> tuple[K.LetOp, K.LetOp]:
        """stage = trip mod stages; phase = parity of how often the ring has come round."""
        trip = BinOp("-", Var(loop.var), loop.start)
        return (K.LetOp(name=f"{loop.var}_stage", type="i32", value=BinOp("%", trip, Const(stages)), loc=loop.loc),
                K.LetOp(name=f"{loop.var}_phase", type="i32",
                        value=BinOp("%", BinOp("/", trip, Const(stages)), Const(2)), loc=loop.loc))

    def _tma(self, ld: Load, stage: Expr, descriptors) -> list[K.Op]:
        desc = descriptors[f"tma_{ld.name}"]
        span = desc.box[-1]
        nbytes = ld.rows * ld.cols * H.ELEMENT_BYTES[ld.tensor.dtype]
        out: list[K.Op] = [H.MbarrierArriveExpectTxOp(bar=f"full_{ld.buffer}", stage=stage, bytes=nbytes, loc=ld.loc)]
        row0 = ld.row0
        for j in range(ld.cols // span):
            col0 = BinOp("+", BinOp("*", ld.col, Const(ld.cols)), Const(j * span))
            out.append(H.TmaLoadOp(desc=desc.name, bar=f"full_{ld.buffer}", stage=stage, dst=ld.buffer,
                                   coord=(ld.batch, ld.head, row0, col0), dst_coord=(0, j * span), loc=ld.loc))
        return out

    def _producer(self, rest, once, loops, stages, descriptors, consumers) -> list[K.Op]:
        loop_of = {id(lp): lds for lp, lds in loops}
        body: list[K.Op] = []
        for i, op in enumerate(rest):
            if i in self._once_at:
                body += self._tma(self._once_at[i], Const(0), descriptors)
            elif isinstance(op, K.ForOp) and id(op) in loop_of:
                stage, phase = Var(f"{op.var}_stage"), Var(f"{op.var}_phase")
                inner: list[K.Op] = list(self._position(op, stages))
                for ld in loop_of[id(op)]:
                    inner.append(H.MbarrierWaitOp(bar=f"empty_{ld.buffer}", stage=stage,
                                                  phase=BinOp("-", Const(1), phase), loc=ld.loc))
                    inner += self._tma(ld, stage, descriptors)
                body.append(dataclasses.replace(op, body=tuple(inner), stages=stages, prefetch=False))
        first = BinOp("==", Var("threadIdx.x"), Const(consumers * WARP_GROUP))
        return [K.IfOp(cond=first, body=tuple(body), loc=self.kernel.loc)]


# Declarations the copies alone used (the cp.async tiled copy, its partitions and global tiles) die with them.
_DEAD_IF_UNUSED = (K.TiledCopyOp, K.PartitionOp, K.GlobalTileOp, K.IdentityTileOp, K.GlobalTensorOp)


def is_ring_loop(op: K.Op) -> bool:
    """A producer loop that arms a TMA ring's barriers: the K/V trips (what the once-loads precede)."""
    return isinstance(op, K.ForOp) and any(isinstance(x, H.MbarrierArriveExpectTxOp) for x in K.walk(op))


def _live(decls, users) -> list[K.Op]:
    """`decls` less the copy-only declarations nothing else reads."""
    decls = list(decls)
    while True:
        used = {n for op in [*decls, *users] for x in K.walk(op) for n in x.used_names()}
        keep = [op for op in decls if not isinstance(op, _DEAD_IF_UNUSED) or set(op.defined_names()) & used]
        if len(keep) == len(decls):
            return keep
        decls = keep


def warp_specialize(program: K.ProgramOp, stages: int, smem_limit: int,
                    tma_store: bool = False) -> tuple[K.ProgramOp, list[str]]:
    """The program with its kernel warp-specialised, or unchanged with the reason in the notes."""
    kernels = program.kernels()
    if len(kernels) != 1 or not isinstance(kernels[0], H.Sm90KernelOp):
        return program, []
    try:
        return WarpSpecializer(program, stages, smem_limit, tma_store).run()
    except Declined as why:
        return program, [f"warp-specialize: kept the cp.async schedule: {why}"]


@dataclass(frozen=True)
class WarpSpecializeTransform(Transform):
    """Where the target family's copies may become TMA boxes (rules.FAMILIES) and `Param WarpSpecialize`
    is not false: TMA loads into an mbarrier ring of `stages` (this option, else the schedule's), a
    producer warp group and consumer warp groups; `Param TmaStore = true` also stores the epilogue's tile
    with TMA (a fifth less NVRTC time, 1-2 % slower on short sequences on an H200: off by default,
    docs/hopper.md). Other targets and programs it does not cover keep the cp.async schedule."""

    name: ClassVar[str] = "warp-specialize"
    stages: int = 0

    def apply(self, program: K.ProgramOp, schedule: Schedule, facts: Facts) -> tuple[K.ProgramOp, Notes]:
        from tlc.lowering.rules import FAMILIES

        family = FAMILIES.get(facts.arch.mma_path)
        if not schedule.warp_specialize or family is None or not family.tma_copies:
            return program, []
        return warp_specialize(program, self.stages or schedule.stages, facts.arch.smem_per_block,
                               tma_store=schedule.tma_store)
