"""Checks of a program of several kernels (tlc/ir/module.py) on the interpreter: its inputs drawn as a one-kernel
program's are (tlc.testing.checks), its workspaces and outputs NaN-poisoned (zero where added into), and its
outputs after the passes compared with the program as written (a program of several kernels has no Variant).
"""
from __future__ import annotations

import math

import torch

from tlc.diagnostics import TlcError
from tlc.expr import ExprError, eval_expr
from tlc.ir.interpreter import InterpError
from tlc.ir.module import Module, run_module
from tlc.testing.checks import (CheckResult, Shapes, SizingError, compare, program_info, random_tensor,
                                random_tensor_inputs)
from tlc.testing.checks import _param_env as param_env


def module_inputs(module: Module, shapes: Shapes, seed: int) -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors by name, scalars): every global tensor of the program (inputs random, the rest poisoned), the int
    and float Inputs from `shapes` and the tensor Inputs drawn as for a one-kernel program."""
    roles = module.roles()
    infos, added = {}, set()
    for g in module.graphs:
        for t in program_info(g).tensors:
            infos.setdefault(t.name, (t, g))
            if t.added:
                added.add(t.name)
    tensors = {}
    for i, name in enumerate(roles):
        t, g = infos[name]
        env = dict(param_env(g), **shapes.ints)
        try:
            dims = [int(eval_expr(d, env)) for d in t.dims]
        except ExprError as exc:
            raise SizingError(f"cannot size global tensor '{name}': {exc}") from None
        full = (shapes.batch, t.head_count(shapes, env), *dims)
        if roles[name] == "input":
            tensors[name] = random_tensor(full, seed * 1000 + i, torch.float64)
        else:
            tensors[name] = torch.zeros(full, dtype=torch.float64) if name in added else \
                torch.full(full, float("nan"), dtype=torch.float64)
    scalars: dict = dict(shapes.ints)
    scalars.update(shapes.floats)
    for g in module.graphs:
        for name, value in random_tensor_inputs(g, shapes, seed).items():
            scalars.setdefault(name, value)
    return tensors, scalars


def check_module(built: Module, as_written: Module, shapes: Shapes, seed: int = 0, *,
                 rtol: float = 1e-6) -> CheckResult:
    """`built` (after the TL passes) against `as_written` at `shapes`, on the same seeded inputs: every output
    equal within `rtol`, elements both leave unwritten (NaN) agreeing."""
    try:
        tensors, scalars = module_inputs(built, shapes, seed)
        got = run_module(built, tensors, scalars)
        want = run_module(as_written, tensors, scalars)
    except (InterpError, SizingError, TlcError, ValueError, KeyError, RuntimeError, IndexError, ExprError) as exc:
        return CheckResult(False, math.inf, None, f"{type(exc).__name__}: {exc}", shapes, seed)
    worst = CheckResult(True, 0.0, None, "", shapes, seed)
    outputs = [n for n, role in built.roles().items() if role == "output"]
    for name in outputs:
        g, w = got[name], want[name]
        if (torch.isnan(g) != torch.isnan(w)).any():
            return CheckResult(False, math.inf, None, f"output '{name}': written elements differ (NaN in one only)",
                               shapes, seed)
        both = ~torch.isnan(g)
        err, where = compare(torch.where(both, g, 0.0), torch.where(both, w, 0.0), rtol)
        if err > worst.max_error or err > rtol:
            worst = CheckResult(err <= rtol, err, where, f"output '{name}'" if len(outputs) > 1 else "", shapes, seed)
        if err > rtol:
            break
    return worst
