"""AST → canonical TL text (`tlc fmt`): parsing the output gives an equivalent program.

Canonical means: statement keywords capitalised as in the paper, `for … end` loops,
two-space indentation, explicit defaults left as written (nothing is invented).
"""
from __future__ import annotations

from tlc.frontend import ast as A


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _shape(dims) -> str:
    return "(" + ", ".join(str(d) for d in dims) + ")"


def format_stmt(s: A.Stmt) -> str:
    text = _stmt(s)
    return f"{text} when {s.when}" if s.when else text


def _result(out: str | None, new: bool) -> str:
    if out is None:
        return ""
    return f" and get {'new ' if new else ''}{out}"


def _stmt(s: A.Stmt) -> str:
    if isinstance(s, A.ParamStmt):
        return f"Param {s.name}" + ("" if s.value is None else f" = {_value(s.value)}")
    if isinstance(s, A.InputStmt):
        return f"Input {', '.join(s.names)} : {s.kind}"
    if isinstance(s, A.AllocateStmt):
        text = f"Allocate {s.name} in {s.space} {_shape(s.shape)}"
        if s.dtype:
            text += f" as {s.dtype}"
        if s.offset is not None:
            text += f" with offset {s.offset}"
        return text
    if isinstance(s, A.CopyStmt):
        text = f"Copy {s.name}"
        if s.tile is not None:
            text += f" {_shape(s.tile)}"
        if s.coord:
            text += " in coordinate [" + ", ".join(f"{k} = {e}{' from end' if k in s.from_end else ''}"
                                                   for k, e in s.coord) + "]"
        return f"{text} from {s.src} to {s.dst}"
    if isinstance(s, A.GemmStmt):
        mode = "accumulate" if s.accumulate else "get"
        return f"Compute GEMM {s.a}, {s.b} and {mode} {s.out}"
    if isinstance(s, A.SoftmaxStmt):
        stats = f" with max {s.max_name}, sum {s.sum_name}" if s.max_name else ""
        return f"Compute Softmax {s.x}{stats}{_result(s.out, s.new)}"
    if isinstance(s, A.MaskStmt):
        return f"Compute Mask {s.x} causal {s.alignment}{_result(s.out, s.new)}"
    if isinstance(s, A.ComputeStmt):
        return f"Compute {s.op} {', '.join(str(a) for a in s.args)}{_result(s.out, s.new)}"
    if isinstance(s, A.ReshapeStmt):
        text = f"Reshape {s.x} from ({', '.join(s.src_modes)}) to ({', '.join(s.dst_modes)})"
        return text + (f" as {s.dtype}" if s.dtype else "")
    raise TypeError(f"cannot format {type(s).__name__}")


def _lines(stmts, depth: int, out: list[str]) -> None:
    pad = "  " * depth
    for s in stmts:
        if isinstance(s, A.ForStmt):
            out.append(f"{pad}for {s.var} = {s.start}:{s.stop}")
            _lines(s.body, depth + 1, out)
            out.append(f"{pad}end")
        else:
            out.append(pad + format_stmt(s))


def format_program(program: A.Program) -> str:
    out: list[str] = []
    _lines(program.body, 0, out)
    return "\n".join(out) + "\n"
