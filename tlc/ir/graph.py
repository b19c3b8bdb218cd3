"""The TL graph: the only code in tlc that touches networkx.

A `Graph` is one region (the program, or a loop body) of ops connected by SSA data
edges and an effect chain through every op that touches global or shared memory, so a
reordering can never move a copy past the copy it depends on. Iteration is a
topological order with ties broken by program position: golden tests depend on it.

Lookups a pass makes per op (`producer`, the position behind `replace`) go through
indexes rebuilt lazily after an edit, so checking a program stays linear in its size.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator

import networkx as nx

from tlc.ir.ops import LoopOp, Op
from tlc.ir.tensor_inputs import TensorInput
from tlc.ir.types import Value


class Graph:
    def __init__(self, file: str = "<input>", parent: "Graph | None" = None):
        self.file = file
        self.parent = parent
        self.params: dict[str, Any] = {}
        self.param_locs: dict[str, Any] = {}  # Param name → its statement's Loc, for errors about its value
        self.inputs: dict[str, str] = {}
        self.tensor_inputs: dict[str, TensorInput] = {}   # `Input seqlens : int32[batch]` (tlc/ir/tensor_inputs.py)
        self.axes: dict[str, Any] = {}   # a kernel's own grid axes, name → extent (`Kernel k over [split_idx = S]`)
        self._order: list[Op] = []
        self._nx: nx.DiGraph | None = None  # nodes are positions in _order
        self._topo: list[int] | None = None  # topological order (positions), dropped whenever _nx is rebuilt
        self._ops: list[Op] | None = None    # ops() in that order, dropped by any edit
        self._positions: dict[int, int] | None = None  # id(op) → index in _order
        self._producers: dict[int, Op] | None = None   # value uid → the op (or loop) defining it here

    # ------------------------------------------------------------ building
    def add(self, op: Op) -> Op:
        self._order.append(op)
        self._adopt(op)
        self._nx = None
        if self._positions is not None:  # appending keeps both indexes valid: extend them
            self._positions[id(op)] = len(self._order) - 1
        if self._producers is not None:
            for uid in _defined_uids(op):
                self._producers.setdefault(uid, op)
        return op

    def insert_before(self, anchor: Op, op: Op) -> Op:
        self._order.insert(self._index(anchor), op)
        self._edited(op)
        return op

    def insert_after(self, anchor: Op, op: Op) -> Op:
        self._order.insert(self._index(anchor) + 1, op)
        self._edited(op)
        return op

    def replace(self, old: Op, new: Op) -> Op:
        """Put `new` at `old`'s position. When it reads and defines the same values (an
        attribute changed), the dependency graph and indexes stay valid: a pass that
        rewrites every op's attributes costs no rebuild per op."""
        i = self._index(old)
        self._order[i] = new
        self._adopt(new)
        self._ops = None
        same_values = _defined_uids(old) == _defined_uids(new)
        if isinstance(new, LoopOp) or not (same_values and old.has_effect == new.has_effect
                                           and [v.uid for v in old.operands] == [v.uid for v in new.operands]):
            self._nx = None  # a loop's edges also depend on its body, which may have changed since
        if not same_values:
            self._producers = None
        elif self._producers is not None:
            for uid in _defined_uids(new):
                if self._producers.get(uid) is old:
                    self._producers[uid] = new
        if self._positions is not None:
            del self._positions[id(old)]
            self._positions[id(new)] = i
        return new

    def erase(self, op: Op) -> None:
        self._order.pop(self._index(op))
        self._edited(None)

    def _edited(self, op: Op | None) -> None:
        if op is not None:
            self._adopt(op)
        self._nx = None
        self._positions = None
        self._producers = None

    def _index(self, op: Op) -> int:
        if self._positions is None:
            self._positions = {id(o): i for i, o in enumerate(self._order)}
        i = self._positions.get(id(op))
        if i is None or self._order[i] is not op:
            raise KeyError(f"op {op.mnemonic} is not in this region")
        return i

    def _adopt(self, op: Op) -> None:
        self._ops = None
        if isinstance(op, LoopOp) and op.body is not None:
            op.body.parent = self
            op.body.file = self.file

    # ------------------------------------------------------------ queries
    def _graph(self) -> nx.DiGraph:
        if self._nx is not None:
            return self._nx
        self._topo = None
        g = nx.DiGraph()
        producer: dict[int, int] = {}
        last_effect: int | None = None
        for pos, op in enumerate(self._order):
            g.add_node(pos)
            for v in _uses(op):
                src = producer.get(v.uid)
                if src is not None and src != pos:
                    g.add_edge(src, pos, kind="data")
            if op.has_effect:
                if last_effect is not None:
                    g.add_edge(last_effect, pos, kind="effect")
                last_effect = pos
            for r in op.results:
                producer[r.uid] = pos
        self._nx = g
        return g

    def ops(self) -> list[Op]:
        g = self._graph()
        if self._topo is None:  # the interpreter asks once per trip: sort once per edit
            self._topo = list(nx.lexicographical_topological_sort(g))  # ties: program position
            self._ops = None
        if self._ops is None:
            self._ops = [self._order[i] for i in self._topo]
        return list(self._ops)

    def __iter__(self) -> Iterator[Op]:
        return iter(self.ops())

    def __len__(self) -> int:
        return len(self._order)

    def effect_edges(self) -> list[tuple[Op, Op]]:
        return [(self._order[a], self._order[b]) for a, b, k in self._graph().edges(data="kind") if k == "effect"]

    def producer(self, value: Value) -> Op | None:
        """The op defining `value`, searched here and in enclosing regions."""
        region: Graph | None = self
        while region is not None:
            if region._producers is None:
                region._producers = {}
                for op in region._order:
                    for uid in _defined_uids(op):
                        region._producers.setdefault(uid, op)  # the first definition, as a scan finds
            op = region._producers.get(value.uid)
            if op is not None and _defines(op, value):
                return op
            region = region.parent
        return None

    def users(self, value: Value) -> list[Op]:
        """Ops of this region (loops counted when their body uses it) reading `value`."""
        return [op for op in self.ops() if any(v is value for v in _uses(op))]

    def users_from(self, start: Value, follow: Callable[[Op], bool]) -> Iterator[tuple[Value, Op]]:
        """(value, reader) for every reader in this region of `start` and, transitively, of the results
        of the readers `follow` accepts: a forward walk each value of which is visited once."""
        frontier, seen = [start], set()
        while frontier:
            x = frontier.pop()
            if x.uid in seen:
                continue
            seen.add(x.uid)
            for u in self.users(x):
                yield x, u
                if follow(u):
                    frontier.extend(u.results)

    def depends_on(self, value: Value, sources: set[int]) -> bool:
        """Whether `value` is, or is computed in this region from, a value whose uid is in `sources`."""
        stack, seen = [value], set()
        while stack:
            v = stack.pop()
            if v.uid in sources:
                return True
            if v.uid in seen:
                continue
            seen.add(v.uid)
            op = self.producer(v)
            if op is not None and self.holds(op):
                stack.extend(op.operands)
        return False

    def holds(self, op: Op) -> bool:
        """Whether `op` is one of this region's own ops (not an enclosing region's)."""
        if self._positions is None:
            self._positions = {id(o): i for i, o in enumerate(self._order)}
        i = self._positions.get(id(op))
        return i is not None and self._order[i] is op

    def walk(self) -> Iterator[tuple["Graph", Op]]:
        """Every op of this region and nested regions, pre-order, with its region."""
        for op in self.ops():
            yield self, op
            if isinstance(op, LoopOp) and op.body is not None:
                yield from op.body.walk()

    def root(self) -> "Graph":
        g = self
        while g.parent is not None:
            g = g.parent
        return g

    # ------------------------------------------------------------ rewriting helpers
    def replace_all_uses(self, old: Value, new: Value, *, skip: Op | None = None) -> None:
        """Make every op in this region and below read `new` instead of `old`."""
        for op in list(self._order):
            if op is skip:
                continue
            updated = _rewire(op, old, new, skip)
            if updated is not op:
                self.replace(op, updated)

    def map_ops(self, fn: Callable[[Op], Op]) -> None:
        for op in list(self._order):
            new = fn(op)
            if new is not op:
                self.replace(op, new)


