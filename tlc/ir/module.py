"""A program of several kernels (tlc/frontend/kernels.py) as the TL IR holds it: one graph per kernel, in launch
order, and what each global tensor is to the program as a whole.

    input       no kernel stores it: the caller passes it
    workspace   a kernel stores it and a later kernel loads it: allocated by the launch (zeroed when it is
                added into), never returned
    output      stored and not loaded by a later kernel: returned, in the order of the Allocate lines

`run_module` is the interpreter of the whole program: the kernels run in order on one set of tensors.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from tlc.diagnostics import Loc, Note, fail
from tlc.ir.graph import Graph
from tlc.ir.ops import AllocateOp, CopyOp


@dataclass(frozen=True)
class Module:
    file: str
    kernels: tuple[tuple[str, Graph], ...]   # (kernel name, its TL graph), in launch order

    @property
    def graphs(self) -> tuple[Graph, ...]:
        return tuple(g for _, g in self.kernels)

    def allocations(self) -> dict[str, AllocateOp]:
        """Each global tensor's Allocate (the first kernel's that names it), in program order."""
        found: dict[str, tuple[tuple[int, int], AllocateOp]] = {}
        for g in self.graphs:
            for _, op in g.walk():
                if isinstance(op, AllocateOp) and op.space == "global":
                    key = (op.loc.line, op.loc.col) if op.loc is not None else (0, 0)
                    found.setdefault(op.name, (key, op))
        return {n: op for n, (_, op) in sorted(found.items(), key=lambda kv: kv[1][0])}

    def roles(self) -> dict[str, str]:
        """input | workspace | output for each global tensor, in program order; a tensor stored by two kernels, or
        loaded by a kernel before a later one stores it, is refused at the second store."""
        stored: dict[str, tuple[int, Loc | None]] = {}
        loaded: dict[str, list[int]] = {}
        for i, g in enumerate(self.graphs):
            here: dict[str, Loc | None] = {}
            for _, op in g.walk():
                if isinstance(op, CopyOp) and op.dst_space == "global":
                    here.setdefault(op.operands[1].base, op.loc)
                elif isinstance(op, CopyOp) and op.src_space == "global":
                    loaded.setdefault(op.operands[0].base, []).append(i)
            for name, loc in here.items():
                if name in stored:
                    first = stored[name]
                    raise fail(f"'{name}' is stored by kernel '{self.kernels[i][0]}' and by kernel "
                               f"'{self.kernels[first[0]][0]}' before it; a tensor is stored by one kernel",
                               loc, *([Note("stored here first", first[1])] if first[1] else []))
                if any(j < i for j in loaded.get(name, [])):
                    raise fail(f"'{name}' is stored by kernel '{self.kernels[i][0]}' after an earlier kernel loads "
                               "it: the earlier one would read what the caller passed; a tensor a kernel stores "
                               "is read only by later kernels", loc)
                stored[name] = (i, loc)
        out = {}
        for name in self.allocations():
            if name not in stored:
                out[name] = "input"
            else:
                out[name] = "workspace" if any(j > stored[name][0] for j in loaded.get(name, [])) else "output"
        return out


def run_module(module: Module, tensors: Mapping[str, torch.Tensor], scalars: Mapping[str, Any] | None = None,
               *, check_layouts: bool = False) -> dict[str, torch.Tensor]:
    """Interpret the kernels in order on float tensors (batch, heads, rows[, cols]): the workspaces and outputs
    must be passed in (poisoned, e.g. NaN; zero where they are added into); returns every tensor."""
    from tlc.ir.interpreter import run_program

    env = dict(tensors)
    for _, graph in module.kernels:
        names = {op.name for _, op in graph.walk() if isinstance(op, AllocateOp) and op.space == "global"}
        out = run_program(graph, {n: env[n] for n in names}, scalars, check_layouts=check_layouts)
        env.update(out)
    return env
