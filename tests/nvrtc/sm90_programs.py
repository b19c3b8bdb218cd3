"""Hand-built Hopper kernel-IR programs (no lowering produces them yet): a warp-specialised tile GEMM
C = A·Bᵀ (bf16 in, fp32 out) with a TMA + mbarrier ring feeding wgmma. Used by the NVRTC and GPU tests.

One CTA computes a BM×BN tile of C. Warp group 0 (one elected thread) loads A and B tiles with TMA
into a `stages`-deep shared ring, signalling `full[s]`; warp groups 1.. wait on `full[s]`, run wgmma
from shared memory, and release the stage on `empty[s]`. M, N, K must be multiples of the tile.
"""
from __future__ import annotations

from tlc.kir.expr import parse_expr
from tlc.kir.ops import (BarrierOp, ClearOp, ForOp, GlobalTensorOp, GlobalTileOp, IfOp, LetOp, MapOp,
                         PartitionOp, ProgramOp, SharedBufferOp)
from tlc.kir.ops_sm90 import (GmmaSmemLayoutOp, MbarrierArriveExpectTxOp, MbarrierArriveOp, MbarrierInitOp,
                              MbarrierOp, MbarrierWaitOp, Sm90KernelOp, TmaDescriptorOp, TmaLoadOp, TmaParamsOp,
                              WarpSpecializeOp, WgmmaArriveOp, WgmmaCommitOp, WgmmaFenceOperandOp, WgmmaFragmentOp,
                              WgmmaOp, WgmmaTiledMmaOp, WgmmaWaitOp)

E = parse_expr
GEMM_FIELDS = (("A_ptr", "ptr<bf16>"), ("B_ptr", "ptr<bf16>"), ("C_ptr", "ptr<f32>"),
               ("M", "i32"), ("N", "i32"), ("K", "i32"))


def _ring_position(stages: int) -> tuple:
    """stage = k mod stages; phase = parity of the ring's trip (how often stage was reused)."""
    return (LetOp(name="stage", type="i32", value=E(f"k % {stages}")),
            LetOp(name="phase", type="i32", value=E(f"k / {stages} % 2")))


