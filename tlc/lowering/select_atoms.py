"""`select-atoms`: TL graph (after the TL passes) → the attention kernel specialization.

Reads what the program says — which global tensors feed the two GEMMs, their tile
shapes, the element type, the causal mask and its alignment, a softcap written as
Computes on S, the KV-head offset — and fixes the target choices (MMA atom, warps,
stages) that the kernel-IR builder turns into TiledMMA / TiledCopy / shared layouts.
Programs outside the attention shape are refused with the reason and the line.
"""
from __future__ import annotations

from dataclasses import dataclass

from tlc.diagnostics import Loc, fail
from tlc.frontend.ast import ExprError, eval_expr
from tlc.ir.graph import Graph
from tlc.ir.ops import AllocateOp, CopyOp, ElementwiseOp, GemmOp, MaskOp, Op, ReshapeOp
from tlc.ir.types import Value

SM80_FAMILY = ("sm_80", "sm_86", "sm_89", "sm_90")
SUPPORTED_ARCHS = SM80_FAMILY


@dataclass(frozen=True)
class AttentionShape:
    """What the TL program specialises: the inputs of `FlashFwdConfig`."""

    dtype: str
    d_qk: int
    d_v: int
    bm: int
    bn: int
    warps: int
    stages: int
    causal: bool
    alignment: str
    softcap: bool
    kv_offset: str
    loc: Loc


def _source_global(graph: Graph, v: Value, seen: set[int] | None = None) -> AllocateOp | None:
    """Follow copies, reshapes and elementwise ops back to the global tensor a tile came from."""
    seen = seen or set()
    while v.uid not in seen:
        seen.add(v.uid)
        op = graph.producer(v)
        if isinstance(op, AllocateOp):
            return op if op.space == "global" else None
        if isinstance(op, (CopyOp, ReshapeOp)) and op.operands:
            v = op.operands[0]
            continue
        return None
    return None


def _load_tile(graph: Graph, v: Value) -> tuple[int, ...] | None:
    """The tile rows/cols of the global→shared copy that produced `v` (through hints)."""
    env = {k: val for k, val in graph.root().params.items() if isinstance(val, int) and not isinstance(val, bool)}
    while True:
        op = graph.producer(v)
        if isinstance(op, CopyOp) and op.src_space == "global" and op.tile:
            try:
                return tuple(int(eval_expr(d, env)) for d in op.tile)
            except ExprError:
                return None
        if isinstance(op, (CopyOp, ReshapeOp)) and op.operands:
            v = op.operands[0]
            continue
        return None


def _int_param(graph: Graph, name: str, default: int) -> int:
    v = graph.params.get(name, default)
    if not isinstance(v, int) or isinstance(v, bool):
        raise fail(f"Param {name} must be an integer, not {v!r}")
    return v


def select_attention(graph: Graph, arch: str) -> AttentionShape:
    if arch not in SUPPORTED_ARCHS:
        raise fail(f"unsupported --arch {arch}; the CuTe backend targets {', '.join(SUPPORTED_ARCHS)} "
                   "(the sm_80 family; the Hopper wgmma path is not built yet)")
    ops: list[tuple[Graph, Op]] = list(graph.walk())
    gemms = [(g, op) for g, op in ops if isinstance(op, GemmOp)]
    where = gemms[0][1].loc if gemms else Loc(graph.file, 1, 1)
    variant = str(graph.params.get("Variant", "attention"))
    if variant != "attention" or len(gemms) != 2 or not gemms[1][1].accumulate:
        raise fail(f"tlc build: the sm_80 backend lowers attention-shaped programs (S = Q·K.T, softmax, "
                   f"O += P·V); this one (Variant = {variant}, {len(gemms)} GEMMs) is not supported yet", where)
    (g1, qk), (g2, pv) = gemms
    q = _source_global(g1, qk.operands[0])
    k = _source_global(g1, qk.operands[1])
    v = _source_global(g2, pv.operands[1])
    if q is None or k is None or v is None:
        raise fail("tlc build: cannot trace the GEMM operands back to global tensors Q, K and V", qk.loc)
    env = {k_: val for k_, val in graph.params.items() if isinstance(val, int) and not isinstance(val, bool)}
    try:
        d_qk, d_v = int(eval_expr(q.shape[1], env)), int(eval_expr(v.shape[1], env))
    except ExprError as exc:
        raise fail(f"tlc build: head dims must be compile-time Params: {exc}", q.loc) from None
    q_tile, k_tile = _load_tile(g1, qk.operands[0]), _load_tile(g1, qk.operands[1])
    if not q_tile or not k_tile:
        raise fail("tlc build: Q and K must be loaded from global with tile shapes (BM, d) and (BN, d)", qk.loc)
    masks = [op for _, op in ops if isinstance(op, MaskOp) and op.kind == "causal"]
    aligns = {m.alignment for m in masks}
    if len(aligns) > 1:
        raise fail("tlc build: two causal masks with different alignments", masks[1].loc)
    softcap = any(isinstance(op, ElementwiseOp) and op.fn == "tanh" for _, op in ops)
    dtype = str(graph.params.get("dtype", "bf16"))
    return AttentionShape(dtype=dtype, d_qk=d_qk, d_v=d_v, bm=q_tile[0], bn=k_tile[0],
                          warps=_int_param(graph, "Warps", 4), stages=_int_param(graph, "Stages", 1),
                          causal=bool(masks), alignment=aligns.pop() if aligns else "top_left",
                          softcap=softcap, kv_offset=str(k.offset) if k.offset is not None else "head_idx",
                          loc=qk.loc)


def flash_config(shape: AttentionShape, name: str, lse: bool = False):
    """The backend's kernel-IR builder configuration for this specialization."""
    from tlc.kir.flash_fwd import FlashFwdConfig

    return FlashFwdConfig(dtype=shape.dtype, d_qk=shape.d_qk, d_v=shape.d_v, bm=shape.bm, bn=shape.bn,
                          warps=shape.warps, stages=shape.stages, causal=shape.causal, alignment=shape.alignment,
                          lse=lse, softcap=shape.softcap, name=name, loc=shape.loc)
