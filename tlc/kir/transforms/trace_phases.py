"""`trace-phases` (`Param Trace = true`): a timeline of the kernel, stamped at its phase boundaries.

Where a short-sequence kernel loses time is per tile (the prologue before the first GEMM, the
epilogue's store, the gap before the SM's next CTA), which counters summed over the run do not
separate. This pass puts a `TimestampOp` at each boundary of every warp group's program:

    the CTA's start;  each role's start and end (in a warp-specialised kernel, inside the producer's
    one-thread branch);  after each top-level mbarrier wait (the consumers' Q);  before and after
    each top-level loop;  before the first barrier after the last loop (the epilogue)

and a program-level `TraceBufferOp` they write: per (CTA, warp group, slot) the SM and its clock.
With `Param TraceTrips = true` each top-level loop also stamps the start of its first `TRIPS` trips
(one slot each), which shows whether a phase's time is spread over its trips or sits in a few.
`bench/timeline.py` reads the buffer back and reports the phases. The stamps are a few instructions
each and change no value; a traced kernel is a different build (the Param is in its key). In a
persistent kernel the stamps inside the loop over tiles go to one unit per turn of that loop
(turn × grid + CTA, the same numbering in both roles), so each tile has its own timeline.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from tlc.kir import ops as K
from tlc.kir import ops_sm90 as H
from tlc.kir.expr import BinOp, Const, Expr, Var
from tlc.kir.transforms.attention.persistent import ITER
from tlc.kir.transforms.base import Facts, Notes, Transform
from tlc.kir.transforms.schedule import Schedule

BUFFER = "tlc_trace"
ENTRIES = 1 << 22   # 32 MB: 4M stamps, e.g. 16k CTAs × 4 warp groups × 64 slots
TRIPS = 8           # trips stamped per loop with TraceTrips


class _Slots:
    """Slot numbers in program order; each slot's label names its role and boundary."""

    def __init__(self, trips: bool = False) -> None:
        self.labels = []
        self.trips = trips

    def stamp(self, label: str, index: Expr | None = None) -> K.Op:
        self.labels.append(label)
        return _Pending(len(self.labels) - 1, label, index)

    def trip_stamps(self, loop: K.ForOp, label: str, index: Expr | None) -> K.ForOp:
        """`loop` with a stamp at the start of each of its first TRIPS trips (TRIPS slots reserved)."""
        if not self.trips:
            return loop
        base = len(self.labels)
        self.labels += [f"{label}:trip{j}" for j in range(TRIPS)]
        trip = BinOp("-", Var(loop.var), loop.start)
        stamp = _Pending(base, f"{label}:trip", index, trip)
        guard = K.IfOp(cond=BinOp("<", trip, Const(TRIPS)), body=(stamp,))
        return dataclasses.replace(loop, body=(guard, *loop.body))


@dataclasses.dataclass(frozen=True)
class _Pending:
    """A stamp whose `slots` (the total) is known only once every role is stamped."""

    slot: int
    label: str
    index: Expr | None = None
    offset: Expr | None = None


def _turn_unit() -> Expr:
    """A persistent kernel's tile turn as a trace unit: turn × grid + CTA (grid = gridDim.x CTAs)."""
    return BinOp("+", BinOp("*", Var(ITER), Var("gridDim.x")), Var("blockIdx.x"))


def _one_thread(op: K.Op) -> bool:
    """`IfOp(threadIdx.x == N)`: a role's work done by one thread (the producer's TMA issue)."""
    cond = getattr(op, "cond", None)
    return (isinstance(op, K.IfOp) and isinstance(cond, BinOp) and cond.op == "=="
            and cond.lhs == Var("threadIdx.x") and isinstance(cond.rhs, Const))


