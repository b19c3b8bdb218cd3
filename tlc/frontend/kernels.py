"""Programs of several kernels: `Kernel NAME` lines cut a TL program into kernels that run one after another.

    Param …; Input …; Allocate X in global …        the prologue: shared by every kernel
    Kernel partial_a                                 a kernel: its statements, up to the next Kernel line
      …
    Kernel merge
      …

Each kernel is the prologue's Params, the Inputs and global Allocates it names, and its own statements: an
ordinary one-kernel program, lowered, checked and built as before (tlc/ir/module.py runs them in order). A
global tensor one kernel stores and a later one loads is a workspace (the launch allocates it between them); the
others are the program's inputs and outputs. A program without a Kernel line is one kernel, named by its file.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tlc.diagnostics import DiagnosticSink, Loc, Note
from tlc.expr import Expr, free_names
from tlc.frontend import ast as A
from tlc.frontend.names import identifier_problem

PROLOGUE = (A.ParamStmt, A.InputStmt)


@dataclass(frozen=True)
class KernelSection:
    """One kernel of a program: its name, where its Kernel line is (None: the program has none) and its
    statements as a one-kernel program (the prologue's Params, the Inputs and global Allocates it names)."""

    name: str
    loc: Loc | None
    program: A.Program


def has_kernels(program: A.Program) -> bool:
    return any(isinstance(s, A.KernelStmt) for s in program.body)


def _expr_names(value) -> set[str]:
    """The names a statement's expressions read (shapes, coordinates, bounds, arguments, predicates): the Inputs
    and Params it uses."""
    if isinstance(value, Expr):
        return set(free_names(value))
    if isinstance(value, (tuple, list)):
        return set().union(*(_expr_names(v) for v in value)) if value else set()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return set().union(*(_expr_names(getattr(value, f.name)) for f in dataclasses.fields(value)))
    return set()


def _global_copies(body) -> set[str]:
    """The tensors a kernel's statements copy from or to global memory: the global tensors it uses."""
    out: set[str] = set()
    for s in body:
        if isinstance(s, A.CopyStmt) and "global" in (s.src.lower(), s.dst.lower()):
            out.add(s.name)
        elif isinstance(s, A.ForStmt):
            out |= _global_copies(s.body)
    return out


def _global(s: A.Stmt) -> bool:
    return isinstance(s, A.AllocateStmt) and s.space.lower() == "global"


def split_kernels(program: A.Program) -> list[KernelSection]:
    """The kernels of `program`, in order; a program without a Kernel line is one kernel (name '')."""
    if not has_kernels(program):
        return [KernelSection("", None, program)]
    sink = DiagnosticSink()
    prologue: list[A.Stmt] = []
    sections: list[tuple[A.KernelStmt, list[A.Stmt]]] = []
    for s in program.body:
        if isinstance(s, A.KernelStmt):
            if s.when is not None:
                sink.error(f"'Kernel {s.name}' takes no 'when': a kernel runs whatever the Params; guard its "
                           "statements instead", s.loc)
            problem = identifier_problem(s.name)
            if problem:
                sink.error(problem, s.name_loc)
            first = next((k for k, _ in sections if k.name == s.name), None)
            if first is not None:
                sink.error(f"kernel '{s.name}' is named twice; name each kernel once", s.loc,
                           Note("first named here", first.loc))
            sections.append((s, []))
        elif sections:
            if isinstance(s, PROLOGUE) or _global(s):
                what = "a Param" if isinstance(s, A.ParamStmt) else "an Input" if isinstance(s, A.InputStmt) \
                    else "a global Allocate"
                sink.error(f"{what} belongs to the whole program: move it above the first Kernel line "
                           f"(line {sections[0][0].loc.line})", s.loc)
            sections[-1][1].append(s)
        elif isinstance(s, PROLOGUE) or _global(s):
            prologue.append(s)
        else:
            sink.error("this statement is in no kernel: above the first Kernel line a program holds only Params, "
                       f"Inputs and global Allocates; move it below a 'Kernel' line", s.loc)
    for k, body in sections:
        if not body:
            sink.error(f"kernel '{k.name}' has no statements; give it some or remove its Kernel line", k.loc)
    sink.raise_if_errors()
    out = []
    for k, body in sections:
        used = _global_copies(body)
        tensors = [s for s in prologue if _global(s) and s.name in used]
        named = _expr_names(tuple(body)) | _expr_names(tuple(tensors)) | _expr_names(tuple(e for _, e in k.axes))
        dims = {n: s.dims for s in prologue if isinstance(s, A.InputStmt) and s.dims for n in s.names}
        grown = True
        while grown:   # a tensor Input's dimensions may name other Inputs (`kv_lengths : int32[nb]`)
            more = set().union(*(_expr_names(dims[n]) for n in named if n in dims)) if named & dims.keys() else set()
            grown = not more <= named
            named |= more
        inputs = []
        for s in prologue:
            if isinstance(s, A.InputStmt):
                keep = tuple(n for n in s.names if n in named)
                if keep:
                    inputs.append(dataclasses.replace(s, names=keep))
        params = [s for s in prologue if isinstance(s, A.ParamStmt)]
        out.append(KernelSection(k.name, k.loc, A.Program(program.file, (*params, *inputs, *tensors, *body),
                                                          axes=k.axes, axes_loc=k.loc)))
    return out
