"""`select-atoms`: TL graph (after the TL passes) → the two-GEMM kernel specialization.

Reads what the program says — which global tensors feed the two GEMMs, their tile shapes, the
element type, and the program on the scores between the GEMMs: the TL ops on S (multiply by
`scale`, divide, tanh, relu, masks …), whether an online softmax follows, and whether O is divided
by its sum at the end — and fixes the target choices (MMA atom, warps, stages) that the kernel-IR
builder turns into TiledMMA / TiledCopy / shared layouts. Attention, attention with a softcap and a
back-to-back GEMM `relu(A·Bᵀ)·C` are all this shape. Anything else is refused with the reason and
the line.
"""
from __future__ import annotations

from dataclasses import dataclass

from tlc.diagnostics import Loc, fail
from tlc.frontend import ast as A
from tlc.frontend.ast import ExprError, eval_expr
from tlc.ir.graph import Graph
from tlc.ir.ops import (AllocateOp, CopyOp, ElementwiseOp, GemmOp, LoopOp, MaskOp, Op, ReshapeOp, RowReduceOp,
                        ScalarOp, ScaledExpOp, SoftmaxOp)
from tlc.ir.types import Value
from tlc.kir.score_ops import TLScoreOp

SM80_FAMILY = ("sm_80", "sm_86", "sm_89", "sm_90")
SUPPORTED_ARCHS = SM80_FAMILY
_COMMUTATIVE = ("mul", "add", "max", "min")


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
    kv_offset: str
    loc: Loc
    # The TL ops on S between GEMM1 and the softmax (or GEMM2), in program order.
    score_ops: tuple[TLScoreOp, ...] = ()
    softmax: bool = True
    normalize: bool = True
    # The online softmax's exp2 scale (log2 e folded in), an expression over runtime inputs.
    exp2_scale: str | None = None
    tensor_names: tuple[str, ...] = ("Q", "K", "V", "O")
    variant: str = "attention"

    @property
    def softcap(self) -> bool:
        """A tanh on the scores (kept for callers that ask; the kernel reads `score_ops`)."""
        return any(op.fn == "tanh" for op in self.score_ops)


def _source_global(graph: Graph, v: Value, seen: set[int] | None = None) -> AllocateOp | None:
    """Follow copies and reshapes back to the global tensor a tile came from."""
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
    env = _int_env(graph.root())
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


def _int_env(graph: Graph) -> dict[str, int]:
    return {k: v for k, v in graph.params.items() if isinstance(v, int) and not isinstance(v, bool)}


def _int_param(graph: Graph, name: str, default: int) -> int:
    v = graph.params.get(name, default)
    if not isinstance(v, int) or isinstance(v, bool):
        raise fail(f"Param {name} must be an integer, not {v!r}")
    return v


# ----------------------------------------------------------------------------- scalars
def _kir_scalar(graph: Graph, e: A.Expr, loc: Loc) -> str:
    """A TL scalar expression as kernel-IR text: Params substituted, runtime inputs kept by name."""
    from tlc.kir.expr import BinOp, Call, Const, Neg, Var

    def conv(x: A.Expr):
        if isinstance(x, A.Num):
            return Const(float(x.value))
        if isinstance(x, A.Name):
            value = graph.params.get(x.id)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return Const(float(value))
            if x.id in graph.inputs:
                return Var(x.id)
            raise fail(f"tlc build: '{x.id}' in a score expression is neither a numeric Param nor an Input", loc)
        if isinstance(x, A.Neg):
            return Neg(conv(x.operand))
        if isinstance(x, A.BinOp) and x.op in "+-*/":
            return BinOp(x.op, conv(x.lhs), conv(x.rhs))
        if isinstance(x, A.Call) and x.fn in ("min", "max") and len(x.args) == 2:
            return Call(x.fn, tuple(conv(a) for a in x.args))
        raise fail(f"tlc build: cannot use '{x}' as a scalar on the scores", loc)

    return str(conv(e))


def _scalar_of(graph: Graph, v: Value) -> A.Expr | None:
    op = graph.producer(v)
    return op.expr if isinstance(op, ScalarOp) and op.expr is not None else None