def _defined_uids(op: Op) -> list[int]:
    uids = [r.uid for r in op.results]
    if isinstance(op, LoopOp):
        uids += [a.uid for a in op.args]
    return uids


def _defines(op: Op, value: Value) -> bool:
    return any(r is value for r in op.results) or (isinstance(op, LoopOp) and any(a is value for a in op.args))


def _uses(op: Op) -> list[Value]:
    """Values an op reads, including values its loop body captures from outside."""
    vals = list(op.operands)
    if isinstance(op, LoopOp) and op.body is not None:
        inner = {r.uid for _, o in op.body.walk() for r in o.results}
        inner |= {a.uid for a in op.args}
        for _, o in op.body.walk():
            vals.extend(v for v in _uses_shallow(o) if v.uid not in inner)
        vals.extend(v for v in op.yields if v.uid not in inner)
    return vals


def _uses_shallow(op: Op) -> list[Value]:
    vals = list(op.operands)
    if isinstance(op, LoopOp):
        vals.extend(op.yields)
    return vals


def _rewire(op: Op, old: Value, new: Value, skip: Op | None) -> Op:
    changes: dict[str, Any] = {}
    if any(v is old for v in op.operands):
        changes["operands"] = tuple(new if v is old else v for v in op.operands)
    if isinstance(op, LoopOp) and op.body is not None:
        if any(v is old for v in op.yields):
            changes["yields"] = tuple(new if v is old else v for v in op.yields)
        op.body.replace_all_uses(old, new, skip=skip)
    return dataclasses.replace(op, **changes) if changes else op
