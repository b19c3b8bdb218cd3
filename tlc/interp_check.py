"""`tlc interp`: run a TL program on random inputs at small, odd sizes and compare with
an explicit float64 reference of its variant (`Param Variant`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch

from tlc.api import default_scalars
from tlc.diagnostics import TlcError, error
from tlc.ir.graph import Graph
from tlc.ir.interpreter import InterpError, run_program
from tlc.ir.ops import AllocateOp, CopyOp
from tlc.reference import reference_for

DEFAULT_SIZES = ((17, 33), (1, 1), (70, 9), (1, 65))


@dataclass
class InterpResult:
    seqlen_q: int
    seqlen_k: int
    max_rel_error: float
    where: tuple[int, int, int]


def _global_allocs(graph: Graph) -> dict[str, AllocateOp]:
    return {op.name: op for _, op in graph.walk() if isinstance(op, AllocateOp) and op.space == "global"}


def _stored(graph: Graph) -> set[str]:
    return {op.operands[1].base for _, op in graph.walk() if isinstance(op, CopyOp) and op.dst_space == "global"}


def make_tensors(graph: Graph, sq: int, sk: int, *, batch: int = 2, heads: int = 4, kv_heads: int = 2,
                 seed: int = 0) -> dict[str, torch.Tensor]:
    """Random float64 inputs (never zeros) and NaN-poisoned outputs for every global tensor."""
    gen = torch.Generator().manual_seed(seed)
    allocs, outputs = _global_allocs(graph), _stored(graph)
    env = {k: v for k, v in graph.params.items() if isinstance(v, int) and not isinstance(v, bool)}
    env.update(seqlen_q=sq, seqlen_k=sk)
    tensors = {}
    for name, op in allocs.items():
        rows, cols = (_eval(d, env, name) for d in op.shape)
        offset = "head_idx" if op.offset is None else str(op.offset)
        h = 1 if offset == "0" else kv_heads if "group" in offset else heads
        if name in outputs:
            tensors[name] = torch.full((batch, h, rows, cols), float("nan"), dtype=torch.float64)
        else:
            tensors[name] = torch.randn(batch, h, rows, cols, generator=gen, dtype=torch.float64)
    return tensors


def _eval(e, env, name) -> int:
    from tlc.frontend.ast import ExprError, eval_expr

    try:
        return int(eval_expr(e, env))
    except ExprError as exc:
        raise TlcError(error(f"cannot size global tensor '{name}' for interpretation: {exc}")) from None


def check_interpreter(graph: Graph, sizes: Iterable[tuple[int, int]] = DEFAULT_SIZES, seed: int = 0,
                      check_layouts: bool = False) -> list[InterpResult]:
    results = []
    for i, (sq, sk) in enumerate(sizes):
        tensors = make_tensors(graph, sq, sk, seed=seed + i)
        scalars = default_scalars(graph, tensors)
        try:
            out = run_program(graph, tensors, scalars, check_layouts=check_layouts)
            name, ref = reference_for(graph.params, tensors, scalars)
        except (InterpError, ValueError, KeyError) as exc:
            raise TlcError(error(f"interpretation failed at seqlen_q={sq}, seqlen_k={sk}: {exc}")) from None
        got = out[name]
        if torch.isnan(got).any():
            idx = torch.nonzero(torch.isnan(got))[0].tolist()
            results.append(InterpResult(sq, sk, float("inf"), tuple(idx[:3])))
            continue
        err = (got - ref).abs() / (ref.abs().max() + 1e-30)
        flat = int(torch.argmax(err))
        where = torch.unravel_index(torch.tensor(flat), err.shape)
        results.append(InterpResult(sq, sk, float(err.max()), tuple(int(w) for w in where[:3])))
    return results
