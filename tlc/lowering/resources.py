"""Resource accounting for `check-resources`: shared bytes from the kernel IR's buffers and
layouts, and a per-thread register estimate from its fragments and TiledMMA.

The register model counts data only (no addresses, indices or predicates): fp32
accumulators and row vectors live across the KV loop ("resident"); each GEMM adds its
operand fragments for one k-block (two when its shared→register loads are prefetched).
Checked against measurements on the H200 (bench/README.md): d=128 BM=128 BN=64 4 warps
estimates 260 (ptxas: 255 + 48 bytes spilled); d=128 BN=32 estimates 228 (no spills).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from tlc.kir.expr import print_expr
from tlc.kir.ops import (ConvertOp, CopyOp, ForOp, FragmentOp, KernelOp, MmaOp, Op, RetileAccToAOp, RowVectorOp,
                         SharedBufferOp, SharedViewOp, SmemLayoutOp, SmemTransposeLayoutOp, TiledMmaOp, walk)
from tlc.kir.ops_sm90 import GmmaSmemLayoutOp, WgmmaFragmentOp, WgmmaOp, WgmmaTiledMmaOp

BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
_ROOT = re.compile(r"^[A-Za-z_]\w*")


@dataclass(frozen=True)
class Buffer:
    name: str
    offset: int
    bytes: int
    shape: tuple[int, ...]
    dtype: str
    reuses: str = ""


@dataclass(frozen=True)
class Fragment:
    name: str
    regs: int
    what: str          # "accumulator", "row vector", "A operand (1 k-block)", …
    resident: bool


def _by_name(kernel: KernelOp) -> dict[str, Op]:
    return {n: op for op in walk(kernel) for n in op.defined_names()}


def shared_buffers(kernel: KernelOp) -> list[Buffer]:
    """Each SharedBufferOp with its byte size; a buffer inside an earlier one's bytes reuses it."""
    table = _by_name(kernel)
    out: list[Buffer] = []
    for op in walk(kernel):
        if not isinstance(op, SharedBufferOp):
            continue
        layout = table.get(op.layout)
        shape = layout.shape if isinstance(layout, (SmemLayoutOp, SmemTransposeLayoutOp, GmmaSmemLayoutOp)) else ()
        size = math.prod(shape) * BYTES[op.dtype]
        reuses = next((b.name for b in out if b.offset <= op.offset_bytes < b.offset + b.bytes), "")
        out.append(Buffer(op.name, op.offset_bytes, size, shape, op.dtype, reuses))
    return out


def shared_extent(buffers: list[Buffer]) -> int:
    return max((b.offset + b.bytes for b in buffers), default=0)


def buffer_of(table: dict[str, Op], frag: FragmentOp) -> str | None:
    """The SharedBufferOp a fragment is shaped from (through views and slices)."""
    if frag.src is None:
        return None
    m = _ROOT.match(print_expr(frag.src))
    name = m.group(0) if m else None
    while name is not None and isinstance(table.get(name), SharedViewOp):
        name = table[name].of  # type: ignore[union-attr]
    return name if isinstance(table.get(name or ""), SharedBufferOp) else None


