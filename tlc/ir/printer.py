"""Canonical text form of the TL graph (parsed back by `tlc.ir.irparser`).

    tl.program "mha_fwd.tl"
    param BM = 128
    %S = gemm(%Q.1, %K.1) {trans_a = false, trans_b = true, accumulate = false} : register(BM, BN) fp32 acc  loc(14:3)

Generic syntax for every op, as MLIR's generic form: adding an op needs no printer code.
"""
from __future__ import annotations

from typing import Any

from tlc.expr import Expr
from tlc.ir.graph import Graph
from tlc.ir.ops import LoopOp, Op


def format_attr(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return repr(value) if isinstance(value, float) else str(value)
    if isinstance(value, Expr):
        return f"`{value}`"
    if isinstance(value, str):
        return value if value.replace("_", "a").isalnum() and not value[:1].isdigit() else f'"{value}"'
    if isinstance(value, tuple):
        if value and all(isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) for x in value):
            return "[" + ", ".join(f"{k} = `{e}`" for k, e in value) + "]"
        return "(" + ", ".join(format_attr(x) for x in value) + ")"
    raise TypeError(f"cannot print attribute {value!r}")


def _param_value(v: Any) -> str:
    if v is None:
        return "?"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


class Printer:
    def __init__(self, with_locs: bool = True):
        self.with_locs = with_locs
        self.lines: list[str] = []

    def program(self, g: Graph) -> str:
        self.lines = [f'tl.program "{g.file}"']
        for name, v in g.params.items():
            self.lines.append(f"param {name} = {_param_value(v)}")
        for name, kind in g.inputs.items():
            self.lines.append(f"input {name} : {kind}")
        for name, t in g.tensor_inputs.items():
            self.lines.append(f"input {name} : {t.dtype} [{', '.join(f'`{d}`' for d in t.dims)}]")
        self.region(g, 0)
        return "\n".join(self.lines) + "\n"

    def region(self, g: Graph, depth: int) -> None:
        for op in g.ops():
            self.op(op, depth)

    def op(self, op: Op, depth: int) -> None:
        pad = "  " * depth
        lhs = ", ".join(str(r) for r in op.results)
        attrs = ", ".join(f"{k} = {format_attr(v)}" for k, v in op.attrs().items())
        head = f"{lhs} = " if lhs else ""
        text = f"{pad}{head}{op.mnemonic}({', '.join(str(v) for v in op.operands)})"
        if attrs:
            text += f" {{{attrs}}}"
        if isinstance(op, LoopOp) and op.body is not None:
            args = ", ".join(f"{a} : {a.type}" for a in op.args)
            self.lines.append(f"{text} ^({args}) [")
            self.region(op.body, depth + 1)
            self.lines.append(f"{pad}  yield {', '.join(str(v) for v in op.yields)}")
            text = f"{pad}]"
        types = ", ".join(str(r.type) for r in op.results)
        if types:
            text += f" : {types}"
        if self.with_locs and op.loc.line > 0:
            text += f"  loc({op.loc.line}:{op.loc.col})"
        self.lines.append(text)


def print_graph(g: Graph, with_locs: bool = True) -> str:
    return Printer(with_locs).program(g)


def expr_text(e: Expr) -> str:
    return str(e)
