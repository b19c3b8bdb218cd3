"""Canonical IR text → TL graph (the inverse of `tlc.ir.printer`).

Lets a pass test start from IR text rather than a `.tl` file, and makes print → parse → print
a checked invariant. The LALR grammar in `ir.lark` reads the text into op lines; `_Builder`
then resolves `%names` in order and builds the ops, generically: the mnemonic picks the class
from `OP_CLASSES`, attributes become its fields.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lark import Token, Transformer
from lark.exceptions import UnexpectedInput, VisitError

from tlc.diagnostics import GLOBAL_SOURCES, Loc, TlcError, error
from tlc.expr import Var
from tlc.ir.tensor_inputs import DTYPES as TENSOR_DTYPES
from tlc.ir.tensor_inputs import TensorInput
from tlc.expr.parse import OPERATORS, WORDS, load_with_expr, merge_builder
from tlc.ir.graph import Graph
from tlc.ir.ops import OP_CLASSES, LoopOp, Op
from tlc.ir.types import TileType, Value
from tlc.lark_errors import describe, visit_position

_GRAMMAR = Path(__file__).with_name("ir.lark")
SOURCE = "<ir>"  # the file name parse errors are reported in
_STARTS = ("start", "attr", "type")
_WORDS = {**WORDS, "_PROGRAM": 'tl.program "FILE"', "WORD": "a name", "INT": "a number", "REF": "a %value",
          "STRING": 'a "string"', "PARAM_VALUE": "a value", "QMARK": "'?'", "_NL": "a new line",
          "$END": "the end of the text"}
_STRUCTURAL = ("results", "operands", "loc", "body", "args", "yields")  # fields that are not attributes
_WORD_VALUES = {"none": None, "true": True, "false": False, "inf": float("inf"), "nan": float("nan")}


@dataclass
class _Body:
    args: list[tuple[Token, TileType]]
    ops: list[_Line]
    yields: list[Token]


@dataclass
class _Line:
    """One op line with its `%names` still unresolved."""

    results: list[Token]
    mnemonic: Token
    operands: list[Token]
    attrs: list[tuple[Token, Any]]
    body: _Body | None
    types: list[TileType]
    loc: tuple[int, int] | None


def _fail(token: Token, message: str) -> TlcError:
    return TlcError(error(message, Loc(SOURCE, token.line, token.column, token.end_column or token.column + 1)))


class _ToLines(Transformer):
    """lark tree → header entries and `_Line`s; expressions are built by `tlc.expr`'s builder,
    merged in by `_transform`."""

    # attributes
    def word(self, items):
        return _WORD_VALUES.get(str(items[0]), str(items[0]))

    def number(self, items):
        text = str(items[0])
        return float(text) if any(c in text for c in ".eE") else int(text)

    def negative(self, items):
        value = self.number(items) if items[0].type == "NUMBER" else self.word(items)
        return -value if isinstance(value, (int, float)) and not isinstance(value, bool) else f"-{items[0]}"

    def string(self, items):
        return str(items[0])[1:-1]

    def tuple(self, items):  # noqa: A003 - grammar rule name
        return tuple(items)

    def pairs(self, items):
        return tuple((str(key), value) for key, value in items)

    def attr_item(self, items):
        return items[0], items[1]

    def attrs(self, items):
        return list(items)

    # types
    def dims(self, items):
        return None if items and isinstance(items[0], Token) and items[0].type == "QMARK" else tuple(items)

    def dtype(self, items):
        return None if items[0].type == "QMARK" else str(items[0])

    def scalar_type(self, items):
        return TileType("scalar", (), items[0])

    def tile_type(self, items):
        space, shape, dtype, role = items
        return TileType(str(space), shape, dtype, str(role or "none"))

    def types(self, items):
        return list(items)

    # lines
    def refs(self, items):
        return list(items)

    def results(self, items):
        return items[0]

    def loc(self, items):
        return int(items[0]), int(items[1])

    def body_arg(self, items):
        return items[0], items[1]

    def body(self, items):
        *head, yields = items
        args = [item for item in head if isinstance(item, tuple)]
        return _Body(args, [item for item in head if isinstance(item, _Line)], yields or [])

    def op(self, items):
        results, mnemonic, operands, attrs, body, types, loc = items
        return _Line(results or [], mnemonic, operands or [], attrs or [], body, types or [], loc)

    def param(self, items):
        return "param", str(items[0]), _param_value(str(items[1]).strip())

    def input(self, items):  # noqa: A003 - grammar rule name
        return "input", str(items[0]), str(items[1])

    def tensor_input(self, items):
        if str(items[1]) not in TENSOR_DTYPES:
            raise _fail(items[1], f"a tensor input's element type is {' or '.join(TENSOR_DTYPES)}, not '{items[1]}'")
        return "tensor_input", str(items[0]), TensorInput(str(items[1]), tuple(items[2:]))

    def start(self, items):
        return items


def _grammar():
    return load_with_expr(_GRAMMAR, _STARTS)


def _transform(tree) -> Any:
    return merge_builder(_ToLines()).transform(tree)


def _param_value(text: str) -> Any:
    """`?` is an unset Param; a value the attribute syntax cannot read stays the printed text."""
    if text == "?":
        return None
    try:
        return _transform(_grammar().parse(text, start="attr"))
    except (UnexpectedInput, VisitError):
        return text


def _coerce(cls, attrs: dict[str, Any]) -> dict[str, Any]:
    """Names parsed inside tuples of mode names are strings, not expressions."""
    out = dict(attrs)
    for f in dataclasses.fields(cls):
        if f.name in out and "tuple[str" in str(f.type) and isinstance(out[f.name], tuple):
            out[f.name] = tuple(x.name if isinstance(x, Var) else x for x in out[f.name])
        if f.name in out and str(f.type).startswith("float") and isinstance(out[f.name], int):
            out[f.name] = float(out[f.name])
    return out


class _Builder:
    """`_Line`s → ops in a `Graph`, resolving each `%name` against those defined above it."""

    def __init__(self, file: str):
        self.file = file
        self.values: dict[str, Value] = {}

    def use(self, ref: Token) -> Value:
        name = str(ref)[1:]
        if name not in self.values:
            raise _fail(ref, f"%{name} is used before it is defined")
        return self.values[name]

    def define(self, ref: Token, ty: TileType) -> Value:
        value = Value(str(ref)[1:], ty)
        self.values[value.name] = value
        return value

    def region(self, graph: Graph, lines: list[_Line]) -> None:
        for line in lines:
            graph.add(self.op(graph, line))

    def op(self, graph: Graph, line: _Line) -> Op:
        mn = str(line.mnemonic)
        cls = OP_CLASSES.get(mn)
        if cls is None:
            raise _fail(line.mnemonic, f"unknown op '{mn}'; the ops are {', '.join(sorted(OP_CLASSES))}")
        operands = tuple(self.use(ref) for ref in line.operands)
        kw = _coerce(cls, self.attributes(cls, line))
        loc = Loc(self.file, *line.loc) if line.loc else Loc(self.file, 0, 0)
        if (cls is LoopOp) != (line.body is not None):
            raise _fail(line.mnemonic, "a loop needs '^(args) [' then its body" if cls is LoopOp
                        else f"only a loop has a body; '{mn}' has none")
        if line.body is not None:
            args = tuple(self.define(ref, ty) for ref, ty in line.body.args)
            body = Graph(graph.file, parent=graph)
            self.region(body, line.body.ops)
            kw.update(body=body, args=args, yields=tuple(self.use(ref) for ref in line.body.yields))
        if len(line.results) != len(line.types):
            raise _fail(line.mnemonic, f"{len(line.results)} results but {len(line.types)} types")
        results = tuple(self.define(ref, ty) for ref, ty in zip(line.results, line.types))
        try:
            return cls(results, operands, loc=loc, **kw)
        except (TypeError, ValueError) as exc:
            raise _fail(line.mnemonic, f"'{mn}': {exc}") from None

    def attributes(self, cls: type[Op], line: _Line) -> dict[str, Any]:
        known = [f.name for f in dataclasses.fields(cls) if f.name not in _STRUCTURAL]
        out: dict[str, Any] = {}
        for key, value in line.attrs:
            if key not in known:
                raise _fail(key, f"'{line.mnemonic}' has no attribute '{key}'; its attributes are {', '.join(known)}")
            if key in out:
                raise _fail(key, f"attribute '{key}' is given twice")
            out[str(key)] = value
        return out


def _build(file: str, entries: list) -> Graph:
    graph = Graph(file)
    builder = _Builder(file)
    for entry in entries:
        if isinstance(entry, tuple) and entry[0] == "param":
            graph.params[entry[1]] = entry[2]
        elif isinstance(entry, tuple) and entry[0] == "tensor_input":
            graph.tensor_inputs[entry[1]] = entry[2]
        elif isinstance(entry, tuple):
            graph.inputs[entry[1]] = entry[2]
    builder.region(graph, [entry for entry in entries if isinstance(entry, _Line)])
    return graph


def _parse(text: str, start: str) -> Any:
    """Parse and transform `text` from rule `start`; syntax errors become located diagnostics."""
    parser = _grammar()
    try:
        return _transform(parser.parse(text + "\n" if start == "start" else text, start=start))
    except UnexpectedInput as exc:
        GLOBAL_SOURCES.add(SOURCE, text)
        message, line, col = describe(exc, text, parser, _WORDS, "the end of the text", OPERATORS,
                                       frozenset({"PARAM_VALUE"}))
        raise TlcError(error(message, Loc(SOURCE, line, col))) from None
    except VisitError as exc:
        orig = exc.orig_exc
        if isinstance(orig, TlcError):  # the expression builder's refusal (an unknown function, …)
            message = orig.diagnostics[0].message
        elif isinstance(orig, (TypeError, ValueError)):
            message = f"malformed IR text: {orig}"
        else:
            raise orig from None
        GLOBAL_SOURCES.add(SOURCE, text)
        raise TlcError(error(message, Loc(SOURCE, *visit_position(exc)))) from None
    except RecursionError:
        raise TlcError(error("IR text nested too deeply to read", Loc(SOURCE, 1, 1))) from None


def parse_ir(text: str) -> Graph:
    """Parse the printer's canonical form; raises `TlcError` naming the line and column."""
    file, *entries = _parse(text, "start")
    try:
        return _build(str(file)[1:-1], entries)
    except TlcError:
        GLOBAL_SOURCES.add(SOURCE, text)
        raise


def parse_type(text: str) -> TileType:
    """`register(BM, BN) fp32 acc` → its `TileType`."""
    return _parse(text, "type")


def parse_attr(text: str) -> Any:
    """One attribute value as the printer writes it: `none`, `(BM, `HeadDim`)`, `[L = `n`]`, …"""
    return _parse(text, "attr")