def register_fragments(kernel: KernelOp) -> tuple[list[Fragment], int, int]:
    """(fragments, resident registers, peak registers) per thread."""
    table = _by_name(kernel)
    threads = kernel.threads
    in_loop = {n for op in walk(kernel) if isinstance(op, ForOp) for c in walk(op) for n in c.defined_names()}

    def mma_of(name: str) -> TiledMmaOp:
        return table[name]  # type: ignore[return-value]

    def acc_regs(frag: FragmentOp | WgmmaFragmentOp) -> int:
        # a replicated TiledMMA spans fewer threads than the block: each thread holds its share of one copy
        dtype = getattr(frag, "dtype", "fp32")   # wgmma accumulators are fp32
        return math.prod(frag.shape) * BYTES[dtype] // 4 // min(threads, mma_of(frag.mma).threads)

    def rows_per_thread(frag: FragmentOp | WgmmaFragmentOp) -> int:
        mma = mma_of(frag.mma)
        if isinstance(mma, WgmmaTiledMmaOp):  # each warp group's 64 rows: 2 per thread, per 64-row atom
            return max(frag.shape[0] // (64 * mma.warp_groups[0]), 1) * 2
        # an m16 atom gives each thread 2 rows (groupID, groupID + 8)
        return max(frag.shape[0] // (16 * mma.warps[0]), 1) * 2

    def is_acc(op: Op) -> bool:
        return isinstance(op, (FragmentOp, WgmmaFragmentOp)) and op.role == "C"

    # A fragment only named as a row vector's layout holds no data (nvcc drops it).
    used = {n for op in walk(kernel) if not isinstance(op, (FragmentOp, WgmmaFragmentOp, RowVectorOp))
            and not op.regions for n in re.findall(r"[A-Za-z_]\w*", repr(op))}
    # An accumulator no MMA writes, only converted (overlap-gemms' `acc_S_like` → the carried P): its
    # fp32 registers die at the conversion; the converted fragments are what stays live.
    written: set[str] = set()
    converts: dict[str, list[ConvertOp]] = {}
    for op in walk(kernel):
        if isinstance(op, (MmaOp, WgmmaOp)):
            written.add(op.acc)
        elif isinstance(op, ConvertOp):
            converts.setdefault(op.src, []).append(op)
    frags: list[Fragment] = []
    resident = 0
    for op in walk(kernel):
        if is_acc(op) and op.name not in used:
            continue
        if is_acc(op) and op.name not in written and op.name in converts:
            for conv in converts[op.name]:
                regs, top = acc_regs(op) * BYTES[conv.dtype] // 4, conv.name not in in_loop
                frags.append(Fragment(conv.name, regs, "accumulator", top))
                resident += regs if top else 0
            continue
        if is_acc(op):
            top = op.name not in in_loop
            frags.append(Fragment(op.name, acc_regs(op), "accumulator", top))
            resident += acc_regs(op) if top else 0
        elif isinstance(op, RowVectorOp) and is_acc(table.get(op.like)):
            regs = rows_per_thread(table[op.like])  # type: ignore[arg-type]
            frags.append(Fragment(op.name, regs, "row vector", True))
            resident += regs

    peak = resident
    for loop in (op for op in walk(kernel) if isinstance(op, ForOp) and op.unroll):
        g = next((op for op in loop.body if isinstance(op, MmaOp)), None)
        acc = table.get(g.acc) if g is not None else None
        if not isinstance(acc, FragmentOp):
            continue
        mma = mma_of(g.mma)
        m, n = acc.shape
        kblocks = 2 if loop.prefetch else 1
        loaded = {getattr(table.get(c.copy), "kind", "") for c in walk(loop) if isinstance(c, CopyOp)}
        live = 0 if g.acc not in in_loop else acc_regs(acc)
        if "A" in loaded:
            live += kblocks * max(m // (16 * mma.warps[0]), 1) * 4   # 8 half-words per m16k16 atom
        else:
            live += _register_a(table, g.a, acc_regs)
        if "B" in loaded:
            live += kblocks * max(n // (8 * mma.warps[1]), 1) * 2    # 4 half-words per n8k16 atom
        peak = max(peak, resident + live)
    for g in (op for op in walk(kernel) if isinstance(op, WgmmaOp)):   # sm_90a: operands stay in shared memory
        acc = table.get(g.acc)
        if not isinstance(acc, WgmmaFragmentOp):
            continue
        live = (acc_regs(acc) if g.acc in in_loop else 0) + _register_a(table, print_expr(g.a), acc_regs)
        peak = max(peak, resident + live)
    return frags, resident, peak


def _register_a(table: dict[str, Op], name: str, acc_regs) -> int:
    """An A operand kept in registers (P): the converted accumulator it regroups."""
    op = table.get(name)
    if isinstance(op, RetileAccToAOp):
        op = table.get(op.src)
    if isinstance(op, ConvertOp):
        src = table.get(op.src)
        if isinstance(src, (FragmentOp, WgmmaFragmentOp)):
            return acc_regs(src) * BYTES[op.dtype] // 4
    return 0


def register_use(report) -> str:
    """What the estimate of a `ResourceReport` (tlc.lowering.state) holds, largest first: `128 for
    Allocate O in register, 64 for result of the GEMM at line 39, …, 48 for the GEMM's operand fragments`."""
    per_tile = max((a.bytes for a in report.regs if a.note != "resident"), default=0)
    operands = report.regs_peak - report.regs_resident - per_tile
    parts = [f"{a.bytes} for {a.tl}" for a in sorted(report.regs, key=lambda a: -a.bytes)]
    return ", ".join(parts + ([f"{operands} for the GEMM's operand fragments"] if operands > 0 else []))


def register_advice(kernel: KernelOp) -> str:
    """Which knob lowers the registers a thread needs: the accumulators are split over the warps that
    share the block's rows (tlc.lowering.warps), so more warps, a smaller BM or a smaller BN (the
    scores tile) each lower them; an sm_90a warp group always takes 64 rows."""
    table = _by_name(kernel)
    warps = kernel.threads // 32
    for g in walk(kernel):
        acc, mma = table.get(getattr(g, "acc", "")), table.get(getattr(g, "mma", ""))
        if isinstance(g, MmaOp) and isinstance(acc, FragmentOp) and isinstance(mma, TiledMmaOp):
            rows = acc.shape[0]
            if rows >= 32 * warps:   # twice the warps still give each warp whole 16-row atoms
                return (f"each of the {warps} warps computes {rows // mma.warps[0]} of the block's {rows} rows: "
                        f"Param Warps = {2 * warps} gives each {rows // (2 * warps)}, halving its accumulators' "
                        "registers; a smaller BM or BN lowers them too")
            break
    return "a smaller BM, BN or head dim lowers them (each warp's share of the accumulators)"
