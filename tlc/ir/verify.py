"""Structural verifier run between passes (`--verify-each`): every op's own `verify()`,
SSA (one definition per value, defined before use), loop shapes. Returns problems."""
from __future__ import annotations

from tlc.diagnostics import Loc
from tlc.ir.graph import Graph
from tlc.ir.ops import LoopOp


def verify_structure(graph: Graph) -> list[tuple[str, Loc | None]]:
    problems: list[tuple[str, Loc | None]] = []
    defined: set[int] = set()

    def region(g: Graph, visible: set[int]) -> None:
        seen = set(visible)
        for op in g.ops():
            for msg in op.verify():
                problems.append((msg, op.loc))
            for v in op.operands:
                if v.uid not in seen:
                    problems.append((f"'{op.mnemonic}' reads {v} before it is defined", op.loc))
            if isinstance(op, LoopOp) and op.body is not None:
                inner = seen | {a.uid for a in op.args}
                region(op.body, inner)
                body_defs = {r.uid for _, o in op.body.walk() for r in o.results} | inner
                for y in op.yields:
                    if y.uid not in body_defs:
                        problems.append((f"loop yields {y}, which is not defined in reach", op.loc))
            for r in op.results:
                if r.uid in defined:
                    problems.append((f"{r} is defined twice", op.loc))
                defined.add(r.uid)
                seen.add(r.uid)
            if isinstance(op, LoopOp):
                for a in op.args:
                    defined.add(a.uid)

    region(graph, set())
    return problems
