"""AST → canonical TL text (`tlc fmt`): parsing the output gives an equivalent program.

Canonical means: statement keywords capitalised as in the paper, `for … end` loops,
two-space indentation, explicit defaults left as written (nothing is invented). Given the
source's `Layout`, every comment (`# tlc-test:` lines too) stays beside or above its statement
and a run of blank lines between statements stays as one.
"""
from __future__ import annotations

from dataclasses import dataclass

from tlc.frontend import ast as A
from tlc.frontend.parser import Layout


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
        dims = "" if s.dims is None else f"[{', '.join(str(d) for d in s.dims)}]"
        return f"Input {', '.join(s.names)} : {s.kind}{dims}"
    if isinstance(s, A.AllocateStmt):
        text = f"Allocate {s.name} in {s.space} {_shape(s.shape)}"
        if s.dtype:
            text += f" as {s.dtype}"
        if s.offset is not None:
            text += f" with offset {s.offset}"
        if s.rows_at is not None:
            text += f" {'and' if s.offset is not None else 'with'} rows at {s.rows_at}"
        return text
    if isinstance(s, A.KernelStmt):
        axes = f" over [{', '.join(f'{n} = {e}' for n, e in s.axes)}]" if s.axes else ""
        return f"Kernel {s.name}{axes}"
    if isinstance(s, A.CopyStmt):
        text = f"Copy {s.name}"
        if s.tile is not None:
            text += f" {_shape(s.tile)}"
        if s.coord:
            text += " in coordinate [" + ", ".join(f"{k} = {e}{' from end' if k in s.from_end else ''}"
                                                   for k, e in s.coord) + "]"
        return f"{text} from {s.src} to {s.dst}" + (" and add" if s.add else "")
    if isinstance(s, A.GemmStmt):
        mode = "accumulate" if s.accumulate else "get"
        return f"Compute GEMM {s.a}, {s.b} and {mode} {s.out}"
    if isinstance(s, A.SoftmaxStmt):
        stats = f" with max {s.max_name}, sum {s.sum_name}" if s.max_name else ""
        return f"Compute Softmax {s.x}{stats}{_result(s.out, s.new)}"
    if isinstance(s, A.MaskStmt):
        how = f"where {s.predicate}" if s.predicate is not None else f"causal {s.alignment}"
        return f"Compute Mask {s.x} {how}{_result(s.out, s.new)}"
    if isinstance(s, A.ComputeStmt):
        return f"Compute {s.op} {', '.join(str(a) for a in s.args)}{_result(s.out, s.new)}"
    if isinstance(s, A.ReshapeStmt):
        text = f"Reshape {s.x} from ({', '.join(s.src_modes)}) to ({', '.join(s.dst_modes)})"
        return text + (f" as {s.dtype}" if s.dtype else "")
    raise TypeError(f"cannot format {type(s).__name__}")


@dataclass(frozen=True)
class _Line:
    """One output line: its text at `depth`, from source line `line` (None: an `end` the source does
    not write, closing an indented loop); comments above it are indented to `above`."""

    text: str
    depth: int
    line: int | None
    above: int


def _lines(stmts, depth: int, out: list[_Line], layout: Layout | None) -> None:
    for s in stmts:
        if isinstance(s, A.ForStmt):
            out.append(_Line(f"for {s.var} = {s.start}:{s.stop}", depth, s.loc.line, depth))
            _lines(s.body, depth + 1, out, layout)
            end = layout.loop_ends.get(s.loc.line) if layout is not None else None
            out.append(_Line("end", depth, end, depth + 1))  # a comment above `end` is the body's last
        else:
            out.append(_Line(format_stmt(s), depth, s.loc.line, depth))


def format_program(program: A.Program, layout: Layout | None = None) -> str:
    """The canonical text of `program`; with its source's `layout`, its comments and blank lines too."""
    lines: list[_Line] = []
    _lines(program.body, 0, lines, layout)
    if layout is None:
        return "\n".join("  " * ln.depth + ln.text for ln in lines) + "\n"
    out: list[str] = []
    done = 0  # source lines up to here are written
    for ln in lines:
        if ln.line is None:
            out.append("  " * ln.depth + ln.text)
            continue
        _between(layout, done, ln.line, "  " * ln.above, out)
        comment = layout.comments.get(ln.line)
        out.append("  " * ln.depth + ln.text + (f"  {comment}" if comment else ""))
        done = ln.line
    _between(layout, done, layout.lines + 1, "", out)
    while out and not out[-1]:
        out.pop()
    return "\n".join(out) + "\n"


def _between(layout: Layout, done: int, upto: int, pad: str, out: list[str]) -> None:
    """Source lines after `done` and before `upto`: each comment on a line of its own (a comment on a
    code line no statement owns, too, so none is lost), blank runs as one blank line, none first."""
    for n in range(done + 1, upto):
        if n in layout.comments:
            out.append(pad + layout.comments[n])
        elif n in layout.blank and out and out[-1]:
            out.append("")
