"""Kernel IR and launch ABI ↔ JSON data, for the build index (`tlc.backend_cute.cache`).

Only tlc's own frozen dataclasses are named in the data (the kernel-IR ops, the expression nodes,
`Loc`, the launch ABI), looked up in an allow-list by class name and built from their data fields;
nothing in a file can name a module, a function or any other class. Each distinct node is written
once in a table and referred to by its index, so shared subtrees stay small and decode once.

    {"nodes": [["Var", "m"], ["Loc", "a.tl", 3, 1, 9], ["LetOp", {"@": 1}, "x", {"@": 0}], ...],
     "roots": {"program": {"@": 7}, "abi": {"@": 12}}}

A value is JSON's null, bool, int, float or string; a list for a tuple; `{"@": i}` for node `i`.
"""
from __future__ import annotations

import json
from dataclasses import fields
from typing import Any, Mapping

from tlc.diagnostics import Loc
from tlc.expr.nodes import BinOp, Call, Const, Index, Neg, Var
from tlc.kir.ops import OP_CLASSES
from tlc.lowering.abi import LaunchABI, TensorArg

_DATA_CLASSES: tuple[type, ...] = (*OP_CLASSES.values(), Const, Var, BinOp, Neg, Call, Index, Loc, LaunchABI,
                                   TensorArg)
ALLOWED: dict[str, type] = {cls.__name__: cls for cls in _DATA_CLASSES}
_FIELDS: dict[type, tuple[str, ...]] = {cls: tuple(f.name for f in fields(cls)) for cls in _DATA_CLASSES}
_SCALARS = (type(None), bool, int, float, str)


class CodecError(ValueError):
    """The data is not something `encode` writes: the reader treats the entry as a miss."""


def encode(roots: Mapping[str, Any]) -> dict:
    """JSON-ready data for `roots` (name → allow-listed node); CodecError for any other value."""
    encoder = _Encoder()
    return {"nodes": encoder.nodes, "roots": {name: encoder.value(v) for name, v in roots.items()}}


def decode(data: Any) -> dict[str, Any]:
    """The roots `encode` wrote; CodecError for anything else (unknown class, wrong arity, a
    reference to a node not yet defined, a field value the constructor refuses)."""
    if not isinstance(data, dict) or set(data) != {"nodes", "roots"}:
        raise CodecError("not an encoded kernel IR")
    nodes, roots = data["nodes"], data["roots"]
    if not isinstance(nodes, list) or not isinstance(roots, dict):
        raise CodecError("not an encoded kernel IR")
    table: list[Any] = []
    for entry in nodes:
        table.append(_node(entry, table))
    return {name: _value(v, table) for name, v in roots.items()}


class _Encoder:
    """Writes each distinct node once, children before parents, so decoding is one forward pass."""

    def __init__(self) -> None:
        self.nodes: list[list] = []
        self._by_id: dict[int, tuple[Any, int]] = {}  # id → (node, index): the node kept alive while encoding
        self._by_text: dict[str, int] = {}  # entries as JSON text: equal and of the same types (1 ≠ True ≠ 1.0)

    def value(self, v: Any) -> Any:
        kind = type(v)
        if kind in _SCALARS:
            return v
        if kind is tuple:
            return [self.value(x) for x in v]
        if ALLOWED.get(kind.__name__) is kind:
            return {"@": self._node(v)}
        raise CodecError(f"{kind.__name__} is not kernel-IR data")

    def _node(self, node: Any) -> int:
        seen = self._by_id.get(id(node))
        if seen is not None:
            return seen[1]
        entry = [type(node).__name__, *(self.value(getattr(node, name)) for name in _FIELDS[type(node)])]
        text = json.dumps(entry)
        index = self._by_text.get(text)
        if index is None:
            index = self._by_text[text] = len(self.nodes)
            self.nodes.append(entry)
        self._by_id[id(node)] = (node, index)
        return index


def _node(entry: Any, table: list[Any]) -> Any:
    if not isinstance(entry, list) or not entry or not isinstance(entry[0], str):
        raise CodecError("a node is not [class, fields...]")
    cls = ALLOWED.get(entry[0])
    if cls is None:
        raise CodecError(f"unknown class {entry[0]!r}")
    names = _FIELDS[cls]
    if len(entry) != len(names) + 1:
        raise CodecError(f"{entry[0]} takes {len(names)} fields")
    try:
        return cls(**{name: _value(v, table) for name, v in zip(names, entry[1:])})
    except CodecError:
        raise
    except Exception as exc:  # the class's own checks (Var names, BinOp operators, ...) refused the data
        raise CodecError(f"{entry[0]}: {exc}") from None


def _value(v: Any, table: list[Any]) -> Any:
    kind = type(v)
    if kind is list:
        return tuple(_value(x, table) for x in v)
    if kind is dict:
        ref = v.get("@")
        if len(v) != 1 or type(ref) is not int or not 0 <= ref < len(table):
            raise CodecError("a reference is not to an earlier node")
        return table[ref]
    if kind in _SCALARS:
        return v
    raise CodecError(f"{kind.__name__} is not kernel-IR data")
