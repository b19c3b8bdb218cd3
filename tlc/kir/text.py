"""Canonical text form of the kernel IR: `print_kir` and `parse_kir` (print → parse → print is stable).

One op per line: `OpName(field=value, ...) @"file.tl":line:col`. Values: ints, floats, `true`/`false`,
`none`, bare identifiers or "quoted strings", `(tuples)`, `` `expressions` ``, and `[ops]` regions.
"""
from __future__ import annotations

import json
import re
from dataclasses import fields

from tlc.diagnostics import Loc, fail
from tlc.kir.expr import IDENT, Expr, parse_expr, print_expr
from tlc.kir.ops import OP_CLASSES, Op

_INDENT = "  "


def _value(v, depth: int) -> str:
    if isinstance(v, Op):
        return _op(v, depth)
    if isinstance(v, Expr):
        return f"`{print_expr(v)}`"
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return v if IDENT.match(v) and v not in ("true", "false", "none") else json.dumps(v)
    if isinstance(v, tuple):
        if v and all(isinstance(x, Op) for x in v):
            inner = "".join(f"{_INDENT * (depth + 1)}{_op(x, depth + 1)}\n" for x in v)
            return f"[\n{inner}{_INDENT * depth}]"
        return "(" + ", ".join(_value(x, depth) for x in v) + ("," if len(v) == 1 else "") + ")"
    raise fail(f"kernel IR: cannot print value {v!r}")


def _op(op: Op, depth: int) -> str:
    parts = []
    for f in fields(op):
        if f.name == "loc":
            continue
        value = getattr(op, f.name)
        if f.name in op.regions and not value:
            parts.append(f"{f.name}=[]")
        else:
            parts.append(f"{f.name}={_value(value, depth)}")
    text = f"{type(op).__name__}({', '.join(parts)})"
    if op.loc is not None:
        text += f" @{json.dumps(op.loc.file)}:{op.loc.line}:{op.loc.col}"
    return text


def print_kir(op: Op) -> str:
    return _op(op, 0) + "\n"


_TOKEN = re.compile(r'\s*(?:(?P<expr>`[^`]*`)|(?P<str>"(?:[^"\\]|\\.)*")|(?P<num>-?\d+\.\d*(?:e[+-]?\d+)?|-?\d+e[+-]?\d+|-?\d+)'
                    r'|(?P<name>[A-Za-z_]\w*)|(?P<punct>[()\[\],=@:]))')


class _Reader:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def _where(self) -> str:
        line = self.text.count("\n", 0, self.pos) + 1
        return f"kernel IR text line {line}"

    def next(self) -> tuple[str, str]:
        m = _TOKEN.match(self.text, self.pos)
        if not m:
            rest = self.text[self.pos:].strip()
            if not rest:
                return ("eof", "")
            raise fail(f"{self._where()}: cannot read {rest[:20]!r}")
        self.pos = m.end()
        return (m.lastgroup or "eof", m.group(m.lastgroup))

    def peek(self) -> tuple[str, str]:
        save = self.pos
        tok = self.next()
        self.pos = save
        return tok

    def expect(self, text: str) -> None:
        kind, tok = self.next()
        if tok != text:
            raise fail(f"{self._where()}: expected {text!r}, found {tok!r}")

    def value(self):
        kind, tok = self.next()
        if kind == "expr":
            return parse_expr(tok[1:-1])
        if kind == "str":
            return json.loads(tok)
        if kind == "num":
            return float(tok) if any(c in tok for c in ".e") else int(tok)
        if kind == "name":
            if self.peek()[1] == "(" and tok in OP_CLASSES:
                return self.op_body(tok)
            return {"true": True, "false": False, "none": None}.get(tok, tok)
        if tok == "(":
            items = []
            while self.peek()[1] != ")":
                items.append(self.value())
                if self.peek()[1] == ",":
                    self.next()
            self.next()
            return tuple(items)
        if tok == "[":
            ops = []
            while self.peek()[1] != "]":
                ops.append(self.op())
            self.next()
            return tuple(ops)
        raise fail(f"{self._where()}: unexpected {tok!r}")

    def op(self) -> Op:
        kind, name = self.next()
        if name not in OP_CLASSES:
            raise fail(f"{self._where()}: unknown kernel-IR op {name!r}")
        return self.op_body(name)

    def op_body(self, name: str) -> Op:
        cls = OP_CLASSES[name]
        self.expect("(")
        kwargs = {}
        while self.peek()[1] != ")":
            _, key = self.next()
            self.expect("=")
            kwargs[key] = self.value()
            if self.peek()[1] == ",":
                self.next()
        self.next()
        if self.peek()[1] == "@":
            self.next()
            _, file = self.next()
            self.expect(":")
            _, line = self.next()
            self.expect(":")
            _, col = self.next()
            kwargs["loc"] = Loc(json.loads(file), int(line), int(col))
        known = {f.name for f in fields(cls)}
        if unknown := set(kwargs) - known:
            raise fail(f"{self._where()}: {name} has no field {sorted(unknown)[0]!r}")
        try:
            return cls(**kwargs)
        except TypeError as exc:
            raise fail(f"{self._where()}: {name}: {exc}") from None


def parse_kir(text: str) -> Op:
    reader = _Reader(text)
    op = reader.op()
    if reader.peek()[0] != "eof":
        raise fail(f"{reader._where()}: trailing text after the program")
    return op