def tile_gemm_sm90(bm: int = 128, bn: int = 128, bk: int = 64, stages: int = 2, consumers: int = 2,
                   producer_regs: int = 40, consumer_regs: int = 232) -> ProgramOp:
    """C (M×N, fp32, row-major) = A (M×K, bf16, row-major) · Bᵀ (B: N×K, bf16, row-major)."""
    tile_bytes = (bm + bn) * bk * 2
    a_bytes, b_bytes = bm * bk * 2 * stages, bn * bk * 2 * stages
    bars = a_bytes + b_bytes
    threads = 128 * (1 + consumers)
    producer = (
        IfOp(cond=E("threadIdx.x == 0"), body=(          # one elected thread issues every TMA
            ForOp(var="k", start=E("0"), stop=E("k_tiles"), step=1, stages=stages, body=(
                *_ring_position(stages),
                # A fresh barrier's phase "1" counts as complete: the first trip through the ring passes.
                MbarrierWaitOp(bar="empty", stage=E("stage"), phase=E("1 - phase")),
                MbarrierArriveExpectTxOp(bar="full", stage=E("stage"), bytes=tile_bytes),
                TmaLoadOp(desc="tma_A", bar="full", stage=E("stage"), dst="sA", coord=(E(f"m_block * {bm}"), E(f"k * {bk}"))),
                TmaLoadOp(desc="tma_B", bar="full", stage=E("stage"), dst="sB", coord=(E(f"n_block * {bn}"), E(f"k * {bk}"))),
            )),
        )),
    )
    consumer = (
        WgmmaTiledMmaOp(name="tiled_mma", dtype="bf16", kind="SS", tile=(bm // consumers, bn, bk),
                        warp_groups=(consumers, 1, 1), thread_slice="thr_mma", thread_index=E("threadIdx.x - 128")),
        PartitionOp(name="tCsA", slice="thr_mma", method="partition_A", src=E("sA")),
        PartitionOp(name="tCsB", slice="thr_mma", method="partition_B", src=E("sB")),
        WgmmaFragmentOp(name="tCrA", mma="tiled_mma", role="A", src=E("tCsA")),
        WgmmaFragmentOp(name="tCrB", mma="tiled_mma", role="B", src=E("tCsB")),
        WgmmaFragmentOp(name="acc", mma="tiled_mma", role="C", shape=(bm, bn)),
        ClearOp(target="acc"),
        ForOp(var="k", start=E("0"), stop=E("k_tiles"), step=1, stages=stages, body=(
            *_ring_position(stages),
            MbarrierWaitOp(bar="full", stage=E("stage"), phase=E("phase")),
            WgmmaFenceOperandOp(targets=("acc",)),
            WgmmaArriveOp(),
            WgmmaOp(mma="tiled_mma", acc="acc", a=E("tCrA[_, _, _, stage]"), b=E("tCrB[_, _, _, stage]")),
            WgmmaCommitOp(),
            WgmmaWaitOp(pending=0),
            WgmmaFenceOperandOp(targets=("acc",)),
            IfOp(cond=E("threadIdx.x % 128 == 0"), body=(      # one arrival per consumer warp group
                MbarrierArriveOp(bar="empty", stage=E("stage")),
            )),
        )),
        GlobalTensorOp(name="mC", dtype="fp32", ptr=E("p.C_ptr"), offset=E(f"n_block * {bn}"), rows=E("p.M"),
                       cols=bn, row_stride=E("p.N")),
        GlobalTileOp(name="gC", src="mC", tile=(bm, bn), coord=(E("m_block"), E("0"))),
        PartitionOp(name="tCgC", slice="thr_mma", method="partition_C", src=E("gC")),
        MapOp(target="tCgC", srcs=("acc",), fn=E("x0")),
    )
    kernel = Sm90KernelOp(
        name="tile_gemm_sm90", params="gemm_params", threads=threads, min_blocks=1,
        grid=(E(f"p.M / {bm}"), E(f"p.N / {bn}"), E("1")), smem_bytes=bars + 16 * stages, body=(
            TmaDescriptorOp(name="tma_A", ptr=E("p.A_ptr"), dtype="bf16", box=(bm, bk), swizzle=128),
            TmaDescriptorOp(name="tma_B", ptr=E("p.B_ptr"), dtype="bf16", box=(bn, bk), swizzle=128),
            LetOp(name="m_block", type="i32", value=E("blockIdx.x")),
            LetOp(name="n_block", type="i32", value=E("blockIdx.y")),
            LetOp(name="k_tiles", type="i32", value=E(f"p.K / {bk}")),
            GmmaSmemLayoutOp(name="sA_layout", dtype="bf16", swizzle=128, shape=(bm, bk, stages)),
            GmmaSmemLayoutOp(name="sB_layout", dtype="bf16", swizzle=128, shape=(bn, bk, stages)),
            SharedBufferOp(name="sA", dtype="bf16", layout="sA_layout", offset_bytes=0),
            SharedBufferOp(name="sB", dtype="bf16", layout="sB_layout", offset_bytes=a_bytes),
            MbarrierOp(name="full", count=stages, offset_bytes=bars),
            MbarrierOp(name="empty", count=stages, offset_bytes=bars + 8 * stages),
            IfOp(cond=E("threadIdx.x == 0"), body=(
                MbarrierInitOp(bar="full", arrivals=1),            # the producer's arrive_and_expect_tx
                MbarrierInitOp(bar="empty", arrivals=consumers),   # one arrive per consumer warp group
            )),
            BarrierOp(),
            WarpSpecializeOp(group="warp_group", producer_regs=producer_regs, consumer_regs=consumer_regs,
                             producer=producer, consumer=consumer),
        ))
    params = TmaParamsOp(name="gemm_params", fields=GEMM_FIELDS, descriptors=("tma_A", "tma_B"))
    return ProgramOp(name="tile_gemm_sm90", body=(params, kernel))
