"""`infer-layouts`: shared-memory swizzles from how each tile is read (kernel IR).

A tile read by ldmatrix (plain or .trans) is stored as 8-row atoms of `cols` 16-byte chunks
under Swizzle<B,3,3>, B = log2(chunks per atom row), so the 8 rows one ldmatrix phase reads
fall in 8 different bank groups (checked with pycute in tests/lowering/test_layouts.py).
Tiles only staged for 16-byte stores get the same rule: their 16-byte row chunks then never
share a bank group either.
"""
from __future__ import annotations

import dataclasses

from tlc.kir import ops as K


def swizzle_for(atom_cols: int, elem_bytes: int) -> tuple[int, int, int]:
    chunks = min(atom_cols * elem_bytes // 16, 8)
    return (max(chunks.bit_length() - 1, 0), 3, 3)


def infer_layouts(kernel: K.KernelOp) -> tuple[K.KernelOp, list[str]]:
    elem = {op.layout: (4 if op.dtype == "fp32" else 2) for op in kernel.body if isinstance(op, K.SharedBufferOp)}
    notes, body = [], []
    for op in kernel.body:
        if isinstance(op, K.SmemLayoutOp) and op.swizzle == (0, 0, 0):
            sw = swizzle_for(op.atom[1], elem.get(op.name, 2))
            op = dataclasses.replace(op, swizzle=sw)
            notes.append(f"{op.name}: {op.atom[0]}×{op.atom[1]} atoms, Swizzle<{sw[0]},{sw[1]},{sw[2]}>")
        body.append(op)
    return dataclasses.replace(kernel, body=tuple(body)), notes
