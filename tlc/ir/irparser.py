"""Canonical IR text → TL graph (the inverse of `tlc.ir.printer`).

Lets a pass test start from IR text rather than a `.tl` file, and makes
print → parse → print a checked invariant. Generic over ops: the mnemonic picks the
class from `OP_CLASSES`, attributes become its fields.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any

from tlc.diagnostics import Loc, TlcError, error
from tlc.frontend.ast import Name
from tlc.frontend.parser import parse_expr
from tlc.ir.graph import Graph
from tlc.ir.ops import OP_CLASSES, LoopOp
from tlc.ir.types import TileType, Value

_OP_LINE = re.compile(r"^(?:(?P<lhs>%[\w.]+(?:\s*,\s*%[\w.]+)*)\s*=\s*)?(?P<mn>[a-z_0-9]+)\((?P<ops>[^)]*)\)(?P<rest>.*)$")
_LOC = re.compile(r"\s+loc\((\d+):(\d+)\)\s*$")


def _split(text: str, sep: str = ",") -> list[str]:
    """Split at top-level separators (outside (), [], {}, backticks and quotes)."""
    parts, depth, cur, tick, quote = [], 0, [], False, False
    for ch in text:
        if ch == "`" and not quote:
            tick = not tick
        elif ch == '"' and not tick:
            quote = not quote
        elif not tick and not quote:
            if ch in "([{":
                depth += 1
            elif ch in ")]}":
                depth -= 1
            elif ch == sep and depth == 0:
                parts.append("".join(cur).strip())
                cur = []
                continue
        cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur).strip())
    return parts


def parse_type(text: str) -> TileType:
    text = text.strip()
    if text.startswith("scalar"):
        return TileType("scalar", (), text.split()[1] if len(text.split()) > 1 else None)
    m = re.match(r"^(\w+)\((.*)\)\s+(\S+)(?:\s+(\S+))?$", text)
    if not m:
        raise ValueError(f"bad type '{text}'")
    space, dims, dtype, role = m.groups()
    shape = None if dims.strip() == "?" else tuple(parse_expr(d) for d in _split(dims))
    return TileType(space, shape, None if dtype == "?" else dtype, role or "none")


def parse_attr(text: str) -> Any:
    text = text.strip()
    if text == "none":
        return None
    if text in ("true", "false"):
        return text == "true"
    if text.startswith("`") and text.endswith("`"):
        return parse_expr(text[1:-1])
    if text.startswith('"') and text.endswith('"'):
        return text[1:-1]
    if text.startswith("[") and text.endswith("]"):
        pairs = []
        for item in _split(text[1:-1]):
            key, _, expr = item.partition("=")
            pairs.append((key.strip(), parse_attr(expr)))
        return tuple(pairs)
    if text.startswith("(") and text.endswith(")"):
        return tuple(parse_attr(x) for x in _split(text[1:-1]))
    if re.fullmatch(r"-?(\d+\.\d*(e[-+]?\d+)?|\d+e[-+]?\d+|inf|nan)", text):
        return float(text)
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    return text


def _coerce(cls, attrs: dict[str, Any]) -> dict[str, Any]:
    """Names parsed inside tuples of mode names are strings, not expressions."""
    out = dict(attrs)
    for f in dataclasses.fields(cls):
        if f.name in out and "tuple[str" in str(f.type) and isinstance(out[f.name], tuple):
            out[f.name] = tuple(str(x) if isinstance(x, Name) else x for x in out[f.name])
        if f.name in out and str(f.type).startswith("float") and isinstance(out[f.name], int):
            out[f.name] = float(out[f.name])
    return out


class _IRParser:
    def __init__(self, text: str):
        self.lines = [ln.rstrip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("//")]
        self.pos = 0
        self.values: dict[str, Value] = {}
        self.file = "<ir>"

    def fail(self, msg: str) -> TlcError:
        return TlcError(error(f"IR line {self.pos + 1}: {msg}", Loc("<ir>", self.pos + 1, 1)))

    def value(self, ref: str) -> Value:
        name = ref.strip().lstrip("%")
        if name not in self.values:
            raise self.fail(f"%{name} is used before it is defined")
        return self.values[name]

    def define(self, ref: str, ty: TileType) -> Value:
        name = ref.strip().lstrip("%")
        v = Value(name, ty)
        self.values[name] = v
        return v

    def program(self) -> Graph:
        head = self.lines[0] if self.lines else ""
        m = re.match(r'^tl\.program "(.*)"$', head)
        if not m:
            raise self.fail('expected tl.program "FILE" first')
        g = Graph(m.group(1))
        self.file = g.file
        self.pos = 1
        while self.pos < len(self.lines):
            line = self.lines[self.pos].strip()
            if line.startswith("param "):
                key, _, val = line[6:].partition("=")
                g.params[key.strip()] = None if val.strip() == "?" else parse_attr(val.strip())
                self.pos += 1
            elif line.startswith("input "):
                key, _, kind = line[6:].partition(":")
                g.inputs[key.strip()] = kind.strip()
                self.pos += 1
            else:
                break
        self.region(g, top=True)
        return g

    def region(self, g: Graph, top: bool = False) -> list[Value]:
        while self.pos < len(self.lines):
            line = self.lines[self.pos].strip()
            if line.startswith("yield"):
                self.pos += 1
                return [self.value(x) for x in _split(line[5:])]
            self.op(g, line)
        if not top:
            raise self.fail("loop body ends without 'yield'")
        return []

    def op(self, g: Graph, line: str) -> None:
        loc = Loc(self.file, 0, 0)
        lm = _LOC.search(line)
        if lm:
            loc = Loc(self.file, int(lm.group(1)), int(lm.group(2)))
            line = line[: lm.start()]
        m = _OP_LINE.match(line)
        if not m:
            raise self.fail(f"cannot read op '{line[:60]}'")
        cls = OP_CLASSES.get(m.group("mn"))
        if cls is None:
            raise self.fail(f"unknown op '{m.group('mn')}'")
        operands = tuple(self.value(x) for x in _split(m.group("ops")))
        rest = m.group("rest").strip()
        attrs: dict[str, Any] = {}
        if rest.startswith("{"):
            end = _matching(rest, 0)
            for item in _split(rest[1:end]):
                key, _, val = item.partition("=")
                attrs[key.strip()] = parse_attr(val)
            rest = rest[end + 1 :].strip()
        kw = _coerce(cls, attrs)
        if cls is LoopOp:
            am = re.match(r"^\^\((.*)\)\s*\[$", rest)
            if not am:
                raise self.fail("a loop needs '^(args) [' then its body")
            args = []
            for item in _split(am.group(1)):
                ref, _, ty = item.partition(":")
                args.append(self.define(ref, parse_type(ty)))
            body = Graph(g.file, parent=g)
            self.pos += 1
            yields = self.region(body)
            closing = self.lines[self.pos].strip()
            self.pos += 1
            cm = _LOC.search(closing)
            if cm:
                loc = Loc(self.file, int(cm.group(1)), int(cm.group(2)))
                closing = closing[: cm.start()]
            types = closing.strip()[1:].strip()
            results = self.results(m.group("lhs"), types[1:] if types.startswith(":") else "")
            g.add(LoopOp(results, operands, body=body, args=tuple(args), yields=tuple(yields), loc=loc, **kw))
            return
        types = rest[1:] if rest.startswith(":") else ""
        results = self.results(m.group("lhs"), types)
        g.add(cls(results, operands, loc=loc, **kw))
        self.pos += 1

    def results(self, lhs: str | None, types: str) -> tuple[Value, ...]:
        refs = _split(lhs) if lhs else []
        tys = _split(types) if types.strip() else []
        if len(refs) != len(tys):
            raise self.fail(f"{len(refs)} results but {len(tys)} types")
        return tuple(self.define(r, parse_type(t)) for r, t in zip(refs, tys))


def _matching(text: str, start: int) -> int:
    depth, tick = 0, False
    for i in range(start, len(text)):
        ch = text[i]
        if ch == "`":
            tick = not tick
        elif not tick and ch == "{":
            depth += 1
        elif not tick and ch == "}":
            depth -= 1
            if depth == 0:
                return i
    raise ValueError("unbalanced braces")


def parse_ir(text: str) -> Graph:
    """Parse the printer's canonical form; raises TlcError naming the IR line."""
    try:
        return _IRParser(text).program()
    except TlcError:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise TlcError(error(f"malformed IR text: {exc}")) from None
