"""The Python entry points: check TL text, lower it, run the passes, interpret it.

Everything the CLI and the LLM workflow do goes through here, so both see the same
diagnostics. Nothing here raises anything but `TlcError` for bad input.
"""
from __future__ import annotations

import re

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from tlc.diagnostics import GLOBAL_SOURCES, Diagnostic, DiagnosticSink, TlcError, error
from tlc.frontend.format import format_program
from tlc.frontend.lower import lower_program
from tlc.frontend.parser import parse_text
from tlc.ir.graph import Graph

if TYPE_CHECKING:
    from tlc.builder import TargetCheck


@dataclass
class CheckResult:
    """`ok`: the TL checks pass and, when targets were asked for, at least one of them can build the
    program; `targets` says what each target's build would say short of NVRTC (tlc.builder.check_targets)."""

    ok: bool
    diagnostics: list[Diagnostic] = field(default_factory=list)
    formatted: str | None = None
    graph: Graph | None = None
    targets: list["TargetCheck"] = field(default_factory=list)

    @property
    def refused(self) -> list["TargetCheck"]:
        return [t for t in self.targets if t.error is not None]

    @property
    def rendered(self) -> str:
        return "\n".join(d.render(GLOBAL_SOURCES) for d in self.diagnostics)


def lower_source(text: str | bytes, filename: str = "<input>", *, sketch: bool = False,
                 defines: Mapping[str, str] | None = None, kernel: str | None = None) -> Graph:
    """The TL graph of a one-kernel program, or of kernel `kernel` of a program of several (`Kernel NAME`
    lines, tlc/frontend/kernels.py); a program of several without `kernel` is refused in one line."""
    return lower_program(kernel_program(parse_text(text, filename), kernel), dict(defines or {}), sketch)


def kernel_program(program, kernel: str | None):
    """`program` itself, or its kernel `kernel` as a one-kernel program."""
    from tlc.frontend.kernels import has_kernels, split_kernels

    if not has_kernels(program):
        if kernel:
            raise TlcError([error(f"{program.file}: the program has no 'Kernel {kernel}' line (it is one kernel)")])
        return program
    sections = split_kernels(program)
    names = ", ".join(k.name for k in sections)
    if kernel is None:
        raise TlcError([error(f"{program.file}: the program has {len(sections)} kernels ({names}); this command "
                              "takes a one-kernel program — `tlc check`, `tlc interp`, `tlc build` and tlc.build "
                              "take the whole program")])
    found = next((k for k in sections if k.name == kernel), None)
    if found is None:
        raise TlcError([error(f"{program.file}: no kernel '{kernel}'; its kernels are {names}")])
    return found.program


def kernel_names(text: str | bytes, filename: str = "<input>") -> list[str]:
    """The names of a program's kernels, in launch order; [] for a one-kernel program (no Kernel line)."""
    from tlc.frontend.kernels import has_kernels, split_kernels

    raw = text.decode("utf-8", errors="replace") if isinstance(text, (bytes, bytearray)) else text
    if not _KERNEL_LINE.search(raw):   # no line starts with `Kernel`: one kernel, no parse (a warm start's lookup)
        return []
    program = parse_text(text, filename)
    return [k.name for k in split_kernels(program)] if has_kernels(program) else []


_KERNEL_LINE = re.compile(r"^[ \t]*Kernel\b", re.MULTILINE)


def compile_module(text: str | bytes, filename: str = "<input>", *, defines: Mapping[str, str] | None = None,
                   run_passes: bool = True):
    """Every kernel of a program (one for a program without Kernel lines, named by its file), each lowered and
    through the TL pipeline; the module's tensor roles checked. Returns (tlc.ir.module.Module, remarks)."""
    from tlc.ir.module import Module
    from tlc.names import kernel_name

    names = kernel_names(text, filename)
    kernels, remarks = [], []
    for name in names or [None]:
        graph, said = compile_graph(text, filename, defines=defines, run_passes=run_passes, kernel=name)
        kernels.append((name or kernel_name(filename), graph))
        remarks += said
    module = Module(filename, tuple(kernels))
    module.roles()
    return module, remarks


def compile_graph(text: str | bytes, filename: str = "<input>", *, sketch: bool = False,
                  defines: Mapping[str, str] | None = None, pipeline: str | None = None,
                  run_passes: bool = True, kernel: str | None = None,
                  **pm_options: Any) -> tuple[Graph, list[Diagnostic]]:
    """Parse, lower and (unless a sketch) run the TL pipeline; returns graph and remarks. `kernel`: which
    kernel of a program of several."""
    graph = lower_source(text, filename, sketch=sketch, defines=defines, kernel=kernel)
    if sketch or not run_passes:
        return graph, []
    from tlc.passes.base import PassContext
    from tlc.passes.pipeline import run_pipeline

    ctx = PassContext(sink=DiagnosticSink(), sketch=sketch)
    run_pipeline(graph, pipeline, ctx=ctx, **pm_options)
    return graph, [d for d in ctx.sink.items if d.severity != "error"]


def check_source(text: str | bytes, filename: str = "<input>", *, sketch: bool = False,
                 defines: Mapping[str, str] | None = None, run_passes: bool = True,
                 targets: Sequence[str] = ()) -> CheckResult:
    """Diagnostics for TL text: errors (ok=False) or remarks such as an inserted Reshape. With `targets`
    (and the passes, not a sketch), each target's lowering and CuTe emission run too, as a build runs them."""
    try:
        program = parse_text(text, filename)
        names = kernel_names(text, filename)
        if names:   # several kernels: each checked as its own program, then the roles of the tensors
            module, remarks = compile_module(text, filename, defines=defines, run_passes=run_passes)
            graph = None
        else:
            graph, remarks = compile_graph(text, filename, sketch=sketch, defines=defines, run_passes=run_passes)
    except TlcError as exc:
        return CheckResult(False, exc.diagnostics)
    checked = []
    if targets and run_passes and not sketch:
        from tlc.builder import check_targets

        data = text.encode() if isinstance(text, str) else text
        checked = check_targets(data, filename, dict(defines or {}), targets, kernels=names)
    ok = not checked or any(t.error is None for t in checked)
    return CheckResult(ok, remarks, format_program(program), graph, checked)


def check_file(path: str | Path, **kw: Any) -> CheckResult:
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        return CheckResult(False, [error(f"cannot read '{p}': {exc.strerror or exc}")])
    return check_source(data, str(p), **kw)