# ----------------------------------------------------------------------------- the score program
def _score_op(body: Graph, op: Op, s: Value) -> TLScoreOp:
    if isinstance(op, MaskOp):
        return TLScoreOp("mask", kind=op.kind, alignment=op.alignment, loc=op.loc)
    assert isinstance(op, ElementwiseOp)
    if len(op.operands) == 1:
        return TLScoreOp(op.fn, loc=op.loc)
    other = op.operands[1] if op.operands[0] is s else op.operands[0]
    if op.operands[0] is not s and op.fn not in _COMMUTATIVE:
        raise fail(f"tlc build: '{op.fn}' with the scores as its second operand is not supported; "
                   "write the scores first", op.loc)
    expr = _scalar_of(body, other)
    if expr is None:
        raise fail(f"tlc build: '{op.fn}' on the scores takes a scalar (a Param, an Input or a number), "
                   f"not the tile '{other.name}'", op.loc)
    return TLScoreOp(op.fn, _kir_scalar(body.root(), expr, op.loc), loc=op.loc)


def _score_chain(body: Graph, gemm1: GemmOp, gemm2: GemmOp) -> tuple[list[TLScoreOp], ScaledExpOp | None]:
    """Walk S = GEMM1's result through its single-use chain of elementwise ops and masks, up to
    the online softmax (a scaled_exp2 of S feeding the Reshape) or the Reshape into GEMM2."""
    ops: list[TLScoreOp] = []
    s = gemm1.result
    while True:
        users = body.users(s)
        if any(isinstance(u, SoftmaxOp) for u in users):
            raise fail("tlc build: Softmax is still implicit; lower the graph with the TL passes "
                       "(online-softmax) before select-atoms", gemm1.loc)
        exp = [u for u in users if isinstance(u, ScaledExpOp) and u.operands[0] is s]
        if exp:
            if not any(isinstance(u, RowReduceOp) and u.fn == "max" for u in users):
                raise fail("tlc build: the scores' exp2 has no running row max (not an online softmax)", exp[0].loc)
            _expect_reshape_into(body, exp[0].result, gemm2, exp[0].loc)
            return ops, exp[0]
        reshape = [u for u in users if isinstance(u, ReshapeOp)]
        if reshape and len(users) == 1:
            _expect_reshape_into(body, s, gemm2, reshape[0].loc)
            return ops, None
        nexts = [u for u in users if isinstance(u, (ElementwiseOp, MaskOp)) and any(v is s for v in u.operands)]
        if len(users) != 1 or len(nexts) != 1:
            what = ", ".join(f"'{u.mnemonic}'" for u in users) or "nothing"
            raise fail(f"tlc build: the scores '{s.name}' feed {what}; the sm_80 backend lowers one chain of "
                       "elementwise ops and masks from the first GEMM to a softmax or a Reshape into the second",
                       users[0].loc if users else gemm1.loc)
        ops.append(_score_op(body, nexts[0], s))
        s = nexts[0].result


def _expect_reshape_into(body: Graph, p: Value, gemm2: GemmOp, loc: Loc) -> None:
    users = body.users(p)
    ok = [u for u in users if isinstance(u, ReshapeOp) and gemm2.operands[0] is u.result]
    if not ok:
        raise fail("tlc build: the scores must reach the second GEMM's A operand through one Reshape "
                   "to (MMA_A, MMA_M, MMA_N)", loc)


def _normalize(graph: Graph, loop: LoopOp) -> bool:
    """Whether O is divided by the softmax sum after the loop; any other compute there is refused."""
    divide = False
    for op in graph.ops():
        if isinstance(op, ElementwiseOp):
            if op.fn == "div" and any(op.operands[0] is r for r in loop.results):
                divide = True
                continue
            raise fail(f"tlc build: '{op.fn}' after the loop is not supported (only the division of O by "
                       "the softmax sum)", op.loc)
    return divide


