"""`check_protocol`: for concrete sizes, a CPU proof that an sm_90a kernel's mbarrier and named-barrier protocol
cannot deadlock or overrun its rings, or the problems (at the op's .tl line) that say why; run on the kernel IR the
schedule passes leave. One CTA executes abstractly, warp group by warp group (docs/hopper.md, "The protocol checker");
what it does not model is a problem `cannot prove: …`, never a pass. The barriers and the race history live in
`tlc.kir.sm90_protocol_sync`.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Mapping, NamedTuple

from tlc.diagnostics import Loc, Note
from tlc.expr import C, ExprError
from tlc.expr import evaluate as _evaluate
from tlc.kir import ops as K
from tlc.kir import ops_sm90 as H
from tlc.kir.expr import Expr, Var, free_names
from tlc.kir.sm90_protocol_sync import (HANDLERS, INERT, INLINE, SILENT, Access, AsyncGroups, Clock, Epoch,
                                        Mbarrier, Memory, NamedBarrier, ProtocolProblem, join, needed_names,
                                        shared_geometry)

# The greedy schedules: each agent runs until it blocks, in this order.
_ORDERS = {"producer-first": lambda a: (a.role != "producer", a.group, a.id),
           "consumers-first": lambda a: (a.role == "producer", a.group, a.id),
           "consumers-reversed": lambda a: (a.role == "producer", -a.group, a.id)}
SCHEDULES = tuple(_ORDERS)
MAX_STEPS = 200_000       # per run; the largest at default sizes (BM 256, BN 32, persistent) takes 37 000


class _Stop(Exception):
    """The run cannot go on (a value it needs is missing, or it ran too long)."""


_Unknown = NamedTuple("_Unknown", [("reason", str)])       # a value the kernel has but the checker does not
_PerThread = NamedTuple("_PerThread", [("values", dict)])    # thread index → value, where threads differ


@dataclass
class _Frame:
    ops: tuple[K.Op, ...]
    scope: dict
    index: int = 0
    loop: K.ForOp | None = None
    var: int = 0
    loc: Loc | None = None

    def copy(self) -> _Frame:
        return _Frame(self.ops, dict(self.scope), self.index, self.loop, self.var, self.loc)


@dataclass
class _Agent:
    id: int
    who: str
    threads: tuple[int, ...]
    frames: list[_Frame]
    clock: Clock
    role: str = "cta"
    group: int = -1
    wgmma: AsyncGroups = field(default_factory=AsyncGroups)
    cp: AsyncGroups = field(default_factory=AsyncGroups)
    tma_stores: list[Access] = field(default_factory=list)
    unfenced: list[Access] = field(default_factory=list)
    blocked: tuple | None = None
    done: bool = False
    syncs: int = 0          # barriers across all its threads passed (orders its threads' shared accesses)
    # What threads that do not span every warp group of the agent did alone (thread 0's mbarrier inits):
    # the rest of the agent learns it only at a barrier all its threads pass. (threads, clock) each.
    private: list[tuple[frozenset, Clock]] = field(default_factory=list)

    def learn_private(self) -> None:
        """A barrier every thread of the agent passes: what some of them did alone is known to all."""
        for _, known in self.private:
            join(self.clock, known)
        self.private.clear()

    def tick(self) -> Epoch:
        self.clock[self.id] = self.clock.get(self.id, 0) + 1
        return Epoch(self.id, self.clock[self.id])


class _Divergent(Exception):
    """An expression reads threadIdx.x (or a per-thread value) where one value was asked for."""


class _Names:
    """The names an expression of `agent` sees, innermost scope first; `thread` binds threadIdx.x."""

    def __init__(self, machine: _Machine, agent: _Agent, thread: int | None) -> None:
        self.machine, self.agent, self.thread = machine, agent, thread

    def __getitem__(self, name: str):
        for frame in reversed(self.agent.frames):
            if name in frame.scope:
                value = frame.scope[name]
                break
        else:
            if name == "threadIdx.x":
                if self.thread is None:
                    raise _Divergent
                return self.thread
            value = self.machine.names.get(name, _Unknown(f"`{name}` has no value here"))
        if isinstance(value, _PerThread):
            if self.thread is None:
                raise _Divergent
            value = value.values[self.thread]
        if isinstance(value, _Unknown):
            raise ExprError(value.reason)
        return value

    def __contains__(self, name: object) -> bool:
        return True      # a name without a value raises its reason from __getitem__


class _Machine:
    """One abstract execution of one kernel for one CTA under one schedule."""

    def __init__(self, kernel: K.KernelOp, names: dict, atomics: list[int], schedule: str,
                 needed: set[str] | None = None) -> None:
        self.kernel, self.names, self.atomics, self.schedule = kernel, names, list(atomics), schedule
        self.rng = random.Random(schedule)
        self.problems: dict[tuple[str, Loc | None], ProtocolProblem] = {}
        self.memory, self.named, self.pseudo = Memory(self.report), {}, {}
        self.slot_values: dict[str, object] = {}
        self.steps, self.next_id = 0, 1
        self.matters, self.free, self.per_thread = {}, {}, {}      # caches by op, expression, (expression, values)
        self.needed = needed_names(kernel) if needed is None else needed
        # where a problem without a place of its own is put: the op running, else the kernel's first statement
        self.first_loc = kernel.loc or next((op.loc for op in K.walk(kernel) if op.loc is not None), None)
        self.where = self.first_loc
        defs = list(K.walk(kernel))
        self.descs = {op.name: op for op in defs if isinstance(op, H.TmaDescriptorOp)}
        self.bars = {op.name: [Mbarrier(f"{op.name}[{i}]") for i in range(op.count)]
                     for op in defs if isinstance(op, H.MbarrierOp)}
        self.slots = {op.name: (op.offset_bytes, op.offset_bytes + 4) for op in defs if isinstance(op, H.TileSlotOp)}
        self.buffers = shared_geometry(kernel)
        self.layouts = {op.name: op for op in defs if isinstance(op, H.GmmaSmemLayoutOp)}
        self.layout_of = {op.name: op.layout for op in defs if isinstance(op, K.SharedBufferOp)}
        self.views = {op.name: op.of for op in defs if isinstance(op, K.SharedViewOp)}
        self.sources = {op.name: op.src.name for op in defs
                        if isinstance(getattr(op, "src", None), Var) and isinstance(getattr(op, "name", None), str)}
        self.everyone = tuple(range(kernel.threads))
        self.agents = [_Agent(0, "the CTA", self.everyone, [_Frame(kernel.body, {}, loc=kernel.loc)], {0: 0})]

    # ------------------------------------------------------------------ reporting and values
    def report(self, message: str, loc: Loc | None, notes: tuple[Note, ...] = ()) -> None:
        loc = loc or self.where
        self.problems.setdefault((message, loc), ProtocolProblem(message, loc, notes))
        if len(self.problems) >= 12:
            raise _Stop

    def halt(self, message: str, loc: Loc | None) -> None:
        """Report and stop this run: what follows would rest on a value the kernel does not have."""
        self.report(message, loc)
        raise _Stop

    def cannot(self, message: str, loc: Loc | None) -> None:
        self.halt(f"cannot prove: {message}", loc)

    def unknown(self, reason: str) -> _Unknown:
        return _Unknown(reason)

    def define(self, agent: _Agent, name: str, value) -> None:
        agent.frames[-1].scope[name] = value

    def pseudo_agent(self, bar: str, index: int) -> tuple[int, Clock]:
        """The agent TMA loads completing on `bar[index]` act as: its events are seen only by waiting."""
        if (bar, index) not in self.pseudo:
            self.pseudo[(bar, index)] = (self.next_id, {})
            self.next_id += 1
        return self.pseudo[(bar, index)]

    def value(self, agent: _Agent, e: Expr, loc: Loc | None, what: str):
        """`e` as one value for every thread of `agent` (a problem `cannot prove` when it has none)."""
        got = self._eval(agent, e)
        if isinstance(got, _Unknown):
            self.cannot(f"{what} `{e}` has no value for {agent.who}: {got.reason}", loc)
        if isinstance(got, _PerThread):
            self.cannot(f"{what} `{e}` differs between the threads of {agent.who}", loc)
        return got

    def _eval(self, agent: _Agent, e: Expr):
        try:
            return _evaluate(e, _Names(self, agent, None), C)
        except ExprError as why:
            return _Unknown(str(why))
        except _Divergent:
            pass
        key = self._thread_key(agent, e)
        if key is not None and key in self.per_thread:
            return self.per_thread[key]
        values = {}
        for t in agent.threads:
            try:
                values[t] = _evaluate(e, _Names(self, agent, t), C)
            except ExprError as why:
                return _Unknown(str(why))
        first = values[agent.threads[0]]
        got = first if all(v == first for v in values.values()) else _PerThread(values)
        if key is not None:
            self.per_thread[key] = got
        return got

    def _thread_key(self, agent: _Agent, e: Expr) -> tuple | None:
        """What a per-thread value of `e` depends on besides threadIdx.x (None: a per-thread name too)."""
        names = self.free.get(id(e))
        if names is None:
            names = self.free[id(e)] = tuple(sorted(free_names(e) - {"threadIdx.x"}))
        values = _Names(self, agent, None)
        try:
            return (id(e), agent.threads, *(values[n] for n in names))
        except (_Divergent, ExprError):
            return None

    def _matters(self, op: K.Op) -> bool:
        """Whether `op` with its regions does anything the protocol sees (an unmodelled op counts): a branch
        or loop of register math only is skipped without evaluating its condition or bounds."""
        key = id(op)
        if key not in self.matters:
            self.matters[key] = any(not isinstance(x, SILENT) for x in K.walk(op))
        return self.matters[key]

    # ------------------------------------------------------------------ the scheduler
    def run(self) -> list[ProtocolProblem]:
        try:
            self._schedule()
        except _Stop:
            pass
        return list(self.problems.values())

    def _order(self) -> list[_Agent]:
        live = [a for a in self.agents if not a.done]
        if self.schedule in _ORDERS:
            return sorted(live, key=_ORDERS[self.schedule])
        self.rng.shuffle(live)
        return live

    def _schedule(self) -> None:
        while True:
            progressed = False
            for agent in self._order():
                budget = self.rng.randint(1, 24) if self.schedule.startswith("random") else MAX_STEPS
                if self._advance(agent, budget):
                    progressed = True
            if all(a.done for a in self.agents):
                self._at_exit()
                return
            if not progressed:
                self._deadlock()
                return

    def _advance(self, agent: _Agent, budget: int) -> bool:
        moved = False
        while budget > 0 and not agent.done:
            if agent.blocked is not None and not self._unblock(agent):
                return moved
            op = self._next(agent)
            if op is None:
                self._finish(agent)
                return True
            self.steps += 1
            if self.steps > MAX_STEPS:
                self.cannot(f"the CTA runs more than {MAX_STEPS} protocol steps (a loop that does not end?)", op.loc)
            self.exec(agent, op)
            moved, budget = True, budget - 1
        return moved

    def _next(self, agent: _Agent) -> K.Op | None:
        while agent.frames:
            frame = agent.frames[-1]
            if frame.index < len(frame.ops):
                frame.index += 1
                return frame.ops[frame.index - 1]
            if frame.loop is not None:
                frame.var += frame.loop.step
                frame.scope, frame.index = {frame.loop.var: frame.var}, 0
                if self._continues(agent, frame.loop, frame.var):
                    continue
            agent.frames.pop()
        return None

    def _continues(self, agent: _Agent, loop: K.ForOp, var: int) -> bool:
        stop = self.value(agent, loop.stop, loop.loc, f"the bound of loop {loop.var}")
        return var < stop if loop.step > 0 else var > stop

    def _finish(self, agent: _Agent) -> None:
        agent.done = True
        for left, what in ((agent.wgmma.in_flight(), "wgmma operand reads"), (agent.cp.in_flight(), "cp.async copies"),
                           (next(iter(agent.tma_stores), None), "a TMA store's reads")):
            if left is not None:
                self.report(f"{agent.who} ends with {what} in flight (no wait retires them)", left.loc)

    def _unblock(self, agent: _Agent) -> bool:
        kind, barrier, key, _ = agent.blocked
        if kind == "mbarrier":
            if not barrier.passes(key):
                return False
            join(agent.clock, barrier.done)
        else:
            if barrier.generation <= key:
                return False
            join(agent.clock, barrier.done[key])
            agent.syncs += 1
        agent.blocked = None
        return True

    def _deadlock(self) -> None:
        stuck = [a for a in self.agents if not a.done]
        blocked = [a for a in stuck if a.blocked]
        places = [a.blocked[3].loc or _context(a) or self.first_loc for a in blocked]
        notes = tuple(Note(f"{a.who} waits here: {a.blocked[1].state()}", at) for a, at in zip(blocked, places))
        what = "; ".join(f"{a.who} on {a.blocked[1].state()}" for a in blocked)
        self.report(f"deadlock: every unfinished agent waits ({what})", places[0] if places else None, notes)

    def _at_exit(self) -> None:
        for bars in self.bars.values():
            for bar in bars:
                if bar.count and (bar.pending != bar.count or bar.tx):
                    where = next(iter(bar.arrived.values()), None)
                    self.report(f"the CTA ends with {bar.state()}: a phase left incomplete", where)
        for nb in self.named.values():
            if nb.arrived:
                self.report(f"the CTA ends with {nb.state()}", next(iter(nb.members.values()), None))

    # ------------------------------------------------------------------ control flow
    def exec(self, agent: _Agent, op: K.Op) -> None:
        self.where = op.loc or _context(agent) or self.first_loc
        handler = _handler(type(op))
        if handler is not None:
            handler(self, agent, op)
        elif not isinstance(op, INERT):
            self.cannot(f"{type(op).__name__} is not modelled by the protocol checker", op.loc)

    def _let(self, agent: _Agent, op: K.LetOp) -> None:
        if op.name in self.needed:
            self.define(agent, op.name, self._eval(agent, op.value))

    def _vote(self, agent: _Agent, op: K.WarpAnyOp) -> None:
        self.define(agent, op.name, _Unknown(f"`{op.name}` is a warp vote on data"))

    def _roles(self, agent: _Agent, op: H.WarpSpecializeOp) -> None:
        """One agent per warp group, each continuing with its role's region."""
        threads, producers = self.kernel.threads, op.producer_threads
        if agent.threads != self.everyone:
            self.cannot(f"a WarpSpecializeOp reached by {agent.who}, not by the whole CTA", op.loc)
        if threads % H.WARP_GROUP or producers % H.WARP_GROUP or not 0 < producers < threads:
            self.cannot(f"{producers} producer threads of {threads} are not whole warp groups of both roles", op.loc)
        first = threads - producers if op.producer_last else 0
        for group in range(threads // H.WARP_GROUP):
            lanes = tuple(range(group * H.WARP_GROUP, (group + 1) * H.WARP_GROUP))
            role = "producer" if first <= lanes[0] < first + producers else "consumer"
            body = op.producer if role == "producer" else op.consumer
            frames = [f.copy() for f in agent.frames] + [_Frame(body, {op.group: group}, loc=op.loc)]
            clock = dict(agent.clock)
            for threads_alone, known in agent.private:
                if threads_alone & set(lanes):
                    join(clock, known)
            self.agents.append(_Agent(self.next_id, f"warp group {group} ({role})", lanes, frames, clock, role, group))
            self.next_id += 1
        agent.done = True

    def _for(self, agent: _Agent, op: K.ForOp) -> None:
        if not self._matters(op):
            return
        start = self.value(agent, op.start, op.loc, f"the start of loop {op.var}")
        frame = _Frame(op.body, {op.var: start}, loop=op, var=start, loc=op.loc)
        agent.frames.append(frame)
        if not self._continues(agent, op, start):
            agent.frames.pop()

    def _if(self, agent: _Agent, op: K.IfOp) -> None:
        if not self._matters(op):
            return
        cond = self._eval(agent, op.cond)
        if isinstance(cond, _Unknown):
            self.cannot(f"the condition `{op.cond}` guards synchronisation but has no value for {agent.who}: "
                        f"{cond.reason}", op.loc)
        if not isinstance(cond, _PerThread):
            if cond:
                agent.frames.append(_Frame(op.body, {}, loc=op.loc))
            return
        taken = tuple(t for t in agent.threads if cond.values[t])
        if not taken:
            return
        if all(isinstance(x, INLINE) for body_op in op.body for x in K.walk(body_op)):
            self._inline(agent, op, taken)
            return
        rest = tuple(t for t in agent.threads if not cond.values[t])
        child = _Agent(self.next_id, f"{agent.who}, {_thread_text(taken)}", taken,
                       [f.copy() for f in agent.frames] + [_Frame(op.body, {}, loc=op.loc)], dict(agent.clock),
                       agent.role, agent.group)
        self.next_id += 1
        self.agents.append(child)
        agent.threads, agent.who = rest, f"{agent.who}, {_thread_text(rest)}"

    def _inline(self, agent: _Agent, op: K.IfOp, taken: tuple[int, ...]) -> None:
        """Run a branch part of the agent's threads take, whose ops cannot block, with those threads. Threads
        in some but not all of the agent's warp groups act alone (their own clock, kept private); one thread
        per warp group acts for its warp group (a wgmma's wait retires the whole group's reads)."""
        groups = {t // H.WARP_GROUP for t in agent.threads}
        alone = {t // H.WARP_GROUP for t in taken} != groups
        ident, clock = agent.id, agent.clock
        if alone:
            ident, clock = self.next_id, dict(agent.clock)
            self.next_id += 1
            agent.private.append((frozenset(taken), clock))
        sub = _Agent(ident, f"{agent.who}, {_thread_text(taken)}", taken,
                     agent.frames + [_Frame(op.body, {}, loc=op.loc)], clock, agent.role, agent.group,
                     agent.wgmma, agent.cp, agent.tma_stores, agent.unfenced, syncs=agent.syncs)
        depth = len(agent.frames)
        while len(sub.frames) > depth:
            frame = sub.frames[-1]
            if frame.index >= len(frame.ops):
                sub.frames.pop()
                continue
            frame.index += 1
            self.exec(sub, frame.ops[frame.index - 1])

    def _break(self, agent: _Agent, op: K.BreakOp) -> None:
        while agent.frames:
            frame = agent.frames.pop()
            if frame.loop is not None:
                return
        self.cannot("a BreakOp outside a loop", op.loc)

    def _counter(self, agent: _Agent, op) -> None:
        if isinstance(op, K.CounterOp):
            self.define(agent, op.name, self.value(agent, op.init, op.loc, f"counter {op.name}'s start"))
            return
        for frame in reversed(agent.frames):
            if op.counter in frame.scope:
                value = self.value(agent, op.value, op.loc, f"the update of {op.counter}")
                frame.scope[op.counter] = value if isinstance(op, K.CounterSetOp) else frame.scope[op.counter] + value
                return
        self.cannot(f"counter {op.counter} is updated where it is not defined", op.loc)


def _context(agent: _Agent) -> Loc | None:
    """The innermost loop, branch or role around where `agent` is that has a place in the .tl file."""
    return next((f.loc for f in reversed(agent.frames) if f.loc is not None), None)


def _thread_text(threads: tuple[int, ...]) -> str:
    if len(threads) == 1:
        return f"thread {threads[0]}"
    if threads[-1] - threads[0] + 1 == len(threads):
        return f"threads {threads[0]}..{threads[-1]}"
    return f"{len(threads)} threads"


_CONTROL = {K.LetOp: _Machine._let, K.ForOp: _Machine._for, K.IfOp: _Machine._if, K.BreakOp: _Machine._break,
            K.CounterOp: _Machine._counter, K.CounterAddOp: _Machine._counter, K.CounterSetOp: _Machine._counter,
            K.WarpAnyOp: _Machine._vote, H.WarpSpecializeOp: _Machine._roles}
_BY_CLASS: dict[type, object] = {}


def _handler(cls: type):
    """The handler of an op class: its own, or its nearest base's (the flat views subclass the ops)."""
    if cls not in _BY_CLASS:
        _BY_CLASS[cls] = next((table[base] for base in cls.__mro__ for table in (_CONTROL, HANDLERS)
                               if base in table), None)
    return _BY_CLASS[cls]


# ----------------------------------------------------------------------------- what is checked where
@dataclass(frozen=True)
class Cta:
    """One CTA to execute: its block index in the grid and, for a persistent kernel, how many CTAs run
    (`ctas`) and the values its draws from the tile counter return (the CTAs drawing in turn)."""

    block: tuple[int, int, int]
    grid: tuple[int, int, int]
    ctas: int | None = None
    draws: tuple[int, ...] = ()

    def __str__(self) -> str:
        launched = f", launch.ctas = {self.ctas}" if self.ctas is not None else ""
        return f"CTA blockIdx {self.block} of grid {self.grid}{launched}"


def _grid(kernel: K.KernelOp, names: dict) -> tuple[int, int, int]:
    return tuple(int(_evaluate(g, names, C)) for g in kernel.grid)  # type: ignore[return-value]


def _spread(n: int) -> list[int]:
    """Indices of a dimension worth running: all of a short one, else both ends, their neighbours, the middle."""
    return list(range(n)) if n <= 5 else sorted({0, 1, n // 2, n - 2, n - 1})


def ctas_to_check(kernel: K.KernelOp, names: dict, read: set[str] | None = None) -> list[Cta]:
    """The CTAs whose runs cover the first, second, middle and last tiles (causal: the diagonal ones among
    them) and, for a persistent kernel, one CTA running every tile, two CTAs sharing them, one tile each."""
    uses = set().union(*(free_names(g) for g in kernel.grid))
    read = needed_names(kernel) if read is None else read
    if "launch.ctas" not in uses:
        gx, gy, gz = _grid(kernel, names)
        if not gx * gy * gz:
            return []
        xs = _spread(gx) if "blockIdx.x" in read else [0]          # no trip count depends on it: one CTA
        corners = sorted({(0, 0), (gy - 1, gz - 1)}) if read & {"blockIdx.y", "blockIdx.z"} else [(0, 0)]
        return [Cta((x, y, z), (gx, gy, gz)) for x in xs for y, z in corners]
    tiles = _grid(kernel, {**names, "launch.ctas": 1 << 30})[0]
    out = []
    for ctas in sorted({1, 2, tiles}):
        grid = _grid(kernel, {**names, "launch.ctas": ctas})
        for b in sorted({0, grid[0] - 1}):
            if 0 <= b:
                out.append(Cta((b, 0, 0), grid, ctas, tuple(b + k * grid[0] for k in range(tiles + 2))))
    return out


def _fields(sizes: Mapping[str, int]) -> dict:
    return {(k if k.startswith("p.") else f"p.{k}"): v for k, v in sizes.items()}


def _names(kernel: K.KernelOp, sizes: Mapping[str, int], cta: Cta) -> dict:
    names = _fields(sizes)
    for axis, block, size in zip("xyz", cta.block, cta.grid):
        names[f"blockIdx.{axis}"], names[f"gridDim.{axis}"] = block, size
        names[f"blockDim.{axis}"] = kernel.threads if axis == "x" else 1
    if cta.ctas is not None:
        names["launch.ctas"] = cta.ctas
    return names


def static_problems(kernel: K.KernelOp) -> list[ProtocolProblem]:
    """What holds for every size: the setmaxnreg register pool, and barriers and tile slots clear of the
    shared buffers' bytes."""
    out = []
    entry = H.entry_registers(kernel.threads)
    for op in K.walk(kernel):
        if isinstance(op, H.WarpSpecializeOp):
            consumers = kernel.threads - op.producer_threads
            total = op.producer_regs * op.producer_threads + op.consumer_regs * consumers
            if total > entry * kernel.threads:
                out.append(ProtocolProblem(
                    f"setmaxnreg asks {op.producer_regs}x{op.producer_threads} + {op.consumer_regs}x{consumers} = "
                    f"{total} registers; {kernel.threads} threads start with {entry} each, a pool of "
                    f"{entry * kernel.threads}: the consumers' setmaxnreg.inc never returns", op.loc))
            if op.producer_regs > entry:
                out.append(ProtocolProblem(f"the producer's setmaxnreg.dec {op.producer_regs} is above the {entry} "
                                           f"registers each thread starts with", op.loc))
    spans = [(name, first, first + size) for name, (first, size, _) in shared_geometry(kernel).items()]
    for op in K.walk(kernel):
        if isinstance(op, (H.MbarrierOp, H.TileSlotOp)):
            lo = op.offset_bytes
            hi = lo + (8 * op.count if isinstance(op, H.MbarrierOp) else 4)
            hits = [name for name, first, end in spans if first < hi and lo < end]
            if hits or hi > kernel.smem_bytes:
                where = f"the bytes of {', '.join(hits)}" if hits else f"past smem_bytes = {kernel.smem_bytes}"
                out.append(ProtocolProblem(f"{op.name} at bytes {lo}..{hi} lies in {where}", op.loc))
    return out


def _checked(kernel: K.KernelOp) -> bool:
    return isinstance(kernel, H.Sm90KernelOp) or any(
        isinstance(op, (H.MbarrierOp, H.NamedBarrierOp, H.WarpSpecializeOp)) for op in K.walk(kernel))


def check_protocol(program: K.ProgramOp, sizes: Mapping[str, int], *, schedules: tuple[str, ...] = SCHEDULES,
                   ctas: int | None = None) -> list[ProtocolProblem]:
    """The protocol problems of `program`'s sm_90a kernels at `sizes` (parameter fields by name: seqlen_q,
    seqlen_k, batch, heads, group, …), [] when every CTA `ctas_to_check` picks runs to its end under every
    schedule with no problem. A kernel stops at the first CTA that shows one; each problem notes the run.
    `schedules`: `SCHEDULES`' greedy orders, or `random-<seed>` (agents in a seeded random order, a few steps
    at a time); `ctas` keeps the first that many CTAs (a quicker, weaker check)."""
    for schedule in schedules:
        if schedule not in SCHEDULES and not schedule.startswith("random-"):
            raise ValueError(f"schedule {schedule!r}: one of {', '.join(SCHEDULES)} or random-<seed>")
    found: dict[tuple[str, Loc | None], ProtocolProblem] = {}
    for kernel in program.kernels():
        if not _checked(kernel):
            continue
        for problem in static_problems(kernel):
            found.setdefault((problem.message, problem.loc), problem)
        read = needed_names(kernel)
        try:
            picked = ctas_to_check(kernel, _fields(sizes), read)
        except (ExprError, TypeError) as why:
            found.setdefault(("grid", None), ProtocolProblem(
                f"cannot prove: the grid ({', '.join(map(str, kernel.grid))}) has no value at these sizes: {why}",
                kernel.loc))
            continue
        for cta in picked[:ctas]:
            problems = []
            for schedule in schedules:
                run = _Machine(kernel, _names(kernel, sizes, cta), list(cta.draws), schedule, read).run()
                shown = ", ".join(f"{k} = {v}" for k, v in sizes.items())
                problems += [ProtocolProblem(p.message, p.loc, p.notes + (
                    Note(f"found at {shown}, {cta}, schedule {schedule}"),)) for p in run]
            for problem in problems:
                found.setdefault((problem.message, problem.loc), problem)
            if problems:
                break
    return list(found.values())


def default_sizes(program: K.ProgramOp) -> list[dict[str, int]]:
    """Problem sizes that reach a kernel's edge cases: one row, an odd length inside one tile, one past
    each tile height its TMA boxes load (a partial last tile), several tiles, and query and key lengths far
    apart both ways (causal bottom-right: rows with no key; many key tiles for one query tile)."""
    rows = sorted({op.box[-2] for op in K.walk(program) if isinstance(op, H.TmaDescriptorOp)}) or [64]
    many = 3 * rows[-1] + 5
    lengths = sorted({1, 17, many} | {r + 1 for r in rows})
    pairs = [(n, n) for n in lengths] + [(17, many), (many, 17)]
    out = [{"seqlen_q": q, "seqlen_k": k, "batch": 1, "heads": 2, "group": 1} for q, k in pairs]
    # tensor Inputs (int32/fp32 pointers, tlc/ir/tensor_inputs.py): every element the same value, each of 0, 1
    # and the longer length in turn, so a loop bound read from one runs no trip, one, and many
    pointers = [(name, kind) for op in K.walk(program) if isinstance(op, K.ParamsOp)
                for name, kind in op.fields if kind in ("ptr<i32>", "ptr<f32>")]
    if not pointers:
        return out
    return [{**sizes, **{name: _Filled(v, kind == "ptr<f32>") for name, kind in pointers}}
            for sizes in out for v in (0, 1, max(sizes["seqlen_q"], sizes["seqlen_k"]))]


class _Filled:
    """A tensor Input as the checker sees it: every element `value` (what `tlc.expr`'s `load` reads)."""

    def __init__(self, value: int, floating: bool) -> None:
        self.value, self.floating = (float(value) if floating else value), floating

    def reshape(self, *_shape: int) -> "_Filled":
        return self

    def numel(self) -> int:
        return 1 << 40

    def __getitem__(self, _at: int) -> "_Filled":
        return self

    def item(self) -> int | float:
        return self.value

    def is_floating_point(self) -> bool:
        return self.floating

    def __str__(self) -> str:
        return f"every element {self.value}"


def protocol_problems(program: K.ProgramOp) -> list[str]:
    """`check_protocol` at `default_sizes`, stopping at the first sizes with problems: each as
    `file:line:col: message` (what the build refuses with)."""
    for sizes in default_sizes(program):
        problems = check_protocol(program, sizes)
        if problems:
            return [str(p) for p in problems]
    return []
