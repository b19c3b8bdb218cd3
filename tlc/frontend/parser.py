"""TL text → AST, with exact `file:line:col` diagnostics.

Each line is parsed on its own by the LALR grammar in `tl.lark`; loops are assembled
here from `for … end` and from `for … in …:` + indentation. Per-line parsing lets one
run report every bad line, keeps columns exact, and never recurses on deep nesting.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import UnexpectedEOF, UnexpectedInput, VisitError

from tlc.diagnostics import GLOBAL_SOURCES, Diagnostic, DiagnosticSink, Loc, Note, TlcError, error
from tlc.expr import ARITHMETIC, ExprBuilder
from tlc.expr.parse import load_with_expr, merge_builder
from tlc.frontend import ast as A
from tlc.frontend.names import MASK_POSITIONS, identifier_problem
from tlc.frontend.parse_hints import hint, unknown_operation_at
from tlc.frontend.predicate import operand_problem, predicate_problem
from tlc.lark_errors import visit_position
from tlc.numbers import problem, read_number, shown

MAX_SOURCE_BYTES = 1_000_000
MAX_ERRORS = 25
MAX_LOOP_DEPTH = 64  # deeper nesting is never a real kernel; the lowering and passes recurse per level
# Operators, calls and parentheses per line. Expressions are trees that lark's transformer,
# the AST helpers, the passes (which combine a few user expressions) and the emitters all
# recurse on, so bounding them here keeps every later layer far from Python's stack limit.
# A real kernel line has fewer than ten.
MAX_EXPR_OPERATORS = 64

@functools.lru_cache(maxsize=1)
def _lark() -> Lark:
    return load_with_expr(Path(__file__).with_name("tl.lark"), ("start", "expr"), maybe_placeholders=False)


# ------------------------------------------------------------------ line → statement


def _literal(tok) -> int | float:
    """A number as written in the program: ASCII digits (the grammar's `\\d` also matches other scripts'
    digits), an integer within 32 bits (the kernels' arithmetic), a float within float's range."""
    text = str(tok)
    try:
        value = read_number(text, "number")
    except TlcError as exc:
        raise _LineError(problem(exc), tok) from None
    if value is None:
        raise _LineError(f"'{shown(text)}' is not written in ASCII digits; write numbers with 0-9", tok)
    return value


class _TLExprs(ExprBuilder):
    """The TL subset of the expression language: `+ - * / %`, `cdiv`, `min`, `max` and names a
    TL program can declare. Whatever else the shared grammar reads is refused at its column. In a mask
    predicate (`predicate`) comparisons, `&&`, `||` and the positions `q_idx`, `kv_idx` are allowed too,
    each operator checked for numbers and conditions where it takes them (tlc.frontend.predicate)."""

    def __init__(self, predicate: bool = False, loads: bool = False):
        super().__init__()
        self.predicate = predicate
        self.loads = loads   # indexed reads of tensor Inputs: loop bounds, mask predicates, Allocate extents

    def number(self, items):
        return A.Num(_literal(items[0]))

    def var(self, items):
        tok = items[0]
        name = str(tok)
        if "." in name:
            dot = tok.column + name.index(".")
            raise _LineError(f"unexpected '{name[name.index('.'):]}': only '.T' (transpose) may follow a name",
                             tok, col=dot, end=tok.end_column)
        problem = "'_' stands for a whole mode in the kernel IR; rename it" if name == "_" else identifier_problem(name)
        if problem:
            raise _LineError(problem, tok)
        if name in MASK_POSITIONS and not self.predicate:
            raise _LineError(f"'{name}' is {MASK_POSITIONS[name]}: it has a value only in a mask predicate, "
                             f"'Compute Mask S where …'", tok)
        return super().var(items)

    def binop(self, items):
        op = items[1]
        if str(op) not in ARITHMETIC and not self.predicate:
            raise _LineError(f"'{op}' is not a TL operator; TL expressions use +, -, *, / and % (comparisons, && "
                             "and || only in a mask predicate, 'Compute Mask S where …')", op)
        self._operands(str(op), (items[0], items[2]), op)
        return super().binop(items)

    def neg(self, items):
        self._operands("-", (items[-1],), items[0])
        return super().neg(items)

    def call(self, items):
        problem = A.call_problem(str(items[0]), len(items) - 1)
        if problem:
            raise _LineError(problem, items[0])
        self._operands(str(items[0]), tuple(items[1:]), items[0])
        return super().call(items)

    def _operands(self, op: str, operands: tuple, token) -> None:
        problem = operand_problem(op, operands) if self.predicate else None
        if problem:
            raise _LineError(problem, token)

    def index(self, items):
        """`seqlens[batch_idx]`: an element of a tensor Input (what the name is, the lowering checks)."""
        if not self.loads:
            raise _LineError(f"'{items[0]}[…]' indexes: a TL expression reads an element of a tensor Input "
                             "('Input x : int32[…]') only in a loop bound, a mask predicate or a global "
                             "tensor's row extent, and never of a tile; name a tile's position with 'in coordinate [L = …]'", items[0])
        if any(isinstance(i, A.Var) and i.name == "_" for i in items[1:]):
            raise _LineError("'_' stands for a whole mode in the kernel IR; index each dimension", items[0])
        self.var(items[:1])
        return super().index(items)


def _transformer(file: str, lineno: int, line: str = "", predicate: bool = False, loads: bool = False) -> Transformer:
    return merge_builder(_ToAst(file, lineno, line), _TLExprs(predicate, loads))


class _ToAst(Transformer):
    """lark tree of one line → one `ast.Stmt`; positions become `Loc`s on `lineno`. Expressions
    are built by `_TLExprs`, merged in by `_transformer`."""

    def __init__(self, file: str, lineno: int, line: str = ""):
        super().__init__()
        self.file, self.lineno, self.line = file, lineno, line

    def _loc(self, meta_or_tok) -> Loc:
        col = getattr(meta_or_tok, "column", 0) or 0
        end = getattr(meta_or_tok, "end_column", col + 1) or col + 1
        return Loc(self.file, self.lineno, col, end)

    def number(self, items):
        return A.Num(_literal(items[0]))

    def shape(self, items):
        return tuple(items)

    def modes(self, items):
        return tuple(str(t) for t in items)

    def value(self, items):
        v = items[0]
        return v.value if isinstance(v, A.Num) else str(v)

    def as_dtype(self, items):
        return str(items[0])

    def offset(self, items):
        return ("offset", items[0])

    def rows_at(self, items):
        return ("rows_at", items[-1])

    def from_end(self, items):
        return "from_end"

    def coord_item(self, items):
        return (str(items[0]), items[1], len(items) > 2)

    def coord(self, items):
        return ("coord", tuple(items))

    def stats(self, items):
        return ("stats", str(items[0]), str(items[1]))

    def result(self, items):
        new = any(isinstance(t, Token) and t.type == "NEW" for t in items)
        name = items[-1]
        return ("result", str(name), new, self._loc(name))

    def operand(self, items):
        return A.Operand(str(items[0]), len(items) > 1, self._loc(items[0]))

    # statements (meta gives the whole line's span)
    @v_args(meta=True)
    def param(self, meta, items):
        value = items[1] if len(items) > 1 else None
        return A.ParamStmt(str(items[0]), value, loc=self._loc(meta))

    def dim_list(self, items):
        return (*items[0], items[1]) if len(items) == 2 else (items[0],)

    def input_dims(self, items):
        return tuple(items[0])

    def input_kind(self, items):
        return ("kind", str(items[0]), items[1] if len(items) > 1 else None)

    @v_args(meta=True)
    def input(self, meta, items):  # noqa: A003 - grammar rule name
        _, kind, dims = items.pop() if isinstance(items[-1], tuple) else ("kind", "int", None)
        return A.InputStmt(tuple(str(t) for t in items), kind, dims, loc=self._loc(meta))

    @v_args(meta=True)
    def allocate(self, meta, items):
        name, space, shape = items[0], items[1], items[2]
        dtype, offset, rows_at = None, None, None
        for extra in items[3:]:
            if isinstance(extra, tuple) and extra[:1] == ("offset",):
                offset = extra[1]
            elif isinstance(extra, tuple) and extra[:1] == ("rows_at",):
                rows_at = extra[1]
            else:
                dtype = extra
        return A.AllocateStmt(str(name), str(space), shape, dtype, offset, rows_at, name_loc=self._loc(name),
                              space_loc=self._loc(space), loc=self._loc(meta))

    def copy_add(self, items):
        return "add"

    @v_args(meta=True)
    def copy(self, meta, items):
        name = items[0]
        tile, coord = None, ()
        rest = list(items[1:])
        if rest and isinstance(rest[0], tuple) and rest[0][:1] != ("coord",):
            tile = rest.pop(0)
        ends: tuple[str, ...] = ()
        if rest and isinstance(rest[0], tuple) and rest[0][:1] == ("coord",):
            coord_items = rest.pop(0)[1]
            coord = tuple((k, e) for k, e, _ in coord_items)
            ends = tuple(k for k, _, end in coord_items if end)
        add = bool(rest) and rest[-1] == "add"
        src, dst = rest[:-1] if add else rest
        return A.CopyStmt(str(name), tile, coord, str(src), str(dst), from_end=ends, add=add, name_loc=self._loc(name),
                          src_loc=self._loc(src), dst_loc=self._loc(dst), loc=self._loc(meta))

    @v_args(meta=True)
    def gemm(self, meta, items):
        a, b, mode, out = items
        return A.GemmStmt(a, b, str(mode).lower() == "accumulate", str(out), out_loc=self._loc(out),
                          loc=self._loc(meta))

    @v_args(meta=True)
    def softmax(self, meta, items):
        x = items[0]
        mx = sm = out = None
        new = False
        for extra in items[1:]:
            if extra[0] == "stats":
                mx, sm = extra[1], extra[2]
            else:
                out, new = extra[1], extra[2]
        return A.SoftmaxStmt(str(x), mx, sm, out, new, x_loc=self._loc(x), loc=self._loc(meta))

    @v_args(meta=True)
    def mask(self, meta, items):
        x, align = items[0], items[1]
        out, new = (items[2][1], items[2][2]) if len(items) > 2 else (None, False)
        return A.MaskStmt(str(x), str(align), out, new, x_loc=self._loc(x), alignment_loc=self._loc(align),
                          loc=self._loc(meta))

    @v_args(meta=True)
    def mask_where(self, meta, items):
        x, where, predicate = items[0], items[1], items[2]
        out, new = (items[3][1], items[3][2]) if len(items) > 3 else (None, False)
        rest = self.line[where.end_pos:]
        col = where.end_column + len(rest) - len(rest.lstrip())
        result = _RESULT.search(self.line, where.end_pos)
        end = result.start() + 1 if result else len(self.line.rstrip()) + 1
        problem = predicate_problem(predicate)
        if problem:
            raise _LineError(problem, where, col=col, end=end)
        return A.MaskStmt(str(x), None, out, new, predicate=predicate, x_loc=self._loc(x),
                          predicate_loc=Loc(self.file, self.lineno, col, end), loc=self._loc(meta))

    @v_args(meta=True)
    def compute(self, meta, items):
        op = items[0]
        args = tuple(items[1:-1])
        _, out, new, _ = items[-1]
        return A.ComputeStmt(str(op), args, out, new, op_loc=self._loc(op), loc=self._loc(meta))

    @v_args(meta=True)
    def arg(self, meta, items):
        return A.Arg(items[0], self._loc(meta))

    @v_args(meta=True)
    def reshape(self, meta, items):
        x, src, dst = items[0], items[1], items[2]
        dtype = items[3] if len(items) > 3 else None
        return A.ReshapeStmt(str(x), src, dst, dtype, x_loc=self._loc(x), to_loc=self._loc(meta), loc=self._loc(meta))

    @v_args(meta=True)
    def for_eq(self, meta, items):
        return ("for", str(items[0]), items[1], items[2], False, self._loc(meta))

    @v_args(meta=True)
    def for_in(self, meta, items):
        return ("for", str(items[0]), items[1], items[2], True, self._loc(meta))

    def kernel_axis(self, items):
        return (str(items[0]), items[1])

    def kernel_axes(self, items):
        return ("axes", tuple(items))

    @v_args(meta=True)
    def kernel(self, meta, items):
        axes = items[1][1] if len(items) > 1 else ()
        return A.KernelStmt(str(items[0]), name_loc=self._loc(items[0]), axes=axes, loc=self._loc(meta))

    @v_args(meta=True)
    def end(self, meta, items):
        return ("end", self._loc(meta))

    def start(self, items):
        stmt = items[0]
        when = str(items[1]) if len(items) > 1 else None
        if when is not None:
            if isinstance(stmt, tuple):
                raise _LineError("'when' cannot guard a loop header or 'end'", items[1])
            stmt = replace(stmt, when=when)
        return stmt


_EXPR_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?"
                         r"|([-+*/%(]|&&|\|\||[<>]=?|[!=]=)")
_RESULT = re.compile(r"\s+and\s+get\b", re.IGNORECASE)   # where a mask predicate ends


def _too_long(text: str) -> tuple[str, int] | None:
    """(message, 1-based column) when `text` holds more operators than MAX_EXPR_OPERATORS."""
    ops = [m.start(1) for m in _EXPR_TOKEN.finditer(text) if m.group(1)]
    if len(ops) <= MAX_EXPR_OPERATORS:
        return None
    return (f"expression too long or too deep: {len(ops)} operators and parentheses on one line, at most "
            f"{MAX_EXPR_OPERATORS}; simplify it (write 'n * 500', not 500 '+ n' terms) or bind part of it "
            "to a Param", ops[MAX_EXPR_OPERATORS] + 1)


class _LineError(Exception):
    """A refusal from a transformer callback at `token` (or at columns `col`..`end` of its line)."""

    def __init__(self, message: str, token, *, col: int | None = None, end: int | None = None):
        super().__init__(message)
        self.token = token
        self.col = col if col is not None else getattr(token, "column", 1) or 1
        self.end = end if end is not None else getattr(token, "end_column", self.col + 1) or self.col + 1


def parse_expr(text: str) -> A.Expr:
    """One TL expression on its own (the launcher reads the ABI's head offsets with it)."""
    problem = _too_long(text)
    if problem:
        raise ValueError(problem[0])
    return _transformer("<expr>", 1).transform(_lark().parse(text, start="expr"))


def _parse_line(text: str, file: str, lineno: int):
    tree = _lark().parse(text, start="start")
    kind = getattr(tree.children[0], "data", None)
    predicate = kind == "mask_where"  # its one expression is the predicate
    loads = kind in ("mask_where", "for_eq", "for_in", "allocate")   # an Allocate's row extent: the lowering checks
    return _transformer(file, lineno, text, predicate, loads).transform(tree)


# ------------------------------------------------------------------ blocks


@dataclass
class _Block:
    var: str
    start: A.Expr
    stop: A.Expr
    indented: bool
    indent: int
    loc: Loc
    body: list = field(default_factory=list)
    body_indent: int | None = None
    broken: bool = False  # header failed to parse: already reported, stay quiet
    indent_chars: set[str] = field(default_factory=set)  # whitespace seen in an indented loop's lines


def _decode(data: bytes | str, file: str, sink: DiagnosticSink) -> str | None:
    if isinstance(data, str):
        text = data
    else:
        if len(data) > MAX_SOURCE_BYTES:
            sink.error(f"file is {len(data)} bytes; a TL program is at most {MAX_SOURCE_BYTES} bytes — "
                       "pass a TL source file, not data", Loc(file, 1, 1))
            return None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = data[: exc.start].count(b"\n") + 1
            col = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
            sink.error(f"byte 0x{data[exc.start]:02x} is not valid UTF-8; save the file as UTF-8 text",
                       Loc(file, line, col))
            return None
    if len(text) > MAX_SOURCE_BYTES:
        sink.error(f"source is {len(text)} characters; a TL program is at most {MAX_SOURCE_BYTES}", Loc(file, 1, 1))
        return None
    if "\x00" in text:
        idx = text.index("\x00")
        line = text.count("\n", 0, idx) + 1
        col = idx - (text.rfind("\n", 0, idx) + 1) + 1
        sink.error("NUL byte in the source; TL files are plain text", Loc(file, line, col))
        return None
    return text.lstrip("\ufeff")


def _strip_comment(line: str) -> str:
    idx = line.find("#")
    return (line if idx < 0 else line[:idx]).rstrip()


@dataclass
class Layout:
    """What the statements of a source leave out, for `tlc fmt` to put back: each line's comment (from
    its first `#`, trailing blanks dropped), the blank lines, and for each loop (keyed by its header's
    line) the line of the `end` that closed it; an indented loop closed by a dedent has none."""

    comments: dict[int, str] = field(default_factory=dict)
    blank: set[int] = field(default_factory=set)
    loop_ends: dict[int, int] = field(default_factory=dict)
    lines: int = 0


_INDENT_RE = re.compile(r"^[ \t]*")


def _check_indent_chars(stack: list[_Block], lead: str, loc: Loc, sink: DiagnosticSink) -> None:
    """In an indented loop the indentation decides the structure, and a tab's width is
    anyone's guess: its header and body lines must all use spaces, or all tabs."""
    outer = next((b for b in stack if b.indented), None)
    if outer is None or {" ", "\t"} <= outer.indent_chars:  # none, or already reported
        return
    before = set(outer.indent_chars)
    outer.indent_chars |= set(lead)
    if {" ", "\t"} <= outer.indent_chars:
        names = {" ": "spaces", "\t": "tabs"}
        where = (f": earlier lines of the loop at line {outer.loc.line} use {names[next(iter(before))]}, "
                 f"this one {names[lead[0]]}" if len(before) == 1 and len(set(lead)) == 1 else "")
        sink.error(f"indentation mixes tabs and spaces in an indented loop{where}; indent with spaces only", loc)


def parse_text(data: bytes | str, file: str = "<input>", layout: Layout | None = None) -> A.Program:
    """Parse TL source; raises `TlcError` with every syntax error found (up to MAX_ERRORS). A `layout`
    given is filled with the comments, blank lines and loop ends the program drops."""
    sink = DiagnosticSink()
    text = _decode(data, file, sink)
    if text is None:
        sink.raise_if_errors()
    assert text is not None
    GLOBAL_SOURCES.add(file, text)
    top: list = []
    stack: list[_Block] = []

    def body() -> list:
        return stack[-1].body if stack else top

    def close_top(end_line: int | None = None) -> None:
        blk = stack.pop()
        if layout is not None and end_line is not None:
            layout.loop_ends[blk.loc.line] = end_line
        stmt = A.ForStmt(blk.var, blk.start, blk.stop, tuple(blk.body), blk.indented, loc=blk.loc)
        body().append(stmt)

    for lineno, raw in enumerate(text.splitlines(), start=1):
        if len(sink.errors) >= MAX_ERRORS:
            sink.error(f"too many errors; stopping after {MAX_ERRORS}", Loc(file, lineno, 1))
            break
        line = _strip_comment(raw)
        if layout is not None:
            layout.lines = lineno
            if len(line) < len(raw.rstrip()):
                layout.comments[lineno] = raw.rstrip()[raw.index("#"):]
            elif not line.strip():
                layout.blank.add(lineno)
        if not line.strip():
            continue
        lead = _INDENT_RE.match(line).group(0)
        indent = len(lead.expandtabs(4))
        # dedent closes indentation-delimited loops
        while stack and stack[-1].indented and stack[-1].body_indent is not None and indent < stack[-1].body_indent:
            if indent > stack[-1].indent:
                sink.error(f"indentation does not match any enclosing block (loop at line {stack[-1].loc.line})",
                           Loc(file, lineno, 1, len(lead) + 1))
            close_top()
        if stack and stack[-1].indented and stack[-1].body_indent is None:
            if indent <= stack[-1].indent:
                if not stack[-1].broken:
                    sink.error(f"loop '{stack[-1].var}' has an empty body; indent its statements under the header",
                           stack[-1].loc)
                close_top()
            else:
                stack[-1].body_indent = indent
        _check_indent_chars(stack, lead, Loc(file, lineno, 1, len(lead) + 1), sink)
        problem = _too_long(line)
        if problem:
            sink.error(problem[0], Loc(file, lineno, problem[1], len(line) + 1))
            if line.strip().lower().startswith("for"):  # keep the block structure: its body still follows
                indented = line.rstrip().endswith(":")
                stack.append(_Block("?", A.Num(0), A.Num(0), indented, indent, Loc(file, lineno, 1), broken=True,
                                    indent_chars=set(lead)))
            continue
        try:
            item = _parse_line(line, file, lineno)
        except UnexpectedInput as exc:
            unknown = unknown_operation_at(line, file, lineno)
            if unknown is not None:  # `Compute Sofmax S`: name the word, not the grammar's wish list
                sink.error(*unknown)
                continue
            col = getattr(exc, "column", 0) or 0
            if isinstance(exc, UnexpectedEOF) or col <= 0:
                col = len(line) + 1
            sink.error(hint(line, exc), Loc(file, lineno, col, col + 1))
            if line.strip().lower().startswith("for") and line.rstrip().endswith(":"):
                stack.append(_Block("?", A.Num(0), A.Num(0), True, indent, Loc(file, lineno, 1), broken=True,
                                    indent_chars=set(lead)))
            continue
        except VisitError as exc:
            orig = exc.orig_exc
            unknown = unknown_operation_at(line, file, lineno)
            if unknown is not None:  # `Compute GEM Q, K.T`: the word, not what follows it
                sink.error(*unknown)
            elif isinstance(orig, _LineError):
                sink.error(str(orig), Loc(file, lineno, orig.col, orig.end))
            else:  # a node that refused to be built (`fail`), or a number Python cannot read
                message = orig.diagnostics[0].message if isinstance(orig, TlcError) else str(orig)
                sink.error(message, Loc(file, lineno, visit_position(exc)[1]))
            continue
        if isinstance(item, tuple) and item[0] == "for":
            _, var, start, stop, indented, loc = item
            too_deep = len(stack) >= MAX_LOOP_DEPTH
            if len(stack) == MAX_LOOP_DEPTH:
                sink.error(f"loops nest more than {MAX_LOOP_DEPTH} deep; flatten them", replace(loc, col=indent + 1))
            stack.append(_Block(var, start, stop, indented, indent, replace(loc, col=indent + 1), broken=too_deep,
                                indent_chars=set(lead)))
        elif isinstance(item, A.KernelStmt) and stack:
            sink.error(f"'Kernel {item.name}' inside loop '{stack[-1].var}': a kernel boundary stands at the top "
                       "level; close the loop first", item.loc)
        elif isinstance(item, tuple) and item[0] == "end":
            if not stack:
                sink.error("'end' without an open loop; remove it or add a 'for' header above", item[1])
            else:
                close_top(lineno)
        else:
            body().append(item)
    while stack:
        blk = stack[-1]
        if blk.broken:
            pass
        elif not blk.indented:
            sink.error(f"loop '{blk.var}' opened here is never closed; add 'end' after its body", blk.loc)
        elif blk.body_indent is None:
            sink.error(f"loop '{blk.var}' has an empty body; indent its statements under the header", blk.loc)
        close_top()
    if not top and not sink.errors:
        sink.error("the program is empty; a TL program needs at least one statement "
                   "(Allocate, Copy, Compute, …)", Loc(file, 1, 1))
    sink.raise_if_errors()
    return A.Program(file, tuple(top))


def parse_file(path: str | Path) -> A.Program:
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise TlcError(error(f"cannot read '{p}': {exc.strerror or exc}", Loc(str(p), 0, 0)))
    return parse_text(data, str(p))


def parse_with_layout(data: bytes | str, file: str = "<input>") -> tuple[A.Program, Layout]:
    """The program and what its source says besides statements (`tlc fmt` keeps both)."""
    layout = Layout()
    return parse_text(data, file, layout), layout


__all__ = ["Layout", "parse_text", "parse_with_layout", "parse_file", "Diagnostic", "Note"]
