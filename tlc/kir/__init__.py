"""Kernel IR: the target-specific level below the TL graph (docs/lowering.md), produced by `lower-tile-ops`
and rewritten by the scheduling passes, consumed by `tlc.backend_cute.emit` (one emitter handler per op class).

README for the TL → kernel-IR lowering author
=============================================
A program is `ProgramOp(name, body=(ParamsOp, KernelOp, ...))`: several kernels may share one
parameter struct (split-KV + combine). Ops are frozen dataclasses with keyword fields and `loc`
(the TL statement's `Loc`: becomes `#line N "file.tl"` in the CuTe source). Scalar math is an
`Expr` (`tlc.kir.expr`: `E("ceil_div(p.sk, 64) - 1")`; `p.<field>` reads the parameter struct,
`_` keeps a tensor mode, `t[i, _]` slices). Every name an op defines must be a C++ identifier.

Declarations
  ParamsOp(name, fields=((name, "ptr<bf16>"|"ptr<fp16>"|"ptr<f32>"|"ptr<i32>"|"i32"|"i64"|"f32"), ...))
  KernelOp(name, params, threads, min_blocks, grid=(Expr, Expr, Expr), smem_bytes, body)
  LetOp(name, type="i32"|"i64"|"f32"|"bool", value)                 scalar
Atoms and layouts (lower-tile-ops; swizzles from infer-layouts)
  TiledMmaOp(name, atom="SM80_16x8x16_F32BF16BF16F32_TN", warps=(M,N,K), tile=(M,N,K), thread_slice)
  SmemLayoutOp(name, swizzle=(B,M,S), atom=(rows, cols), shape=(rows, cols[, stages]))
  SmemTransposeLayoutOp(name, of, shape=(cols, rows[, stages]), strip_swizzle)   V read as Vᵀ
  TiledCopyOp(name, atom, dtype, kind="threads"|"A"|"B"|"C", thread_slice,
              thread_layout=(r, c), value_layout=(1, 8), mma)                  cp.async / ldmatrix(.trans) / R2S / S2G
Tensors
  SharedBufferOp(name, dtype, layout, offset_bytes)   SharedViewOp(name, of, layout)
  GlobalTensorOp(name, dtype, ptr, offset, rows, cols, row_stride)   GlobalTileOp(name, src, tile, coord)
  IdentityTileOp(name, shape)   PartitionOp(name, slice, method=partition_S|D|A|B|C|retile_S|D, src)
  FragmentOp(name, mma, role=A|B|C, dtype, src | shape)   RowVectorOp(name, like, init)
Memory effects (what pipeline decides: tokens make the order explicit)
  AsyncCopyOp(token, copy, src, dst, pred, row_limit)   rows ≥ row_limit are zero-filled
  CommitOp(name, tokens)   WaitOp(pending, groups)   BarrierOp()   CopyOp(copy, src, dst, pred, row_limit, kblock)
Fragment math
  ClearOp(target)   MmaOp(mma, acc, a, b, kblock)   one k-block of a GEMM (operands loaded by CopyOp ... kblock)
  MaskOp(target, coord, row0, col0, sq, sk, causal, alignment=top_left|bottom_right, bounds, predicate(q_idx, kv_idx))
  RowReduceOp(dst, src, kind=max|sum, accumulate)   AllReduceOp(target, kind, width)
  Exp2ScaleOp(target, row_max, scale_log2)          x = exp2(x·s − m·s), −inf rows → 0
  RowBroadcastOp(target, vec, fn(x, r))   MapOp(target, srcs, fn(x0, x1, ...))   e.g. softcap, ReLU
  ConvertOp(name, src, dtype)   RetileAccToAOp(name, src, mma)   RowStoreOp(dst, vec, coord, row_limit)
  FragStoreOp(dst, src, coord, row_limit, col_limit, row_first, add)
  FragLoadOp(dst, src, coord, row_limit, col_limit, row_first)   RowLoadOp(dst, src, coord, row_limit)
Control flow and schedule
  ForOp(var, start, stop, step, body, stages, prefetch, unroll)   IfOp(cond, body)
Profiling (trace-phases, Param Trace)
  TraceBufferOp(name, entries)   file-scope timestamps   TimestampOp(buffer, slot, slots, label)   (SM, clock) per warp group
Hopper, sm_90a (tlc/kir/ops_sm90.py, docs/hopper.md; the lowering produces the wgmma ops, not yet TMA or warp roles)
  TmaParamsOp Sm90KernelOp TmaDescriptorOp GmmaSmemLayoutOp MbarrierOp MbarrierInitOp
  MbarrierArriveExpectTxOp MbarrierArriveOp MbarrierWaitOp TmaPrefetchOp TmaPrefetchTileOp TmaLoadOp WgmmaTiledMmaOp WgmmaFragmentOp
  WgmmaFenceOperandOp WgmmaArriveOp WgmmaOp WgmmaCommitOp WgmmaWaitOp WarpSpecializeOp NamedBarrierOp

Effects
  Every op class declares, once, what it reads, writes and does (`declared_effects`, tlc/kir/effects.py:
  named tensors, shared buffers written by registers / cp.async / TMA, async tokens, and kinds such as
  barrier, wgmma, TMA); passes ask `op.effects()` or `nested_effects(op)` (with its regions' ops).

`tlc.lowering.tile_ops` produces it from a TL program, op by op; `tlc.kir.text.print_kir` /
`parse_kir` give the text form.
"""
from __future__ import annotations

from tlc.kir.ops import OP_CLASSES, Op, walk
from tlc.kir.text import parse_kir, print_kir

__all__ = ["OP_CLASSES", "Op", "parse_kir", "print_kir", "walk"]
