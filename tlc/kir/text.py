"""Canonical text form of the kernel IR: `print_kir` and `parse_kir` (print → parse → print is stable).

One op per line: `OpName(field=value, ...) @"file.tl":line:col`; a field its class names in `quiet_defaults`
is left out while it holds its default (a MaskOp's `predicate=none`). Values: ints, floats, `true`/`false`,
`none`, bare identifiers or "quoted strings", `(tuples)`, `` `expressions` ``, and `[ops]` regions.
The reader is the LALR grammar in `kir.lark`; expressions go to `tlc.kir.expr.parse_expr`.
"""
from __future__ import annotations

import json
from dataclasses import fields, replace
from pathlib import Path

from lark import Token, Transformer
from lark.exceptions import UnexpectedInput, VisitError

from tlc.diagnostics import GLOBAL_SOURCES, Loc, TlcError, fail
from tlc.kir.expr import IDENT, Expr, parse_expr, print_expr
from tlc.kir.ops import OP_CLASSES, Op
from tlc.lark_errors import describe, load_grammar, visit_position

_INDENT = "  "
SOURCE = "<kir>"  # the file name parse errors are reported in


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
    quiet = getattr(op, "quiet_defaults", ())   # fields left out while they hold their default
    for f in fields(op):
        if f.name == "loc":
            continue
        value = getattr(op, f.name)
        if f.name in quiet and value == f.default:
            continue
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


# ------------------------------------------------------------------ text → ops (grammar in kir.lark)

_GRAMMAR = Path(__file__).with_name("kir.lark")
_WORDS = {"NAME": "a name", "NUMBER": "a number", "INT": "a number", "STRING": 'a "string"',
          "EXPR": "an `expression`", "$END": "the end of the text"}
_KEYWORD_VALUES = {"true": True, "false": False, "none": None}


def _where(token: Token) -> Loc:
    return Loc(SOURCE, token.line, token.column, token.end_column or token.column + 1)


def _string(token: Token) -> str:
    try:
        return json.loads(token)
    except ValueError as exc:
        raise fail(f"kernel IR: bad string {str(token)}: {exc.args[0].split(':')[0]}", _where(token)) from None


class _ToOps(Transformer):
    """lark tree → kernel-IR ops; each op class is checked against the fields the text gives it."""

    def string(self, items):
        return _string(items[0])

    def number(self, items):
        text = str(items[0])
        return float(text) if any(c in text for c in ".e") else int(text)

    def word(self, items):
        return _KEYWORD_VALUES.get(str(items[0]), str(items[0]))

    def expr(self, items):
        tok = items[0]
        return parse_expr(tok[1:-1], at=Loc(SOURCE, tok.line, tok.column + 1))

    def tuple(self, items):  # noqa: A003 - grammar rule name
        return tuple(items)

    region = tuple

    def field(self, items):
        return items[0], items[1]

    def loc(self, items):
        file, line, col = items
        return Loc(_string(file), int(line), int(col))

    def op(self, items):
        name, given = items[0], [item for item in items[1:] if isinstance(item, tuple)]
        cls = OP_CLASSES.get(str(name))
        if cls is None:
            raise fail(f"unknown kernel-IR op {str(name)!r}; the ops are {', '.join(sorted(OP_CLASSES))}",
                       _where(name))
        known = [f.name for f in fields(cls) if f.name != "loc"]
        kwargs = {}
        for key, value in given:
            if key not in known:
                has = f"its fields are {', '.join(known)}" if known else "it has none"
                raise fail(f"kernel IR: {name} has no field {str(key)!r}; {has}", _where(key))
            if key in kwargs:
                raise fail(f"kernel IR: {name} gives {str(key)!r} twice", _where(key))
            kwargs[str(key)] = value
        try:
            return cls(**kwargs, loc=items[-1] if isinstance(items[-1], Loc) else None)
        except TypeError as exc:
            raise fail(f"kernel IR: {name}: {exc}", _where(name)) from None


def _located(exc: VisitError) -> TlcError:
    """The TlcError a transformer callback raised, with a place if it had none."""
    orig = exc.orig_exc
    if not isinstance(orig, TlcError):
        raise orig
    line, col = visit_position(exc)
    return TlcError([d if d.loc is not None else replace(d, loc=Loc(SOURCE, line, col)) for d in orig.diagnostics])


def parse_kir(text: str) -> Op:
    """The printer's text back to ops; errors are `TlcError`s at `<kir>:line:col`."""
    parser = load_grammar(_GRAMMAR)
    try:
        return _ToOps().transform(parser.parse(text))
    except UnexpectedInput as exc:
        GLOBAL_SOURCES.add(SOURCE, text)
        message, line, col = describe(exc, text, parser, _WORDS, "the end of the text")
        if "$END" in (getattr(exc, "accepts", None) or ()):
            message = f"trailing text after the program: {message}"
        raise fail(f"kernel IR: {message}", Loc(SOURCE, line, col)) from None
    except VisitError as exc:
        GLOBAL_SOURCES.add(SOURCE, text)
        raise _located(exc) from None
    except RecursionError:
        raise fail("kernel IR: text nested too deeply to read", Loc(SOURCE, 1, 1)) from None
