"""Copies and MMAs of a folded kernel as calls of their bare atoms (fold-partitions' last step):
a copy between views loops over the modes after mode 0 calling `Copy_Atom::call` (cute::copy's
inner calls, the first mode fastest) — or, for a universal copy between contiguous runs, plain
vector moves, which is what that call does — and an MMA on register fragments runs cute::gemm's
serpentine traversal of `MMA_Atom::call`, so NVRTC instantiates neither generic algorithm."""
from __future__ import annotations

import dataclasses
import math

from pycute import flatten

from tlc.kir import ops as K
from tlc.kir.expr import Index
from tlc.kir.ops_exec import kblock_slice
from tlc.kir.ops_views import (AtomAsyncCopyOp, AtomCopyOp, AtomMmaOp, CopyAtomOp, MmaAtomOp, RegisterFragmentOp,
                               RetileViewOp, ThreadViewOp, refine)
from tlc.layout.atoms import ELEMENT_BITS, copy_atom
from tlc.layout.kir_tensors import engine_mma
from tlc.layout.kir_views import copy_rest


def _atom_mma(op: K.MmaOp, mma: MmaAtomOp, acc: K.Op) -> AtomMmaOp | None:
    """cute::gemm's traversal for this atom: by its A and B register bytes per call (CuTe's dispatch)."""
    atom = engine_mma(mma).atom
    a_bytes, b_bytes = 2 * atom.a_tv[1].size(), 2 * atom.b_tv[1].size()  # bf16/fp16 operands
    order = {(8, 8): "m_outer", (8, 4): "m_outer", (4, 8): "n_outer"}.get((a_bytes, b_bytes))
    if order is None and (a_bytes, b_bytes) == (4, 4):
        return None  # CuTe's kinked serpentine: left to cute::gemm
    shape = acc.layout_shape
    m, n = (math.prod(flatten(s)) if isinstance(s, tuple) else s for s in shape[1:3])
    return refine(AtomMmaOp, op, m=m, n=n, n_outer=order != "m_outer")


def _first_run(view: K.Op) -> tuple[int, int] | None:
    """(extent, size) of a view's mode 0: its first leaf's extent where that leaf has stride 1
    (contiguous elements), and the mode's size; None otherwise."""
    shape, stride = view.layout_shape[0], view.layout_stride[0]
    leaves = list(zip(flatten(shape), flatten(stride))) if isinstance(shape, tuple) else [(shape, stride)]
    extent, step = leaves[0]
    if not (isinstance(step, int) and step == 1):
        return None
    return extent, math.prod(s for s, _ in leaves)


def _vector(op: K.CopyOp, atom: CopyAtomOp | None, views: dict) -> tuple[int, ...]:
    """(bits, values, moves) where a universal-copy atom's calls are plain contiguous moves, else ()."""
    found = copy_atom(atom.atom, atom.dtype) if atom is not None and atom.atom.startswith("UniversalCopy<") else None
    if found is None:
        return ()
    runs = []
    for e in (op.src, op.dst):
        base = e.base if isinstance(e, Index) else e
        view = views.get(getattr(base, "name", None))
        run = _first_run(view) if view is not None else None
        if run is None:
            return ()
        runs.append(run)
    values = found.values
    (a, size_a), (b, size_b) = runs
    if size_a != size_b or a % values or b % values or size_a % values:
        return ()
    return (values * ELEMENT_BITS[atom.dtype], values, size_a // values)


def atom_calls(body: tuple[K.Op, ...], atoms: dict[str, CopyAtomOp], mmas: dict) -> tuple[tuple[K.Op, ...], int]:
    """Copies by a bare atom between views: loops over the modes after mode 0 calling the atom
    (a universal copy's calls as plain moves where both sides are contiguous runs); MMAs by a bare
    atom on register fragments: cute::gemm's loops spelled out."""
    views = {op.name: op for top in body for op in K.walk(top)
             if isinstance(op, (ThreadViewOp, RetileViewOp, RegisterFragmentOp))}
    count = 0

    def rewrite(ops):
        nonlocal count
        out = []
        for op in ops:
            if type(op) is K.MmaOp and op.mma in mmas and op.acc in views:
                op = _atom_mma(op, mmas[op.mma], views[op.acc]) or op
                count += isinstance(op, AtomMmaOp)
            if type(op) in (K.CopyOp, K.AsyncCopyOp) and op.copy in atoms:
                kb = getattr(op, "kblock", None)
                src, dst = (kblock_slice(e, kb) if kb is not None else e for e in (op.src, op.dst))
                rest, rest_dst = copy_rest(src, views, False), copy_rest(dst, views, True)
                if rest is not None and rest == rest_dst and (op.col_limit is None or len(rest) == 2):
                    if type(op) is K.CopyOp:
                        op = refine(AtomCopyOp, op, rest=rest, vector=_vector(op, atoms[op.copy], views))
                    else:
                        op = refine(AtomAsyncCopyOp, op, rest=rest)
                    count += 1
            if op.regions:
                op = dataclasses.replace(op, **{r: rewrite(getattr(op, r)) for r in op.regions})
            out.append(op)
        return tuple(out)
    return rewrite(body), count
