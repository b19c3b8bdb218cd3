"""The TL graph: the only code in tlc that touches networkx.

A `Graph` is one region (the program, or a loop body) of ops connected by SSA data
edges and an effect chain through every op that touches global or shared memory, so a
reordering can never move a copy past the copy it depends on. Iteration is a
topological order with ties broken by program position: golden tests depend on it.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator

import networkx as nx

from tlc.ir.ops import LoopOp, Op
from tlc.ir.types import Value


class Graph:
    def __init__(self, file: str = "<input>", parent: "Graph | None" = None):
        self.file = file
        self.parent = parent
        self.params: dict[str, Any] = {}
        self.inputs: dict[str, str] = {}
        self._order: list[Op] = []
        self._nx: nx.DiGraph | None = None
        self._topo: list[Op] | None = None  # ops() cache, dropped whenever _nx is rebuilt

    # ------------------------------------------------------------ building
    def add(self, op: Op) -> Op:
        self._order.append(op)
        self._adopt(op)
        self._nx = None
        return op

    def insert_before(self, anchor: Op, op: Op) -> Op:
        self._order.insert(self._index(anchor), op)
        self._adopt(op)
        self._nx = None
        return op

    def insert_after(self, anchor: Op, op: Op) -> Op:
        self._order.insert(self._index(anchor) + 1, op)
        self._adopt(op)
        self._nx = None
        return op

    def replace(self, old: Op, new: Op) -> Op:
        self._order[self._index(old)] = new
        self._adopt(new)
        self._nx = None
        return new

    def erase(self, op: Op) -> None:
        self._order.pop(self._index(op))
        self._nx = None

    def _index(self, op: Op) -> int:
        for i, o in enumerate(self._order):
            if o is op:
                return i
        raise KeyError(f"op {op.mnemonic} is not in this region")

    def _adopt(self, op: Op) -> None:
        if isinstance(op, LoopOp) and op.body is not None:
            op.body.parent = self
            op.body.file = self.file

    # ------------------------------------------------------------ queries
    def _graph(self) -> nx.DiGraph:
        if self._nx is not None:
            return self._nx
        self._topo = None
        g = nx.DiGraph()
        producer: dict[int, Op] = {}
        last_effect: Op | None = None
        for pos, op in enumerate(self._order):
            g.add_node(op, pos=pos)
            for v in _uses(op):
                src = producer.get(v.uid)
                if src is not None and src is not op:
                    g.add_edge(src, op, kind="data")
            if op.has_effect:
                if last_effect is not None:
                    g.add_edge(last_effect, op, kind="effect")
                last_effect = op
            for r in op.results:
                producer[r.uid] = op
        self._nx = g
        return g

    def ops(self) -> list[Op]:
        g = self._graph()
        if self._topo is None:  # the interpreter asks once per trip: sort once per edit
            pos = nx.get_node_attributes(g, "pos")
            self._topo = list(nx.lexicographical_topological_sort(g, key=lambda op: pos[op]))
        return list(self._topo)

    def __iter__(self) -> Iterator[Op]:
        return iter(self.ops())

    def __len__(self) -> int:
        return len(self._order)

    def effect_edges(self) -> list[tuple[Op, Op]]:
        return [(a, b) for a, b, k in self._graph().edges(data="kind") if k == "effect"]

    def producer(self, value: Value) -> Op | None:
        """The op defining `value`, searched here and in enclosing regions."""
        region: Graph | None = self
        while region is not None:
            for op in region._order:
                if any(r is value for r in op.results):
                    return op
                if isinstance(op, LoopOp) and any(a is value for a in op.args):
                    return op
            region = region.parent
        return None

    def users(self, value: Value) -> list[Op]:
        """Ops of this region (loops counted when their body uses it) reading `value`."""
        return [op for op in self.ops() if any(v is value for v in _uses(op))]

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
