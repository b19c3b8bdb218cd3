"""Kernel-IR ops: one frozen dataclass per concept (docs/lowering.md).

The emitter has exactly one handler per class listed in `OP_CLASSES`. Every op carries the `loc`
of the TL statement it came from, so `#line` directives and late errors point at the user's `.tl`
line. Names that become C++ identifiers are checked by `verify()`; scalar math is an `Expr`.
Declarations live in `ops_decl`, executable ops in `ops_exec`; this module gathers them.
"""
from __future__ import annotations

from tlc.kir.base import (COPY_ATOMS, DTYPES, MMA_ATOMS, PARAM_TYPES, PARTITIONS, SCALAR_TYPES, Op,
                          names_defined, names_used, nested_effects, op_label, rewrite_ops, walk)
from tlc.kir.ops_decl import (FragmentOp, GlobalTensorOp, GlobalTileOp, IdentityTileOp, KernelOp, LaunchOp, LetOp, ParamsOp,
                              PartitionOp, ProgramOp, RowVectorOp, SharedBufferOp, SharedViewOp, SmemLayoutOp,
                              SmemTransposeLayoutOp, TiledCopyOp, TiledMmaOp, TraceBufferOp)
from tlc.kir.ops_exec import (AllReduceOp, AsyncCopyOp, BarrierOp, BreakOp, ClearOp, CommitOp, ConvertOp, CopyOp,
                              CounterAddOp, CounterOp, CounterSetOp, Exp2ScaleOp, ForOp, FragLoadOp, FragStoreOp, IfOp, MapOp, MaskOp, MmaOp, RetileAccToAOp,
                              RowBroadcastOp, RowLoadOp, RowReduceOp, RowStoreOp, TimestampOp, WaitOp, WarpAnyOp)
from tlc.kir.ops_sm90 import SM90_OP_CLASSES
from tlc.kir.ops_views import VIEW_OP_CLASSES

OP_CLASSES: dict[str, type[Op]] = {cls.__name__: cls for cls in (
    ProgramOp, ParamsOp, KernelOp, LetOp, TiledMmaOp, SmemLayoutOp, SmemTransposeLayoutOp, SharedBufferOp,
    SharedViewOp, GlobalTensorOp, GlobalTileOp, IdentityTileOp, TiledCopyOp, PartitionOp, FragmentOp,
    RowVectorOp, AsyncCopyOp, CommitOp, WaitOp, BarrierOp, CopyOp, ClearOp, MmaOp, MaskOp, RowReduceOp,
    AllReduceOp, Exp2ScaleOp, RowBroadcastOp, MapOp, ConvertOp, RetileAccToAOp, RowStoreOp, FragStoreOp, FragLoadOp, RowLoadOp, ForOp, IfOp,
    CounterOp, CounterAddOp, CounterSetOp, BreakOp, WarpAnyOp, TraceBufferOp, TimestampOp, LaunchOp,
    *SM90_OP_CLASSES,  # the Hopper path's ops (ops_sm90): TMA, mbarriers, wgmma, warp roles
    *VIEW_OP_CLASSES)}  # fold-partitions' flat views (ops_views)

__all__ = ["AllReduceOp", "AsyncCopyOp", "BarrierOp", "BreakOp", "ClearOp", "CommitOp", "ConvertOp", "CopyOp", "CounterAddOp",
           "CounterOp", "CounterSetOp", "Exp2ScaleOp", "ForOp", "FragLoadOp", "FragStoreOp", "FragmentOp", "MmaOp", "GlobalTensorOp", "GlobalTileOp",
           "IdentityTileOp", "IfOp", "KernelOp", "LaunchOp", "LetOp", "MapOp", "MaskOp", "ParamsOp", "PartitionOp",
           "ProgramOp", "RetileAccToAOp", "RowBroadcastOp", "RowLoadOp", "RowReduceOp", "RowStoreOp", "RowVectorOp",
           "SharedBufferOp", "SharedViewOp", "SmemLayoutOp", "SmemTransposeLayoutOp", "TiledCopyOp",
           "TiledMmaOp", "TimestampOp", "TraceBufferOp", "WaitOp", "WarpAnyOp", "COPY_ATOMS", "DTYPES", "MMA_ATOMS", "OP_CLASSES", "PARAM_TYPES",
           "PARTITIONS", "SCALAR_TYPES", "Op", "names_defined", "names_used", "nested_effects", "op_label", "rewrite_ops",
           "walk"]