# ----------------------------------------------------------------------------- select
def select_attention(graph: Graph, arch: str) -> AttentionShape:
    if arch not in SUPPORTED_ARCHS:
        raise fail(f"unsupported --arch {arch}; the CuTe backend targets {', '.join(SUPPORTED_ARCHS)} "
                   "(the sm_80 family; the Hopper wgmma path is not built yet)")
    ops: list[tuple[Graph, Op]] = list(graph.walk())
    gemms = [(g, op) for g, op in ops if isinstance(op, GemmOp)]
    loops = [op for op in graph.ops() if isinstance(op, LoopOp)]
    where = gemms[0][1].loc if gemms else Loc(graph.file, 1, 1)
    variant = str(graph.params.get("Variant", "attention"))
    shape_ok = (len(gemms) == 2 and len(loops) == 1 and gemms[0][0] is gemms[1][0] is loops[0].body
                and not gemms[0][1].accumulate and gemms[1][1].accumulate)
    if not shape_ok:
        raise fail(f"tlc build: the sm_80 backend lowers two-GEMM programs (S = A·B.T, elementwise ops on S, "
                   f"an optional softmax, O += P·C in one loop); this one (Variant = {variant}, {len(gemms)} "
                   "GEMMs) is not of that shape", where)
    (body, qk), (_, pv) = gemms
    q = _source_global(body, qk.operands[0])
    k = _source_global(body, qk.operands[1])
    v = _source_global(body, pv.operands[1])
    if q is None or k is None or v is None:
        raise fail("tlc build: cannot trace the GEMM operands back to global tensors", qk.loc)
    for gemm, want in ((qk, ("k", "k")), (pv, ("k", "mn"))):
        got = (gemm.a_major or want[0], gemm.b_major or want[1])
        if got != want:
            raise fail(f"tlc build: operand layouts {got} of this GEMM are not supported yet (the kernel reads "
                       f"A and B.T of the first GEMM k-major and the second GEMM's B as stored, like V)", gemm.loc)
    env = _int_env(graph)
    try:
        d_qk, d_v = int(eval_expr(q.shape[1], env)), int(eval_expr(v.shape[1], env))
    except ExprError as exc:
        raise fail(f"tlc build: head dims must be compile-time Params: {exc}", q.loc) from None
    q_tile, k_tile = _load_tile(body, qk.operands[0]), _load_tile(body, qk.operands[1])
    if not q_tile or not k_tile:
        raise fail("tlc build: A and B must be loaded from global with tile shapes (BM, d) and (BN, d)", qk.loc)
    score_ops, exp = _score_chain(body, qk, pv)
    masks = [op for op in score_ops if op.fn == "mask" and op.kind == "causal"]
    aligns = {m.alignment for m in masks}
    if len(aligns) > 1:
        raise fail("tlc build: two causal masks with different alignments", masks[1].loc)
    exp2_scale = None
    if exp is not None:
        scalar = _scalar_of(body, exp.operands[2])
        if scalar is None:
            raise fail("tlc build: the softmax's exp2 scale must be a scalar expression", exp.loc)
        exp2_scale = _kir_scalar(graph, scalar, exp.loc)
    normalize = _normalize(graph, loops[0])
    if exp is None and normalize:
        raise fail("tlc build: O is divided after the loop but there is no softmax sum to divide by", loops[0].loc)
    stores = [op for _, op in ops if isinstance(op, CopyOp) and op.dst_space == "global" and len(op.operands) == 2]
    out = _source_global(graph, stores[0].operands[1]) if stores else None
    return AttentionShape(dtype=str(graph.params.get("dtype", "bf16")), d_qk=d_qk, d_v=d_v, bm=q_tile[0],
                          bn=k_tile[0], warps=_int_param(graph, "Warps", 4), stages=_int_param(graph, "Stages", 1),
                          causal=bool(masks), alignment=aligns.pop() if aligns else "top_left",
                          kv_offset=str(k.offset) if k.offset is not None else "head_idx", loc=qk.loc,
                          score_ops=tuple(score_ops), softmax=exp is not None, normalize=normalize,
                          exp2_scale=exp2_scale, tensor_names=(q.name, k.name, v.name, out.name if out else "O"),
                          variant=variant)


def flash_config(shape: AttentionShape, name: str, lse: bool = False):
    """The backend's kernel-IR builder configuration for this specialization."""
    from tlc.kir.flash_fwd import FlashFwdConfig
    from tlc.kir.score_ops import lower_exp2_scale, lower_score_ops

    steps, scalars = lower_score_ops(shape.score_ops)
    exp2_scale = "p.scale_log2"
    if shape.softmax and shape.exp2_scale is not None:
        exp2_scale, scalars = lower_exp2_scale(shape.exp2_scale, shape.loc, scalars)
    return FlashFwdConfig(dtype=shape.dtype, d_qk=shape.d_qk, d_v=shape.d_v, bm=shape.bm, bn=shape.bn,
                          warps=shape.warps, stages=shape.stages, causal=shape.causal, alignment=shape.alignment,
                          lse=lse, score_ops=steps, score_scalars=scalars, softmax=shape.softmax,
                          normalize=shape.normalize, exp2_scale=exp2_scale,
                          tensor_names=tuple(n.lower() if shape.variant == "attention" else n
                                             for n in shape.tensor_names),
                          name=name, loc=shape.loc)
