"""Kernel-IR builder for two-GEMM programs in the FlashAttention-2 mould (sm_80 family: mma.sync).

S = Q·Kᵀ per KV tile, the program's score steps on S (generic MapOps and the mask: a scale, a
softcap, a relu … read from the TL graph by `select-atoms`), an online softmax or none, then
O += P·V with P kept in registers. Attention, softcap attention and a back-to-back GEMM
`relu(A·Bᵀ)·C` all come from here. Every tile size, atom, swizzle and stage lives in the ops it
returns — the emitter derives nothing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from tlc.diagnostics import Loc, fail
from tlc.kir.expr import E, Expr, Var
from tlc.kir.score_ops import SCORE_FIELDS, SCORE_SLOTS, ScoreStep, legacy_steps, substitute
from tlc.kir.ops import (AllReduceOp, AsyncCopyOp, BarrierOp, ClearOp, CommitOp, ConvertOp, CopyOp,
                         Exp2ScaleOp, ForOp, FragmentOp, GemmOp, GlobalTensorOp, GlobalTileOp, IdentityTileOp,
                         IfOp, KernelOp, LetOp, MapOp, MaskOp, Op, ParamsOp, PartitionOp, ProgramOp,
                         RetileAccToAOp, RowBroadcastOp, RowReduceOp, RowStoreOp, RowVectorOp, SharedBufferOp,
                         SharedViewOp, SmemLayoutOp, SmemTransposeLayoutOp, TiledCopyOp, TiledMmaOp, WaitOp)

ELEMENT_BYTES = {"bf16": 2, "fp16": 2}
MMA_ATOM = {"bf16": "SM80_16x8x16_F32BF16BF16F32_TN", "fp16": "SM80_16x8x16_F32F16F16F32_TN"}
CP_ASYNC = "SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>"
LN2 = math.log(2.0)

# The launch ABI (DESIGN §5): the order here is the C struct's order; launch.py packs it.
PARAM_FIELDS: tuple[tuple[str, str], ...] = (
    ("q", "ptr"), ("k", "ptr"), ("v", "ptr"), ("o", "ptr"), ("lse", "ptr<f32>"),
    ("b", "i32"), ("hq", "i32"), ("hkv", "i32"), ("h_ratio", "i32"), ("sq", "i32"), ("sk", "i32"),
    ("q_stride_b", "i64"), ("q_stride_h", "i64"), ("q_stride_s", "i64"),
    ("k_stride_b", "i64"), ("k_stride_h", "i64"), ("k_stride_s", "i64"),
    ("v_stride_b", "i64"), ("v_stride_h", "i64"), ("v_stride_s", "i64"),
    ("o_stride_b", "i64"), ("o_stride_h", "i64"), ("o_stride_s", "i64"),
    ("lse_stride_b", "i64"), ("lse_stride_h", "i64"),
    ("scale", "f32"), ("scale_log2", "f32"), ("softcap_scale", "f32"),
    # Appended (old offsets unchanged): runtime scalars of the score program, see tlc.kir.score_ops.
    *((f, "f32") for f in SCORE_FIELDS),
)


@dataclass(frozen=True)
class FlashFwdConfig:
    """One specialization. `alignment` is the causal diagonal: top_left (SDPA) or bottom_right (FA ≥ 2.1)."""

    dtype: str = "bf16"
    d_qk: int = 128
    d_v: int = 128
    bm: int = 128
    bn: int = 64
    warps: int = 4
    stages: int = 1
    causal: bool = False
    alignment: str = "top_left"
    lse: bool = False
    # Hand-written configs: tanh(S·scale/cap)·cap through `p.softcap_scale`. TL programs say the
    # same with Computes on S, which select-atoms reads into `score_ops` instead.
    softcap: bool = False
    # The program between the GEMMs (None: the legacy chain — optional softcap, then the mask);
    # `score_scalars[i]` is the host expression (over runtime inputs) the launcher puts in p.score_s<i>.
    score_ops: tuple[ScoreStep, ...] | None = None
    score_scalars: tuple[str, ...] = ()
    # False: P = f(S) goes straight to the second GEMM (a back-to-back GEMM): no row statistics.
    softmax: bool = True
    # Divide O by the softmax's row sum at the end (the program's `Compute Divide O, l`).
    normalize: bool = True
    # The exp2 scale of the softmax (log2 e folded in), kernel-IR text.
    exp2_scale: str = "p.scale_log2"
    # The program's names for the q, k, v, o slots (error messages and the .json).
    tensor_names: tuple[str, ...] = ("q", "k", "v", "o")
    # S2R software pipelining inside each GEMM (ldmatrix of k-block kb+1 before the MMAs of kb).
    s_prefetch: bool = True
    pv_prefetch: bool = True
    name: str = "flash_fwd"
    loc: Loc | None = None

    def check(self) -> None:
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise fail(f"flash_fwd config: {msg}", self.loc)
        need(self.dtype in MMA_ATOM, f"dtype {self.dtype!r} is not bf16 or fp16")
        for d in (self.d_qk, self.d_v):
            need(d % 32 == 0 and 32 <= d <= 256, f"head dim {d} must be a multiple of 32 in 32..256")
        need(self.bm == 16 * self.warps * (self.bm // (16 * self.warps)) and self.bm >= 16 * self.warps,
             f"BM={self.bm} must be a multiple of 16·warps={16 * self.warps}")
        need(self.bn % 16 == 0 and self.bn >= 16, f"BN={self.bn} must be a multiple of 16")
        need(self.stages in (1, 2), f"stages={self.stages}: 1 (FA2 overlap) or 2 (double buffer)")
        need(self.alignment in ("top_left", "bottom_right"), f"alignment {self.alignment!r}")
        need(self.warps in (1, 2, 4, 8), f"warps={self.warps} must be 1, 2, 4 or 8")
        need(not (self.softcap and self.score_ops is not None), "softcap=True and score_ops both given")
        need(len(self.score_scalars) <= SCORE_SLOTS, f"at most {SCORE_SLOTS} score scalars")
        need(self.softmax or not self.lse, "the LSE output needs a softmax")
        for step in self.chain():
            need(step.kind in ("map", "mask"), f"score step kind {step.kind!r}")
        for d in (self.d_qk, self.d_v):
            tpr = _kblock(d) // 8
            need(self.bn % (self.warps * 32 // tpr) == 0 and self.bm % (self.warps * 32 // tpr) == 0,
                 f"BM/BN must be multiples of the copy's {self.warps * 32 // tpr} rows per pass")

    @property
    def threads(self) -> int:
        return 32 * self.warps

    def smem_bytes(self) -> int:
        eb = ELEMENT_BYTES[self.dtype]
        q = self.bm * self.d_qk * eb
        kv = self.stages * self.bn * (self.d_qk + self.d_v) * eb
        return max(q + kv, self.bm * self.d_v * eb)

    def chain(self) -> tuple[ScoreStep, ...]:
        """The score steps the kernel runs, in order."""
        return legacy_steps(self.softcap) if self.score_ops is None else self.score_ops

    def _program_tag(self) -> str:
        """'' for the FlashAttention program; a short digest when the score program differs."""
        legacy = legacy_steps(False)
        same = (len(self.chain()) == len(legacy) and all(a.same_code(b) for a, b in zip(self.chain(), legacy))
                and self.exp2_scale == "p.scale_log2" and self.softmax and self.normalize)
        if self.softcap or same:
            return ""
        import hashlib
        text = repr(([(s.kind, s.fn) for s in self.chain()], self.score_scalars, self.exp2_scale, self.normalize))
        return ("_sc" if self.softmax else "_nosm") + hashlib.sha1(text.encode()).hexdigest()[:8]

    def key(self) -> str:
        c = "causal_" + ("tl" if self.alignment == "top_left" else "br") if self.causal else "full"
        extra = ("_lse" if self.lse else "") + ("_softcap" if self.softcap else "") + self._program_tag()
        extra += ("" if self.s_prefetch else "_nsp") + ("" if self.pv_prefetch else "_npp")
        return (f"{self.name}_{self.dtype}_q{self.d_qk}_v{self.d_v}_{c}_m{self.bm}n{self.bn}"
                f"w{self.warps}s{self.stages}{extra}")


# Measured defaults on an H200 (bench/bench_attention.py --sweep, 2026-11-22): double-buffered K/V
# (stages=2) with 4 warps along M was the fastest of the swept tiles for d = 64 and 128.
# d=128: BN=48 is spill-free at 255 registers and measured faster than BN=64, which spills 48 B
# (H200, 2026-11-22, `TLC_BENCH_SWEEP=128x48x4x2 python3 bench/bench_attention.py --sweep`:
# 365.5 vs 357.3 TFLOP/s non-causal, 326.2 vs 318.2 causal; bench/README.md).
DEFAULT_TILES = {64: dict(bm=128, bn=64, warps=4, stages=2), 128: dict(bm=128, bn=48, warps=4, stages=2),
                 # Not tuned: the largest tiles that compiled without spills (NVRTC 13.5, sm_90).
                 192: dict(bm=64, bn=64, warps=4, stages=2), 256: dict(bm=64, bn=32, warps=4, stages=2)}


def default_tiles(d_qk: int, d_v: int) -> dict:
    """Tile sizes `select-atoms` should pick for the sm_80 family when no parameter fixes them."""
    return dict(DEFAULT_TILES.get(max(d_qk, d_v), dict(bm=64, bn=64, warps=4, stages=2)))


def _kblock(d: int) -> int:
    return 64 if d % 64 == 0 else 32


def _smem_layout(name: str, rows: int, d: int, stages: int = 0) -> SmemLayoutOp:
    kb = _kblock(d)
    shape = (rows, d, stages) if stages else (rows, d)
    return SmemLayoutOp(name=name, swizzle=(3 if kb == 64 else 2, 3, 3), atom=(8, kb), shape=shape)


def _gmem_copy(name: str, slice_: str, atom: str, dtype: str, d: int, threads: int) -> TiledCopyOp:
    tpr = _kblock(d) // 8  # 16-byte chunks per smem row atom
    return TiledCopyOp(name=name, atom=atom, dtype=dtype, kind="threads", thread_slice=slice_,
                       thread_layout=(threads // tpr, tpr), value_layout=(1, 8))


def build_flash_fwd_kir(cfg: FlashFwdConfig) -> ProgramOp:
    cfg.check()
    dt, BM, BN, D, DV = cfg.dtype, cfg.bm, cfg.bn, cfg.d_qk, cfg.d_v
    eb = ELEMENT_BYTES[dt]
    S = cfg.stages
    diag = " + (p.sk - p.sq)" if cfg.alignment == "bottom_right" else ""
    params = ParamsOp(name="FlashParams", fields=tuple(
        (n, f"ptr<{dt}>" if t == "ptr" else t) for n, t in PARAM_FIELDS))

    def stage_of(n: str) -> str:
        return "0" if S == 1 else f"(n_block_max - 1 - {n}) % {S}"

    body: list[Op] = [
        LetOp(name="tidx", type="i32", value=E("threadIdx.x")),
        # Causal: the longest rows (largest m_block) start first so the tail of the grid is short.
        LetOp(name="m_block", type="i32", value=E("gridDim.x - 1 - blockIdx.x" if cfg.causal else "blockIdx.x")),
        LetOp(name="bidh", type="i32", value=E("blockIdx.y")),
        LetOp(name="bidb", type="i32", value=E("blockIdx.z")),
        LetOp(name="bidh_kv", type="i32", value=E("bidh / p.h_ratio")),
        LetOp(name="n_block_max", type="i32", value=E(
            f"max(0, min(ceil_div(p.sk, {BN}), ceil_div((m_block + 1) * {BM}{diag}, {BN})))" if cfg.causal
            else f"ceil_div(p.sk, {BN})")),
        # Tiles at or above this index need a mask (sequence end, causal diagonal); the rest run unmasked.
        LetOp(name="n_block_mask_min", type="i32", value=E(
            f"min(p.sk / {BN}, floor_div(m_block * {BM}{diag} + 1, {BN}))" if cfg.causal
            else f"p.sk / {BN}")),
        TiledMmaOp(name="tiled_mma", atom=MMA_ATOM[dt], warps=(cfg.warps, 1, 1), tile=(16 * cfg.warps, 16, 16),
                   thread_slice="thr_mma"),
        _smem_layout("SmemLayoutQ", BM, D),
        _smem_layout("SmemLayoutK", BN, D, S),
        _smem_layout("SmemLayoutV", BN, DV, S),
        SmemTransposeLayoutOp(name="SmemLayoutVt", of="SmemLayoutV", shape=(DV, BN, S)),
        SmemTransposeLayoutOp(name="SmemLayoutVtNoSwizzle", of="SmemLayoutV", shape=(DV, BN, S), strip_swizzle=True),
        _smem_layout("SmemLayoutO", BM, DV),
        SharedBufferOp(name="sQ", dtype=dt, layout="SmemLayoutQ", offset_bytes=0),
        SharedBufferOp(name="sK", dtype=dt, layout="SmemLayoutK", offset_bytes=BM * D * eb),
        SharedBufferOp(name="sV", dtype=dt, layout="SmemLayoutV", offset_bytes=BM * D * eb + S * BN * D * eb),
        SharedViewOp(name="sVt", of="sV", layout="SmemLayoutVt"),
        SharedViewOp(name="sVtNoSwizzle", of="sV", layout="SmemLayoutVtNoSwizzle"),
        # The epilogue stages O through the Q buffer: Q is dead after the last S = Q·Kᵀ.
        SharedBufferOp(name="sO", dtype=dt, layout="SmemLayoutO", offset_bytes=0),
    ]
    for t, h in (("q", "bidh"), ("k", "bidh_kv"), ("v", "bidh_kv"), ("o", "bidh")):
        rows = "p.sq" if t in "qo" else "p.sk"
        body.append(GlobalTensorOp(name=f"m{t.upper()}", dtype=dt, ptr=Var(f"p.{t}"),
                                   offset=E(f"bidb * p.{t}_stride_b + {h} * p.{t}_stride_h"), rows=E(rows),
                                   cols=D if t in "qk" else DV, row_stride=Var(f"p.{t}_stride_s")))
    body += [
        GlobalTileOp(name="gQ", src="mQ", tile=(BM, D), coord=(Var("m_block"), E(0))),
        GlobalTileOp(name="gK", src="mK", tile=(BN, D), coord=(Var("_"), E(0))),
        GlobalTileOp(name="gV", src="mV", tile=(BN, DV), coord=(Var("_"), E(0))),
        GlobalTileOp(name="gO", src="mO", tile=(BM, DV), coord=(Var("m_block"), E(0))),
        IdentityTileOp(name="cQ", shape=(BM, D)),
        IdentityTileOp(name="cK", shape=(BN, D)),
        IdentityTileOp(name="cV", shape=(BN, DV)),
        IdentityTileOp(name="cS", shape=(BM, BN)),
        IdentityTileOp(name="cO", shape=(BM, DV)),
        _gmem_copy("gmem_tiled_copy_QK", "gmem_thr_copy_QK", CP_ASYNC, dt, D, cfg.threads),
        _gmem_copy("gmem_tiled_copy_V", "gmem_thr_copy_V", CP_ASYNC, dt, DV, cfg.threads),
        _gmem_copy("gmem_tiled_copy_O", "gmem_thr_copy_O", "UniversalCopy<cute::uint128_t>", dt, DV, cfg.threads),
        TiledCopyOp(name="smem_tiled_copy_Q", atom="SM75_U32x4_LDSM_N", dtype=dt, kind="A", mma="tiled_mma",
                    thread_slice="smem_thr_copy_Q"),
        TiledCopyOp(name="smem_tiled_copy_K", atom="SM75_U32x4_LDSM_N", dtype=dt, kind="B", mma="tiled_mma",
                    thread_slice="smem_thr_copy_K"),
        TiledCopyOp(name="smem_tiled_copy_V", atom="SM75_U16x8_LDSM_T", dtype=dt, kind="B", mma="tiled_mma",
                    thread_slice="smem_thr_copy_V"),
        TiledCopyOp(name="smem_tiled_copy_O", atom="UniversalCopy<uint32_t>", dtype=dt, kind="C", mma="tiled_mma",
                    thread_slice="smem_thr_copy_O"),
        PartitionOp(name="tQgQ", slice="gmem_thr_copy_QK", method="partition_S", src=Var("gQ")),
        PartitionOp(name="tQsQ", slice="gmem_thr_copy_QK", method="partition_D", src=Var("sQ")),
        PartitionOp(name="tQcQ", slice="gmem_thr_copy_QK", method="partition_S", src=Var("cQ")),
        PartitionOp(name="tKgK", slice="gmem_thr_copy_QK", method="partition_S", src=Var("gK")),
        PartitionOp(name="tKsK", slice="gmem_thr_copy_QK", method="partition_D", src=Var("sK")),
        PartitionOp(name="tKcK", slice="gmem_thr_copy_QK", method="partition_S", src=Var("cK")),
        PartitionOp(name="tVgV", slice="gmem_thr_copy_V", method="partition_S", src=Var("gV")),
        PartitionOp(name="tVsV", slice="gmem_thr_copy_V", method="partition_D", src=Var("sV")),
        PartitionOp(name="tVcV", slice="gmem_thr_copy_V", method="partition_S", src=Var("cV")),
        FragmentOp(name="tSrQ", mma="tiled_mma", role="A", dtype=dt, src=Var("sQ")),
        FragmentOp(name="tSrK", mma="tiled_mma", role="B", dtype=dt, src=E("sK[_, _, 0]")),
        FragmentOp(name="tOrVt", mma="tiled_mma", role="B", dtype=dt, src=E("sVtNoSwizzle[_, _, 0]")),
        FragmentOp(name="acc_o", mma="tiled_mma", role="C", dtype="fp32", shape=(BM, DV)),
        PartitionOp(name="tSsQ", slice="smem_thr_copy_Q", method="partition_S", src=Var("sQ")),
        PartitionOp(name="tSrQ_view", slice="smem_thr_copy_Q", method="retile_D", src=Var("tSrQ")),
        PartitionOp(name="tSsK", slice="smem_thr_copy_K", method="partition_S", src=Var("sK")),
        PartitionOp(name="tSrK_view", slice="smem_thr_copy_K", method="retile_D", src=Var("tSrK")),
        PartitionOp(name="tOsVt", slice="smem_thr_copy_V", method="partition_S", src=Var("sVt")),
        PartitionOp(name="tOrVt_view", slice="smem_thr_copy_V", method="retile_D", src=Var("tOrVt")),
        PartitionOp(name="tScS", slice="thr_mma", method="partition_C", src=Var("cS")),
    ]
    if cfg.softmax:
        body += [RowVectorOp(name="row_max", like="acc_o", init=E("-inf")),
                 RowVectorOp(name="row_max_prev", like="acc_o", init=E("-inf")),
                 RowVectorOp(name="row_sum", like="acc_o", init=E(0.0)),
                 RowVectorOp(name="scores_scale", like="acc_o", init=E(1.0))]
    body.append(ClearOp(target="acc_o"))

    def load(tok: str, which: str, n: str, stage: str, predicated: bool = True) -> AsyncCopyOp:
        # Only the last KV tile (n_block_max - 1, loaded first) can run past Sk; the others are
        # full tiles and load without per-row predicates (fewer registers in the main loop).
        pred = dict(pred=Var(f"t{which}c{which}"), row_limit=E(f"p.sk - ({n}) * {BN}")) if predicated else {}
        if which == "K":
            return AsyncCopyOp(token=tok, copy="gmem_tiled_copy_QK", src=E(f"tKgK[_, _, _, {n}]"),
                               dst=E(f"tKsK[_, _, _, {stage}]"), **pred)
        return AsyncCopyOp(token=tok, copy="gmem_tiled_copy_V", src=E(f"tVgV[_, _, _, {n}]"),
                           dst=E(f"tVsV[_, _, _, {stage}]"), **pred)

    # Prologue: Q and the first K (and V when double-buffered) in flight before the loop.
    first = [load("tok_k0", "K", "n_block_max - 1", "0")] + ([load("tok_v0", "V", "n_block_max - 1", "0")] if S == 2 else [])
    body += [
        AsyncCopyOp(token="tok_q", copy="gmem_tiled_copy_QK", src=Var("tQgQ"), dst=Var("tQsQ"), pred=Var("tQcQ"),
                    row_limit=E(f"p.sq - m_block * {BM}")),
        IfOp(cond=E("n_block_max > 0"), body=tuple(first)),
        CommitOp(name="grp_prologue", tokens=("tok_q", *(op.token for op in first))),
    ]

    s_gemm = GemmOp(mma="tiled_mma", acc="acc_s", a="tSrQ", b="tSrK", a_smem=Var("tSsQ"), a_copy="smem_tiled_copy_Q",
                    a_view="tSrQ_view", b_smem=E("tSsK[_, _, _, stage]"), b_copy="smem_tiled_copy_K", b_view="tSrK_view",
                    prefetch=cfg.s_prefetch)
    o_gemm = GemmOp(mma="tiled_mma", acc="acc_o", a="tOrP", b="tOrVt", b_smem=E("tOsVt[_, _, _, stage]"),
                    b_copy="smem_tiled_copy_V", b_view="tOrVt_view", prefetch=cfg.pv_prefetch)
    scores: list[Op] = [s_gemm, *_score_program(cfg)]
    scale_log2 = E(cfg.exp2_scale)

    def with_scale(fn: str) -> Expr:
        return substitute(E(fn), "p.scale_log2", scale_log2)

    to_pv: list[Op] = [
        MapOp(target="row_max_prev", srcs=("row_max",), fn=E("x0")),
        RowReduceOp(dst="row_max", src="acc_s", kind="max", accumulate=True),
        AllReduceOp(target="row_max", kind="max", width=4),
        MapOp(target="scores_scale", srcs=("row_max_prev", "row_max"),
              fn=with_scale("exp2((x0 - select(x1 == -inf, 0.0, x1)) * p.scale_log2)")),
        MapOp(target="row_sum", srcs=("row_sum", "scores_scale"), fn=E("x0 * x1")),
        RowBroadcastOp(target="acc_o", vec="scores_scale", fn=E("x * r")),
        Exp2ScaleOp(target="acc_s", row_max="row_max", scale_log2=scale_log2),
        RowReduceOp(dst="row_sum", src="acc_s", kind="sum", accumulate=True),
    ] if cfg.softmax else []
    # P (or f(S) without a softmax) stays in registers as the second GEMM's A operand.
    to_pv += [ConvertOp(name="rP", src="acc_s", dtype=dt), RetileAccToAOp(name="tOrP", src="rP", mma="tiled_mma")]
    head: list[Op] = [LetOp(name="stage", type="i32", value=E(stage_of("n_block"))),
                      FragmentOp(name="acc_s", mma="tiled_mma", role="C", dtype="fp32", shape=(BM, BN)),
                      ClearOp(target="acc_s")]
    if S == 1:
        # FA2's overlap: V[n] loads during S = Q·Kᵀ, K[n-1] loads during softmax and P·V.
        loop_body = head + [
            WaitOp(pending=0, groups=("grp_prologue",)), BarrierOp(),
            IfOp(cond=E("n_block == n_block_max - 1"), body=(load("tok_v", "V", "n_block", "0"),)),
            IfOp(cond=E("n_block < n_block_max - 1"), body=(load("tok_v_full", "V", "n_block", "0", False),)),
            CommitOp(name="grp_v", tokens=("tok_v", "tok_v_full")),
            *scores,
            WaitOp(pending=0, groups=("grp_v",)), BarrierOp(),
            IfOp(cond=E("n_block > 0"), body=(load("tok_k", "K", "n_block - 1", "0", False),)),
            CommitOp(name="grp_k", tokens=("tok_k",)),
            *to_pv, o_gemm]
    else:
        # Double buffer: tile n-1 (K and V) is issued into the other stage before computing tile n.
        loop_body = head + [
            IfOp(cond=E("n_block > 0"), body=(load("tok_k", "K", "n_block - 1", "1 - stage", False),
                                               load("tok_v", "V", "n_block - 1", "1 - stage", False))),
            CommitOp(name="grp_next", tokens=("tok_k", "tok_v")),
            WaitOp(pending=1, groups=("grp_prologue",)), BarrierOp(),
            *scores, *to_pv, o_gemm,
            BarrierOp()]
    body.append(ForOp(var="n_block", start=E("n_block_max - 1"), stop=E(-1), step=-1, body=tuple(loop_body),
                      stages=S, prefetch=True))

    # Epilogue: normalise, write O through shared memory with 16-byte stores, optional LSE.
    if cfg.softmax:
        body.append(AllReduceOp(target="row_sum", kind="sum", width=4))
    if cfg.softmax and cfg.normalize:
        body += [
            RowVectorOp(name="inv_sum", like="acc_o", init=E(1.0)),
            MapOp(target="inv_sum", srcs=("row_sum",), fn=E("select(x0 == 0.0 || isnan(x0), 1.0, 1.0 / x0)")),
            RowBroadcastOp(target="acc_o", vec="inv_sum", fn=E("x * r"))]
    body += [
        WaitOp(pending=0), BarrierOp(),
        ConvertOp(name="rO", src="acc_o", dtype=dt),
        PartitionOp(name="taccOrO", slice="smem_thr_copy_O", method="retile_S", src=Var("rO")),
        PartitionOp(name="taccOsO", slice="smem_thr_copy_O", method="partition_D", src=Var("sO")),
        CopyOp(copy="smem_tiled_copy_O", src=Var("taccOrO"), dst=Var("taccOsO")),
        BarrierOp(),
        PartitionOp(name="tOsO", slice="gmem_thr_copy_O", method="partition_S", src=Var("sO")),
        PartitionOp(name="tOgO", slice="gmem_thr_copy_O", method="partition_D", src=Var("gO")),
        PartitionOp(name="tOcO", slice="gmem_thr_copy_O", method="partition_D", src=Var("cO")),
        CopyOp(copy="gmem_tiled_copy_O", src=Var("tOsO"), dst=Var("tOgO"), pred=Var("tOcO"),
               row_limit=E(f"p.sq - m_block * {BM}")),
    ]
    if cfg.lse:
        body += [
            RowVectorOp(name="lse", like="acc_o", init=E("-inf")),
            MapOp(target="lse", srcs=("row_max", "row_sum"),
                  fn=with_scale(f"select(x1 == 0.0, -inf, x0 * p.scale_log2 * {LN2!r} + log(x1))")),
            GlobalTensorOp(name="mLSE", dtype="fp32", ptr=Var("p.lse"),
                           offset=E("bidb * p.lse_stride_b + bidh * p.lse_stride_h"), rows=Var("p.sq"), cols=0,
                           row_stride=E(1)),
            GlobalTileOp(name="gLSE", src="mLSE", tile=(BM,), coord=(Var("m_block"),)),
            PartitionOp(name="taccOcO", slice="thr_mma", method="partition_C", src=Var("cO")),
            RowStoreOp(dst="gLSE", vec="lse", coord="taccOcO", row_limit=E(f"p.sq - m_block * {BM}")),
        ]
    if cfg.loc is not None:
        body = [_with_loc(op, cfg.loc) for op in body]
    kernel = KernelOp(name=cfg.key(), params="FlashParams", threads=cfg.threads, min_blocks=1,
                      grid=(E(f"ceil_div(p.sq, {BM})"), Var("p.hq"), Var("p.b")), smem_bytes=cfg.smem_bytes(),
                      body=tuple(body))
    program = ProgramOp(name=cfg.key(), body=(params, kernel))
    program.verify()
    return program


def _score_program(cfg: FlashFwdConfig) -> list[Op]:
    """The score steps on acc_s, in program order: MapOps, and the mask (bounds past Sk and, when
    causal, the diagonal) only in the tiles that need it. A softmax always gets a mask first:
    columns past Sk are absent, and a zero-filled K row would otherwise score 0, not -inf."""
    BM, BN = cfg.bm, cfg.bn
    steps = list(cfg.chain())
    if cfg.softmax and not any(s.kind == "mask" for s in steps):
        steps.append(ScoreStep("mask"))
    out: list[Op] = []
    for step in steps:
        if step.kind == "map":
            out.append(MapOp(target="acc_s", srcs=("acc_s",), fn=E(step.fn), loc=step.loc))
            continue
        mask = MaskOp(target="acc_s", coord="tScS", row0=E(f"m_block * {BM}"), col0=E(f"n_block * {BN}"),
                      sq=Var("p.sq"), sk=Var("p.sk"), causal=cfg.causal, alignment=cfg.alignment, bounds=True,
                      loc=step.loc)
        out.append(IfOp(cond=E("n_block >= n_block_mask_min"), body=(mask,), loc=step.loc))
    return out


def _with_loc(op: Op, loc: Loc) -> Op:
    import dataclasses
    changes: dict = {"loc": op.loc or loc}
    for region in op.regions:
        changes[region] = tuple(_with_loc(c, loc) for c in getattr(op, region))
    return dataclasses.replace(op, **changes)
