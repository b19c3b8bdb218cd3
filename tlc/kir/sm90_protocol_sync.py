"""What `tlc.kir.sm90_protocol` executes against: vector clocks, mbarriers, named barriers, the history of shared
accesses that finds an access no barrier orders after an earlier one, and one handler per synchronising op. A TMA
load's bytes are known to have landed only by waiting on the phase it completes (its own pseudo-agent's clock).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable

from tlc.diagnostics import Loc, Note
from tlc.kir import ops as K
from tlc.kir import ops_sm90 as H
from tlc.kir.expr import Expr, Index, Var, free_names

# Ops with no synchronising or shared-memory effect: declarations and register math.
INERT = (K.ParamsOp, K.TiledMmaOp, K.SmemLayoutOp, K.SmemTransposeLayoutOp, K.SharedBufferOp, K.SharedViewOp,
          K.GlobalTensorOp, K.GlobalTileOp, K.IdentityTileOp, K.TiledCopyOp, K.PartitionOp, K.FragmentOp,
          K.RowVectorOp, K.ClearOp, K.MmaOp, K.MaskOp, K.RowReduceOp, K.AllReduceOp, K.Exp2ScaleOp,
          K.RowBroadcastOp, K.MapOp, K.ConvertOp, K.RetileAccToAOp, K.RowStoreOp, K.FragStoreOp, K.FragLoadOp, K.RowLoadOp, K.TimestampOp,
          K.TraceBufferOp, H.TmaDescriptorOp, H.GmmaSmemLayoutOp, H.MbarrierOp, H.TmaPrefetchOp,
          H.TmaPrefetchTileOp, H.WgmmaTiledMmaOp, H.WgmmaFragmentOp, H.WgmmaFenceOperandOp, H.WgmmaArriveOp,
          H.CarryOp, H.TileSlotOp)
# Ops that only define names or hold others: a region of these and inert ops does nothing the protocol sees.
SILENT = (*INERT, K.IfOp, K.ForOp, K.LetOp, K.WarpAnyOp)
# Ops a part of an agent's threads may run inside a branch without splitting it off: nothing here blocks.
INLINE = (*INERT, K.IfOp, K.LetOp, H.MbarrierInitOp, H.MbarrierArriveOp, H.MbarrierArriveExpectTxOp, H.TmaLoadOp,
           H.TmaStoreOp, H.TmaStoreWaitOp, H.FenceProxyAsyncOp, H.TileSlotStoreOp)

Clock = dict[int, int]
Report = Callable[[str, "Loc | None"], None]


@dataclass(frozen=True)
class ProtocolProblem:
    """One thing the checker found or could not prove, at the op involved; `notes` point at the others."""

    message: str
    loc: Loc | None
    notes: tuple[Note, ...] = ()

    def __str__(self) -> str:
        return f"{self.loc}: {self.message}" if self.loc else self.message


def join(into: Clock, other: Clock) -> None:
    """`into` becomes the pointwise maximum of both clocks."""
    for agent, time in other.items():
        if into.get(agent, 0) < time:
            into[agent] = time


@dataclass(frozen=True)
class Epoch:
    """One event: the `time`-th event of `agent`."""

    agent: int
    time: int

    def before(self, clock: Clock) -> bool:
        """Whether an agent whose clock is `clock` has seen this event (it happened before)."""
        return clock.get(self.agent, 0) >= self.time


# ----------------------------------------------------------------------------- mbarriers
@dataclass
class Mbarrier:
    """One mbarrier of an `MbarrierOp` array. A phase completes when `count` arrivals have come and the
    transaction bytes announced by arrive_expect_tx have landed; `phase` counts completed phases, so a
    wait for parity P passes while `phase % 2 != P` (a fresh barrier counts its phase "1" as complete)."""

    name: str
    count: int = 0                 # 0: not initialised
    init: Epoch | None = None
    pending: int = 0
    tx: int = 0
    phase: int = 0
    arrived: dict[int, Loc | None] = field(default_factory=dict)   # agent → where it arrived this phase
    clock: Clock = field(default_factory=dict)                     # what this phase's arrivals saw
    done: Clock = field(default_factory=dict)                      # what the last completed phase carried
    waited: bool = False

    def initialise(self, count: int, epoch: Epoch, clock: Clock, report: Report, loc: Loc | None) -> None:
        if self.count and (self.phase or self.arrived or self.waited):
            report(f"{self.name} is initialised again after it was used", loc)
        self.count, self.pending, self.tx, self.phase, self.init = count, count, 0, 0, epoch
        self.arrived, self.clock, self.done = {}, {}, dict(clock)

    def usable(self, clock: Clock, who: str, report: Report, loc: Loc | None) -> bool:
        if not self.count:
            report(f"{who} uses {self.name}, which no MbarrierInitOp initialised", loc)
            return False
        if self.init is not None and not self.init.before(clock):
            report(f"{who} uses {self.name} before its initialisation is visible to it (no barrier between "
                   f"the MbarrierInitOp and this use)", loc)
        return True

    def arrive(self, agent: int, who: str, arrivals: int, tx: int, clock: Clock, report: Report,
               loc: Loc | None) -> None:
        if agent in self.arrived:
            report(f"{who} arrives twice on {self.name} in one phase (phase {self.phase}; first at "
                   f"{self.arrived[agent]}): the second arrival counts toward a phase it does not belong to", loc)
        if arrivals > self.pending:
            report(f"{who} brings {arrivals} arrival(s) to {self.name}, whose phase {self.phase} expects "
                   f"{self.pending} more of {self.count}: more arrivals than its count", loc)
        self.arrived[agent] = loc
        self.pending -= arrivals
        self.tx += tx
        join(self.clock, clock)
        self._complete(report, loc)

    def complete_tx(self, nbytes: int, clock: Clock, report: Report, loc: Loc | None) -> None:
        self.tx -= nbytes
        join(self.clock, clock)
        self._complete(report, loc)

    def _complete(self, report: Report, loc: Loc | None) -> None:
        if self.pending > 0:
            return
        if self.tx < 0:
            report(f"TMA loads complete {-self.tx} more byte(s) on {self.name} than arrive_expect_tx announced "
                   f"for phase {self.phase}", loc)
        if self.tx:
            return
        self.phase += 1
        self.done, self.clock = self.clock, {}
        self.pending, self.arrived = self.count, {}

    def passes(self, parity: int) -> bool:
        return self.phase % 2 != parity

    def state(self) -> str:
        bytes_left = f", {self.tx} byte(s) of TMA still expected" if self.tx else ""
        return (f"{self.name} at phase {self.phase} with {self.count - self.pending} of {self.count} "
                f"arrival(s){bytes_left}")


# ----------------------------------------------------------------------------- named barriers
@dataclass
class NamedBarrier:
    """Hardware barrier `hw` (`bar.sync` / `bar.arrive`): completes when `threads` threads have arrived,
    releasing the ones that synced; then it starts over (`generation`)."""

    hw: int
    threads: int = 0
    arrived: int = 0
    members: dict[int, Loc | None] = field(default_factory=dict)
    clock: Clock = field(default_factory=dict)
    done: dict[int, Clock] = field(default_factory=dict)      # generation → what its arrivals saw
    generation: int = 0
    counts: dict[int, Loc | None] = field(default_factory=dict)   # every thread count used on it

    def arrive(self, agent: int, who: str, threads: int, count: int, clock: Clock, report: Report,
               loc: Loc | None) -> None:
        if self.counts and count not in self.counts:
            first, where = next(iter(self.counts.items()))
            report(f"hardware barrier {self.hw} is used with {first} threads (at {where}) and with {count}", loc)
        self.counts.setdefault(count, loc)
        if self.arrived and count != self.threads:
            report(f"{who} arrives on hardware barrier {self.hw} for {count} threads while {self.arrived} "
                   f"arrived for {self.threads}", loc)
        if agent in self.members:
            report(f"{who} arrives twice on hardware barrier {self.hw} before it completes (first at "
                   f"{self.members[agent]})", loc)
        if not self.arrived:
            self.threads = count
        self.members[agent] = loc
        self.arrived += threads
        join(self.clock, clock)
        if self.arrived > self.threads:
            report(f"{self.arrived} threads arrive on hardware barrier {self.hw}, which counts {self.threads}", loc)
        if self.arrived >= self.threads:
            self.done[self.generation], self.clock = self.clock, {}
            self.generation += 1
            self.arrived, self.members = 0, {}

    def state(self) -> str:
        return f"hardware barrier {self.hw} with {self.arrived} of {self.threads} thread(s) arrived"


# ----------------------------------------------------------------------------- shared memory
@dataclass
class Access:
    """A read or write of shared bytes [lo, hi) by op `op` (its id): `end` is when it finished (None while an
    asynchronous access — a wgmma's operand read, a TMA store — is in flight); `fenced`: a generic-proxy write
    its writer followed with fence.proxy.async."""

    op: int
    write: bool
    what: str
    agent: int
    who: str
    loc: Loc | None
    async_proxy: bool
    end: Epoch | None = None
    fenced: bool = False
    span: tuple[int, int] = (0, 0)
    lanes: tuple[int, int] = (0, 0)     # the threads that made it: (first, how many); none for a TMA load
    syncs: int = 0                      # barriers across all its agent's threads the agent had passed at its start
    end_syncs: int = 0                  # … and when it ended

    def finish(self, epoch: Epoch, syncs: int) -> None:
        self.end, self.end_syncs = epoch, syncs

    def covers_group_of(self, other: Access) -> bool:
        """Whether this access was made by one whole warp group and `other` by threads of that group (a wgmma's
        wait retires the group's collective read for every thread of the group)."""
        first, count = self.lanes
        other_first, other_count = other.lanes
        return (count == H.WARP_GROUP and first % H.WARP_GROUP == 0 and first <= other_first
                and other_first + other_count <= first + count)


def access(op, agent, write: bool, what: str, async_proxy: bool, end: Epoch | None = None) -> Access:
    """An access `agent` makes with `op` (`agent`: an `sm90_protocol` agent)."""
    return Access(id(op), write, what, agent.id, agent.who, op.loc, async_proxy, end,
                  lanes=(agent.threads[0], len(agent.threads)), syncs=agent.syncs, end_syncs=agent.syncs)


@dataclass
class AsyncGroups:
    """An agent's asynchronous accesses (wgmma reads, cp.async writes): the ones not yet committed, then the
    committed groups oldest first, until a wait_group retires them."""

    open: list[Access] = field(default_factory=list)
    committed: list[list[Access]] = field(default_factory=list)

    def commit(self) -> None:
        self.committed.append(self.open)
        self.open = []

    def retire(self, pending: int) -> list[Access]:
        keep = len(self.committed) - pending
        if keep <= 0:
            return []
        done, self.committed = self.committed[:keep], self.committed[keep:]
        return [made for group in done for made in group]

    def in_flight(self) -> Access | None:
        return next(iter(self.open + [made for group in self.committed for made in group]), None)


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


class Memory:
    """The shared bytes' history: the writes not yet overwritten (cut to the bytes they still own) and the
    reads since; each new access is checked against every earlier one it overlaps."""

    def __init__(self, report: Report) -> None:
        self.writes: list[Access] = []
        self.reads: list[Access] = []
        self.report = report

    def _ordered(self, earlier: Access, access: Access, clock: Clock) -> str | None:
        """Why `earlier` is not known to be finished before `access` starts (None when it is)."""
        if earlier.end is None:
            return "still in flight"
        if earlier.op == access.op and not access.async_proxy:
            return None      # one thread-partitioned copy: each element is written and read by one thread
        if earlier.agent == access.agent and earlier.lanes[1]:   # program order, and a barrier between threads
            alone = earlier.lanes == access.lanes and earlier.lanes[1] == 1
            if access.syncs > earlier.end_syncs or alone or (earlier.async_proxy and earlier.covers_group_of(access)):
                return None
            return f"with no barrier among {access.who}'s threads between them"
        if not earlier.end.before(clock):
            return "not ordered before it by any barrier"
        return None

    def _check(self, earlier: Access, access: Access, clock: Clock) -> None:
        why = self._ordered(earlier, access, clock)
        if why:
            self.report(f"{access.who}'s {access.what} may overlap {earlier.who}'s {earlier.what} (at "
                        f"{earlier.loc}), {why}", access.loc)
        if earlier.write and not earlier.async_proxy and access.async_proxy and not earlier.fenced:
            self.report(f"{access.who}'s {access.what} goes through the async proxy after {earlier.who}'s "
                        f"{earlier.what} (at {earlier.loc}) wrote the same bytes with no fence.proxy.async "
                        f"after it", access.loc)

    def read(self, lo: int, hi: int, access: Access, clock: Clock) -> None:
        access.span = (lo, hi)
        for w in self.writes:
            if _overlap(w.span, access.span):
                self._check(w, access, clock)
        self.reads = [r for r in self.reads if r.agent != access.agent or r.end is None
                      or not (lo <= r.span[0] and r.span[1] <= hi)] + [access]

    def write(self, lo: int, hi: int, access: Access, clock: Clock) -> None:
        access.span = (lo, hi)
        for earlier in (*self.writes, *self.reads):
            if _overlap(earlier.span, access.span):
                self._check(earlier, access, clock)
        kept = []
        for w in self.writes:       # an earlier write keeps the bytes this one leaves
            if not _overlap(w.span, access.span):
                kept.append(w)
                continue
            for piece in ((w.span[0], min(w.span[1], lo)), (max(w.span[0], hi), w.span[1])):
                if piece[0] < piece[1]:
                    kept.append(dataclasses.replace(w, span=piece))
        self.writes = kept + [access]
        self.reads = [r for r in self.reads if not (lo <= r.span[0] and r.span[1] <= hi)]


# ----------------------------------------------------------------------------- the ops that touch them
# Each handler takes (machine, agent, op): `machine` is `sm90_protocol._Machine`, which gives values
# (`value`), problems (`report`, `halt`, `cannot`) and the kernel's barriers, buffers and descriptors.
WARP = 32


def shared_geometry(kernel: K.KernelOp) -> dict[str, tuple[int, int, int]]:
    """Each shared buffer's (first byte, bytes, stages); a stage is the outermost mode of its layout."""
    layouts = {op.name: op for op in K.walk(kernel)
               if isinstance(op, (K.SmemLayoutOp, K.SmemTransposeLayoutOp, H.GmmaSmemLayoutOp))}
    out = {}
    for op in K.walk(kernel):
        if isinstance(op, K.SharedBufferOp):
            shape = tuple(getattr(layouts.get(op.layout), "shape", ()))
            size = math.prod(shape) * H.ELEMENT_BYTES[op.dtype] if shape else 0
            out[op.name] = (op.offset_bytes, size, shape[2] if len(shape) == 3 else 1)
    return out


# The fields of an op the checker evaluates (the rest — TMA coordinates, a copy's predicate — it never reads).
_EVALUATED = {K.IfOp: ("cond",), K.ForOp: ("start", "stop"), K.CounterOp: ("init",), K.CounterAddOp: ("value",),
              K.CounterSetOp: ("value",), H.MbarrierWaitOp: ("stage", "phase"), H.MbarrierArriveOp: ("stage",),
              H.MbarrierArriveExpectTxOp: ("stage",), H.TmaLoadOp: ("stage",), H.NamedBarrierOp: ("id",),
              H.WgmmaOp: ("a", "b"), K.CopyOp: ("src", "dst"), K.AsyncCopyOp: ("dst",), H.TileSlotStoreOp: ("value",)}


def needed_names(kernel: K.KernelOp) -> set[str]:
    """The names the checker reads (loop bounds, branch conditions, stages, phases, barrier ids), directly or
    through the lets and counters that define them; a let outside the set (the softmax's scale) is skipped."""
    reads: set[str] = set()
    defs: dict[str, set[str]] = {}
    for op in K.walk(kernel):
        if isinstance(op, (K.IfOp, K.ForOp)) and all(isinstance(x, SILENT) for x in K.walk(op)):
            continue
        fields = next((f for cls, f in _EVALUATED.items() if isinstance(op, cls)), ())
        values = [getattr(op, f) for f in fields]
        if isinstance(op, (H.WgmmaOp, K.CopyOp, K.AsyncCopyOp)):      # only a ring stage is read from an operand
            values = [v.indices[-1] for v in values if isinstance(v, Index) and len(v.indices) >= 4]
        names = set().union(*(free_names(v) for v in values if isinstance(v, Expr)))
        if isinstance(op, (K.LetOp, K.CounterOp, K.CounterAddOp, K.CounterSetOp)):
            target = op.counter if isinstance(op, (K.CounterAddOp, K.CounterSetOp)) else op.name
            defs.setdefault(target, set()).update(free_names(op.value) if isinstance(op, K.LetOp) else names)
        else:
            reads |= names
    needed, todo = set(), list(reads)
    while todo:
        name = todo.pop()
        if name not in needed:
            needed.add(name)
            todo += defs.get(name, ())
    return needed


def _buffer_of(m, name: str) -> str | None:
    """The shared buffer a name reaches through views and the partitions or fragments made from it."""
    for _ in range(16):
        if name in m.buffers:
            return name
        name = m.views.get(name) or m.sources.get(name)
        if name is None:
            return None
    return None


def _span(m, agent, buffer: str, stage: int | None, loc) -> tuple[int, int]:
    base = _buffer_of(m, buffer)
    if base is None:
        m.cannot(f"`{buffer}` is not a shared buffer the checker can place", loc)
    first, size, stages = m.buffers[base]
    if stage is None or stages == 1:
        return first, first + size
    if not (isinstance(stage, int) and 0 <= stage < stages):
        m.halt(f"{agent.who} uses stage {stage} of {base}, which has {stages}", loc)
    per = size // stages
    return first + stage * per, first + (stage + 1) * per


def _stage_in(m, agent, e: Expr | None, buffer: str, loc) -> int | None:
    """The ring stage `e` (`tXsK[_, _, _, stage]`, a view of `buffer`) selects, None for the whole buffer."""
    base = _buffer_of(m, buffer)
    if not (isinstance(e, Index) and isinstance(e.base, Var) and len(e.indices) >= 4) or base is None:
        return None
    if _buffer_of(m, e.base.name) != base or m.buffers[base][2] == 1:
        return None
    return m.value(agent, e.indices[-1], loc, f"the stage of {buffer}")


def _barrier(m, agent, name: str, stage: Expr, loc) -> tuple[Mbarrier, int]:
    bars = m.bars.get(name)
    if bars is None:
        m.cannot(f"`{name}` is not an MbarrierOp of the kernel", loc)
    i = m.value(agent, stage, loc, f"the stage of {name}")
    if not (isinstance(i, int) and 0 <= i < len(bars)):
        m.halt(f"{agent.who} uses {name}[{i}]; {name} has {len(bars)} barrier(s)", loc)
    if not bars[i].usable(agent.clock, agent.who, m.report, loc):
        m.halt(f"{agent.who} uses {name}[{i}] uninitialised", loc)
    return bars[i], i


def _init(m, agent, op: H.MbarrierInitOp) -> None:
    if op.bar not in m.bars:
        m.cannot(f"`{op.bar}` is not an MbarrierOp of the kernel", op.loc)
    for bar in m.bars[op.bar]:
        bar.initialise(op.arrivals, agent.tick(), agent.clock, m.report, op.loc)


def _arrive(m, agent, op: H.MbarrierArriveOp | H.MbarrierArriveExpectTxOp) -> None:
    bar, _ = _barrier(m, agent, op.bar, op.stage, op.loc)
    agent.tick()
    tx = op.bytes * len(agent.threads) if isinstance(op, H.MbarrierArriveExpectTxOp) else 0
    bar.arrive(agent.id, agent.who, len(agent.threads), tx, agent.clock, m.report, op.loc)


def _wait(m, agent, op: H.MbarrierWaitOp) -> None:
    bar, _ = _barrier(m, agent, op.bar, op.stage, op.loc)
    parity = m.value(agent, op.phase, op.loc, f"the parity of the wait on {op.bar}")
    if parity not in (0, 1):
        m.halt(f"{agent.who} waits on {bar.name} for parity {parity}; a phase parity is 0 or 1", op.loc)
    bar.waited = True
    if bar.passes(parity):
        join(agent.clock, bar.done)
    else:
        agent.blocked = ("mbarrier", bar, parity, op)


def _tma_load(m, agent, op: H.TmaLoadOp) -> None:
    bar, i = _barrier(m, agent, op.bar, op.stage, op.loc)
    desc = m.descs.get(op.desc)
    if desc is None:
        m.cannot(f"`{op.desc}` is not a TmaDescriptorOp of the kernel", op.loc)
    stage = i if m.buffers.get(_buffer_of(m, op.dst) or "", (0, 0, 1))[2] > 1 else None
    lo, hi = _box_span(m, _span(m, agent, op.dst, stage, op.loc), op, desc)
    pid, clock = m.pseudo_agent(op.bar, i)
    for _ in agent.threads:
        join(clock, agent.clock)
        clock[pid] = clock.get(pid, 0) + 1
        where = f" stage {stage}" if stage is not None else ""
        load = Access(id(op), True, f"TMA load into {op.dst}{where}", pid, agent.who, op.loc, True,
                      Epoch(pid, clock[pid]))
        m.memory.write(lo, hi, load, agent.clock)
        bar.complete_tx(desc.box_bytes, clock, m.report, op.loc)


def _box_span(m, stage_span: tuple[int, int], op: H.TmaLoadOp, desc: H.TmaDescriptorOp) -> tuple[int, int]:
    """The bytes one TMA box writes: in a K-major GMMA layout (8-row atoms of one swizzle span, rows first)
    the box's rows of its column strip; in another layout the whole stage."""
    layout = m.layouts.get(m.layout_of.get(_buffer_of(m, op.dst) or ""))
    if not (isinstance(layout, H.GmmaSmemLayoutOp) and layout.k_major):
        return stage_span
    width = desc.box[-1] * H.ELEMENT_BYTES[desc.dtype]
    row, col = op.dst_coord
    lo = stage_span[0] + (col // desc.box[-1] * layout.shape[0] + row) * width
    return lo, min(lo + desc.box[-2] * width, stage_span[1])


def _named(m, agent, op: H.NamedBarrierOp) -> None:
    ident = op.id if isinstance(op.id, int) else m.value(agent, op.id, op.loc, "the named barrier's id")
    if not (isinstance(ident, int) and 0 <= ident <= 7):
        m.halt(f"{agent.who} uses named barrier {ident}; user barriers are 0..7 (hardware 8..15, clear of "
               f"__syncthreads' 0 and CUTLASS's reserved 1..7)", op.loc)
    n = len(agent.threads)
    if n % WARP or len({t // WARP for t in agent.threads}) != n // WARP:
        m.cannot(f"named barrier {ident} is executed by {agent.who}, not by whole warps", op.loc)
    barrier = m.named.setdefault(ident + 8, NamedBarrier(ident + 8))
    generation = barrier.generation
    agent.tick()
    barrier.arrive(agent.id, agent.who, n, op.threads, agent.clock, m.report, op.loc)
    if op.arrive_only:
        return
    agent.learn_private()
    if barrier.generation > generation:
        agent.syncs += 1
        join(agent.clock, barrier.done[generation])
    else:
        agent.blocked = ("named", barrier, generation, op)


def _syncthreads(m, agent, op: K.BarrierOp) -> None:
    if agent.threads != m.everyone:
        m.halt(f"__syncthreads (hardware barrier 0, all {len(m.everyone)} threads) in {agent.who}, after the "
               f"warp roles split: the other roles never reach it", op.loc)
    agent.learn_private()
    agent.syncs += 1


def _wgmma(m, agent, op: H.WgmmaOp) -> None:
    n = len(agent.threads)
    if n % H.WARP_GROUP or len({t // H.WARP_GROUP for t in agent.threads}) != n // H.WARP_GROUP:
        m.cannot(f"a wgmma is issued by {agent.who}, not by whole warp groups", op.loc)
    stages: dict[str, int | None] = {}
    for operand in (op.a, op.b):
        base = operand.base if isinstance(operand, Index) else operand
        buffer = _buffer_of(m, base.name) if isinstance(base, Var) else None
        if buffer is not None:
            stages[buffer] = _stage_in(m, agent, operand, buffer, op.loc)
    for name in op.reads:
        stage = stages.get(_buffer_of(m, name) or name)
        lo, hi = _span(m, agent, name, stage, op.loc)
        where = f" stage {stage}" if stage is not None else ""
        read = access(op, agent, False, f"wgmma read of {name}{where}", True)
        m.memory.read(lo, hi, read, agent.clock)
        agent.wgmma.open.append(read)


def _commit(m, agent, op: H.WgmmaCommitOp | K.CommitOp) -> None:
    (agent.wgmma if isinstance(op, H.WgmmaCommitOp) else agent.cp).commit()


def _retire(m, agent, op: H.WgmmaWaitOp | K.WaitOp) -> None:
    """wgmma.wait_group / cp.async.wait_group: all but the newest `pending` committed groups are done."""
    groups = agent.wgmma if isinstance(op, H.WgmmaWaitOp) else agent.cp
    done = groups.retire(op.pending)
    if done:
        epoch = agent.tick()
        for made in done:
            made.finish(epoch, agent.syncs)
            if made.write:
                agent.unfenced.append(made)


def _generic(m, agent, op, write: bool, buffer: str, e: Expr | None, what: str) -> None:
    lo, hi = _span(m, agent, buffer, _stage_in(m, agent, e, buffer, op.loc), op.loc)
    made = access(op, agent, write, what, False, agent.tick())
    if write:
        m.memory.write(lo, hi, made, agent.clock)
        agent.unfenced.append(made)
    else:
        m.memory.read(lo, hi, made, agent.clock)


def _copy(m, agent, op: K.CopyOp) -> None:
    for name in op.reads:
        _generic(m, agent, op, False, name, op.src if len(op.reads) == 1 else None, f"copy from {name}")
    for name in op.writes:
        _generic(m, agent, op, True, name, op.dst if len(op.writes) == 1 else None, f"copy into {name}")


def _fence(m, agent, op: H.FenceProxyAsyncOp) -> None:
    for access in agent.unfenced:
        access.fenced = True
    agent.unfenced.clear()


def _tma_store(m, agent, op: H.TmaStoreOp) -> None:
    lo, hi = _span(m, agent, op.src, None, op.loc)
    read = access(op, agent, False, f"TMA store from {op.src}", True)
    m.memory.read(lo, hi, read, agent.clock)
    agent.tma_stores.append(read)


def _tma_store_wait(m, agent, op: H.TmaStoreWaitOp) -> None:
    epoch = agent.tick()
    for read in agent.tma_stores:
        read.finish(epoch, agent.syncs)
    agent.tma_stores.clear()


def _slot(m, agent, op: H.TileSlotStoreOp | H.TileSlotLoadOp) -> None:
    if op.slot not in m.slots:
        m.cannot(f"`{op.slot}` is not a TileSlotOp of the kernel", op.loc)
    lo, hi = m.slots[op.slot]
    write = isinstance(op, H.TileSlotStoreOp)
    made = access(op, agent, write, f"tile slot {'store' if write else 'load'}", False, agent.tick())
    if write:
        m.slot_values[op.slot] = m.value(agent, op.value, op.loc, "the tile number stored")
        m.memory.write(lo, hi, made, agent.clock)
        agent.unfenced.append(made)
    else:
        m.memory.read(lo, hi, made, agent.clock)
        m.define(agent, op.name, m.slot_values.get(op.slot, m.unknown(f"{op.slot} was never written")))


def _atomic(m, agent, op: H.AtomicAddOp) -> None:
    if not (isinstance(op.ptr, Var) and op.ptr.name == f"p.{H.TILE_COUNTER}"):
        m.cannot(f"an atomic on `{op.ptr}`, not the tile counter, is not modelled", op.loc)
    m.define(agent, op.name, m.atomics.pop(0) if m.atomics else 1 << 30)


def _cp_async(m, agent, op: K.AsyncCopyOp) -> None:
    """A cp.async copy: each thread's bytes land when a cp.async.wait_group retires its group."""
    stage = _stage_in(m, agent, op.dst, op.buffer, op.loc) if op.buffer else None
    lo, hi = _span(m, agent, op.buffer or "", stage, op.loc)
    write = access(op, agent, True, f"cp.async into {op.buffer}", False)
    m.memory.write(lo, hi, write, agent.clock)
    agent.cp.open.append(write)


HANDLERS = {H.MbarrierInitOp: _init, H.MbarrierArriveOp: _arrive, H.MbarrierArriveExpectTxOp: _arrive,
            H.MbarrierWaitOp: _wait, H.TmaLoadOp: _tma_load, H.NamedBarrierOp: _named, K.BarrierOp: _syncthreads,
            H.WgmmaOp: _wgmma, H.WgmmaCommitOp: _commit, H.WgmmaWaitOp: _retire, K.CopyOp: _copy,
            H.FenceProxyAsyncOp: _fence, H.TmaStoreOp: _tma_store, H.TmaStoreWaitOp: _tma_store_wait,
            H.TileSlotStoreOp: _slot, H.TileSlotLoadOp: _slot, H.AtomicAddOp: _atomic, K.AsyncCopyOp: _cp_async,
            K.CommitOp: _commit, K.WaitOp: _retire}
