"""The pass interface: a frozen dataclass with a kebab-case `name` and `apply(ctx, graph)`.

Options are dataclass fields, written `insert-reshape{strict=true}` in a pipeline string.
Passes report through `ctx` (remarks and errors in the frontend's diagnostic format) and
rewrite only through the `Graph` methods, giving new ops the `loc` of what they replace.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from tlc.diagnostics import DiagnosticSink, Loc, Note
from tlc.ir.graph import Graph


@dataclass
class PassContext:
    """What passes share: diagnostics, the target (None before lowering) and the mode."""

    sink: DiagnosticSink = field(default_factory=DiagnosticSink)
    arch: str | None = None
    sketch: bool = False
    lowering: Any = None  # tlc.lowering.state.LoweringState once lower-tile-ops has run

    def remark(self, message: str, loc: Loc | None = None, *notes: Note) -> None:
        self.sink.remark(message, loc, *notes)

    def error(self, message: str, loc: Loc | None = None, *notes: Note) -> None:
        self.sink.error(message, loc, *notes)


@dataclass(frozen=True)
class Pass:
    name: ClassVar[str] = "pass"

    def apply(self, ctx: PassContext, graph: Graph) -> None:
        raise NotImplementedError
