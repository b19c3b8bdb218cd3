"""The effect interface of kernel-IR ops: what an op reads, writes and does, declared once per op class
(xDSL's memory-effect interface). Scheduling passes (insert-sync, pipeline, warp-specialize, persistent,
defer-reductions, overlap-gemms) and the name check ask `op.effects()` instead of testing op classes.

A class declares field names, not values: `EffectDecl(reads=("src",), shared_writes=("writes",))` says the
op reads the tensor its `src` field names and writes the shared buffers its `writes` field lists. A field
may hold a name, a tuple of names, or an expression indexing a named tensor (`tSrQ[_, _, kb]` is `tSrQ`).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, fields
from typing import Iterator

from tlc.kir.expr import Expr, Index, Var


class Effect(enum.Flag):
    """What an op does besides reading and writing named tensors."""

    NONE = 0
    CP_ASYNC = enum.auto()         # issues cp.async copies into shared memory; they land at a cp.async wait
    ASYNC_GROUP = enum.auto()      # commits, or waits for, a group of asynchronous work (cp.async, wgmma, TMA stores)
    BARRIER = enum.auto()          # a barrier of the CTA's threads, or of a named subset of them
    MBARRIER = enum.auto()         # initialises, arrives on or waits on an mbarrier (a TMA load completes on one)
    TMA = enum.auto()              # a TMA bulk tensor copy or prefetch, or a wait for TMA stores
    WGMMA = enum.auto()            # issues a wgmma, or orders registers around one (wgmma.fence, fence_operand)
    PROXY_FENCE = enum.auto()      # orders generic-proxy shared writes before async-proxy (wgmma, TMA) accesses
    GLOBAL_WRITE = enum.auto()     # writes global memory other than through a tiled copy (stores, atomics, timestamps)
    WARP_COLLECTIVE = enum.auto()  # a shuffle or vote: every lane of the warp takes part
    CONTROL = enum.auto()          # leaves the enclosing loop


@dataclass(frozen=True)
class Effects:
    """One op's effects, as names.

    `reads` / `writes`: the named values the op's operands read / write in place (register fragments, row
    vectors, partitions and views, counters); a name the op defines is not a write. `shared_reads` /
    `shared_writes`: the shared buffers the op reads, or writes through the generic proxy (a thread's
    stores: other threads see them after a barrier). `cp_async_writes`: shared buffers cp.async writes
    (visible after a cp.async wait); `tma_writes`: shared buffers a TMA load writes (visible after its
    mbarrier phase). `tokens_used` / `tokens_defined`: async-copy tokens and commit groups, a namespace of
    their own that never reaches C++."""

    reads: frozenset[str] = frozenset()
    writes: frozenset[str] = frozenset()
    shared_reads: frozenset[str] = frozenset()
    shared_writes: frozenset[str] = frozenset()
    cp_async_writes: frozenset[str] = frozenset()
    tma_writes: frozenset[str] = frozenset()
    tokens_used: frozenset[str] = frozenset()
    tokens_defined: frozenset[str] = frozenset()
    kinds: Effect = Effect.NONE

    def __or__(self, other: Effects) -> Effects:
        """Both ops' effects: what a region of them does."""
        return Effects(**{f.name: getattr(self, f.name) | getattr(other, f.name) for f in fields(self)})

    def is_pure(self) -> bool:
        """No read, write or other effect: the op only defines names (or holds ops that act)."""
        return self == NONE


NONE = Effects()
_NAME_SLOTS = tuple(f.name for f in fields(Effects) if f.name != "kinds")


@dataclass(frozen=True)
class EffectDecl:
    """An op class's effects: for each slot of `Effects`, the names of the fields holding its names."""

    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    shared_reads: tuple[str, ...] = ()
    shared_writes: tuple[str, ...] = ()
    cp_async_writes: tuple[str, ...] = ()
    tma_writes: tuple[str, ...] = ()
    tokens_used: tuple[str, ...] = ()
    tokens_defined: tuple[str, ...] = ()
    kinds: Effect = Effect.NONE

    def of(self, op: object) -> Effects:
        """The effects of `op`, an instance of the declaring class."""
        slots = {slot: frozenset(n for f in getattr(self, slot) for n in _names(getattr(op, f), op, f))
                 for slot in _NAME_SLOTS}
        return Effects(**slots, kinds=self.kinds)

    def field_names(self) -> set[str]:
        """Every field the declaration names (a test checks that the class has them)."""
        return {f for slot in _NAME_SLOTS for f in getattr(self, slot)}

    def token_fields(self) -> set[str]:
        """The fields holding async tokens and groups, not C++ names."""
        return set(self.tokens_used) | set(self.tokens_defined)


# Ops that only define names (declarations, scalars) or whose effects are their regions' ops'.
PURE = EffectDecl()


def _names(value: object, op: object, field: str) -> Iterator[str]:
    for item in value if isinstance(value, tuple) else (value,):
        if item is None or item == "":
            continue
        if isinstance(item, str):
            yield item
        elif isinstance(item, Expr):
            yield _tensor(item, op, field)
        else:
            raise TypeError(f"{type(op).__name__}.{field} = {item!r} holds no name")


def _tensor(e: Expr, op: object, field: str) -> str:
    """The tensor an operand expression reads or writes: `t` or `t[...]`."""
    while isinstance(e, Index):
        e = e.base
    if isinstance(e, Var):
        return e.name
    raise TypeError(f"{type(op).__name__}.{field} = `{e}` is not a tensor or an element of one")
