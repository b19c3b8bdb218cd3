"""Statement-tree helpers for lowering: which names a loop body assigns (its carried
values), the declarations a sketch leaves out, and dropping carried values nothing reads."""
from __future__ import annotations

from dataclasses import replace

from tlc.diagnostics import Loc
from tlc.frontend import ast as A
from tlc.ir.graph import Graph
from tlc.ir.ops import LoopOp


def walk_statements(stmts):
    for s in stmts:
        yield s
        if isinstance(s, A.ForStmt):
            yield from walk_statements(s.body)


def sketch_prelude(stmts) -> list[A.Stmt]:
    """A sketch leaves Allocates out: declare (shapeless) the global tensors it copies from
    or stores to and the accumulators it accumulates into, so its structure can be checked."""
    allocated = {(s.name, s.space.lower()) for s in walk_statements(stmts) if isinstance(s, A.AllocateStmt)}
    wanted: dict[tuple[str, str], Loc] = {}
    for s in walk_statements(stmts):
        if isinstance(s, A.CopyStmt):
            for space in (s.src.lower(), s.dst.lower()):
                if space == "global":
                    wanted.setdefault((s.name, "global"), s.loc)
        elif isinstance(s, A.GemmStmt) and s.accumulate:
            wanted.setdefault((s.out, "register"), s.loc)
    return [A.AllocateStmt(name, space, (), loc=loc, name_loc=loc, space_loc=loc)
            for (name, space), loc in wanted.items() if (name, space) not in allocated]


def assigned_names(stmts) -> dict[str, set[str]]:
    """name → spaces that a loop body (recursively) assigns."""
    out: dict[str, set[str]] = {}

    def add(name: str | None, space: str) -> None:
        if name:
            out.setdefault(name, set()).add(space)

    for s in stmts:
        if isinstance(s, A.CopyStmt):
            add(s.name, s.dst.lower())
        elif isinstance(s, A.GemmStmt):
            add(s.out, "register")
        elif isinstance(s, A.ComputeStmt):
            add(s.out, "register")
        elif isinstance(s, (A.SoftmaxStmt, A.MaskStmt)):
            add(s.out or s.x, "register")
        elif isinstance(s, A.ReshapeStmt):
            add(s.x, "register")
        elif isinstance(s, A.ForStmt):
            for k, v in assigned_names(s.body).items():
                out.setdefault(k, set()).update(v)
    return out


def drop_dead_carried(graph: Graph) -> None:
    """Remove loop-carried values that nothing reads (a shared buffer refilled each trip)."""
    used = {v.uid for _, op in graph.walk() for v in op.operands}
    used |= {v.uid for _, op in graph.walk() if isinstance(op, LoopOp) for v in op.yields}
    for region, op in list(graph.walk()):
        if not isinstance(op, LoopOp):
            continue
        n = len(op.operands)
        keep = [i for i in range(n) if op.results[i].uid in used or op.args[i + 1].uid in used]
        if len(keep) == n:
            continue
        region.replace(op, replace(
            op, operands=tuple(op.operands[i] for i in keep),
            args=(op.args[0],) + tuple(op.args[i + 1] for i in keep),
            yields=tuple(op.yields[i] for i in keep) + op.yields[n:],
            results=tuple(op.results[i] for i in keep) + op.results[n:]))