def _stamp_region(ops: tuple[K.Op, ...], role: str, slots: _Slots, index: Expr | None = None) -> tuple:
    if len(ops) == 1 and _one_thread(ops[0]):
        return (dataclasses.replace(ops[0], body=_stamp_region(ops[0].body, role, slots, index)),)
    turns = [op for op in ops if isinstance(op, K.ForOp) and op.var == ITER]
    if turns:   # a persistent kernel: each turn of its loop over tiles is a unit of its own
        (loop,) = turns
        inner = dataclasses.replace(loop, body=_stamp_region(loop.body, role, slots, _turn_unit()))
        return tuple(inner if op is loop else op for op in ops)
    last_loop = max((i for i, op in enumerate(ops) if isinstance(op, K.ForOp)), default=-1)
    out: list = [slots.stamp(f"{role}:start", index)]
    loops = waits = 0
    epilogue = False
    for i, op in enumerate(ops):
        if isinstance(op, K.ForOp):
            begin = slots.stamp(f"{role}:loop{loops}:begin", index)
            op = slots.trip_stamps(op, f"{role}:loop{loops}", index)
            out += [begin, op, slots.stamp(f"{role}:loop{loops}:end", index)]
            loops += 1
            continue
        if (not epilogue and last_loop >= 0 and i > last_loop
                and isinstance(op, (H.NamedBarrierOp, K.BarrierOp))):
            out.append(slots.stamp(f"{role}:epilogue", index))
            epilogue = True
        out.append(op)
        if isinstance(op, H.MbarrierWaitOp):
            out.append(slots.stamp(f"{role}:wait{waits}", index))
            waits += 1
    out.append(slots.stamp(f"{role}:end", index))
    return tuple(out)


def _finish(ops: tuple, total: int) -> tuple:
    out = []
    for op in ops:
        if isinstance(op, _Pending):
            out.append(K.TimestampOp(buffer=BUFFER, slot=op.slot, slots=total, label=op.label, index=op.index,
                                     slot_offset=op.offset))
        elif op.regions:
            out.append(dataclasses.replace(op, **{r: _finish(getattr(op, r), total) for r in op.regions}))
        else:
            out.append(op)
    return tuple(out)


def _stamp_kernel(kernel: K.KernelOp, slots: _Slots) -> tuple:
    if not any(isinstance(x, H.WarpSpecializeOp) for x in kernel.body):
        return _stamp_region(kernel.body, "cta", slots)
    stamped: list = [slots.stamp("cta:start")]
    for top in kernel.body:
        if isinstance(top, H.WarpSpecializeOp):
            top = dataclasses.replace(top, producer=_stamp_region(top.producer, "producer", slots),
                                      consumer=_stamp_region(top.consumer, "consumer", slots))
        stamped.append(top)
    return tuple(stamped)


def trace_phases(program: K.ProgramOp, trips: bool = False) -> tuple[K.ProgramOp, list[str]]:
    """The program with a trace buffer and every kernel's phase stamps, and a note per kernel."""
    notes, body, traced = [], [], False
    for op in program.body:
        if not isinstance(op, K.KernelOp):
            body.append(op)
            continue
        slots = _Slots(trips)
        stamped = _stamp_kernel(op, slots)
        total = len(slots.labels)
        body.append(dataclasses.replace(op, body=_finish(stamped, total)))
        traced = True
        notes.append(f"trace-phases: {op.name}: {total} stamps per warp group and CTA into {BUFFER}: "
                     + ", ".join(f"{i} {label}" for i, label in enumerate(slots.labels)))
    if traced:
        first = next(i for i, op in enumerate(body) if isinstance(op, K.KernelOp))
        body.insert(first, K.TraceBufferOp(name=BUFFER, entries=ENTRIES))
    return dataclasses.replace(program, body=tuple(body)), notes


@dataclass(frozen=True)
class TracePhasesTransform(Transform):
    """`Param Trace = true` (schedule.trace): the phase stamps and their buffer; `Param TraceTrips = true`
    (schedule.trace_trips, which implies Trace) also the first trips of each loop. Off by default."""

    name: ClassVar[str] = "trace-phases"

    def apply(self, program: K.ProgramOp, schedule: Schedule, facts: Facts) -> tuple[K.ProgramOp, Notes]:
        if not (schedule.trace or schedule.trace_trips):
            return program, []
        return trace_phases(program, schedule.trace_trips)
