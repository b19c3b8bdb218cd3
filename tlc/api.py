"""The Python entry points: check TL text, lower it, run the passes, interpret it.

Everything the CLI and the LLM workflow do goes through here, so both see the same
diagnostics. Nothing here raises anything but `TlcError` for bad input.
"""
from __future__ import annotations

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
                 defines: Mapping[str, str] | None = None) -> Graph:
    return lower_program(parse_text(text, filename), dict(defines or {}), sketch)


def compile_graph(text: str | bytes, filename: str = "<input>", *, sketch: bool = False,
                  defines: Mapping[str, str] | None = None, pipeline: str | None = None,
                  run_passes: bool = True, **pm_options: Any) -> tuple[Graph, list[Diagnostic]]:
    """Parse, lower and (unless a sketch) run the TL pipeline; returns graph and remarks."""
    graph = lower_source(text, filename, sketch=sketch, defines=defines)
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
        graph, remarks = compile_graph(text, filename, sketch=sketch, defines=defines, run_passes=run_passes)
    except TlcError as exc:
        return CheckResult(False, exc.diagnostics)
    checked = []
    if targets and run_passes and not sketch:
        from tlc.builder import check_targets

        data = text.encode() if isinstance(text, str) else text
        checked = check_targets(data, filename, dict(defines or {}), targets)
    ok = not checked or any(t.error is None for t in checked)
    return CheckResult(ok, remarks, format_program(program), graph, checked)


def check_file(path: str | Path, **kw: Any) -> CheckResult:
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        return CheckResult(False, [error(f"cannot read '{p}': {exc.strerror or exc}")])
    return check_source(data, str(p), **kw)
