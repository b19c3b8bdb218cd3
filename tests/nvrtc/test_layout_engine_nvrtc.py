"""CuTe checks tlc's layout engine (tlc/layout) and fold-partitions' views: NVRTC compiles, no
launch, static_asserts that CuTe's TV layouts of every tiled MMA and tiled copy the lowering
declares for the shipped specs (default tiles, the tuning table's, and the small tiles CI builds)
equal the engine's, and that each folded view addresses what CuTe's partition does (two sample
threads), with CuTe's fragment and retile layouts."""
from __future__ import annotations

from pathlib import Path

import pytest

from tlc.kir import ops as K
from tlc.kir import ops_sm90 as H
from tlc.kir.ops_views import CoordViewOp, WgmmaDescriptorFragmentOp, WgmmaRegisterFragmentOp
from tlc.kir.transforms.fold_partitions import fold_partitions
from tlc.layout.crosscheck import CheckProgram
from tlc.layout.crosscheck_views import ViewChecks
from tlc.lowering.emit_text import kernel_ir
from tlc.attention.tuning import DEFAULT_TILES

SPECS = Path(__file__).resolve().parents[2] / "specs"
SMALL = {"HeadDim": "32", "BM": "64", "BN": "32"}
BINDINGS = {
    "mha_fwd": [{}, SMALL],
    "gqa_fwd": [{}, SMALL, *({"HeadDim": str(d), "BM": str(t["bm"]), "BN": str(t["bn"]), "Warps": str(t["warps"])}
                            for d, t in DEFAULT_TILES.items())], "mqa_fwd": [{}, SMALL], "softcap_fwd": [{}, SMALL],
    "mla_prefill_fwd": [{}, {"DQK": "64", "DV": "32", "BM": "64", "BN": "32"}],
    "b2b_gemm_relu": [{}, {"BM": "64", "BN": "32", "K1": "32", "N2": "32"}],
    "chain3_fwd": [{}, {"BM": "64", "BN": "32", "K1": "32", "N2": "32", "N3": "32"}],
    "mla_decode_fwd": [{}, {"DQK": "64", "DV": "64", "BM": "16", "BN": "32"}],
}


# The views' check instantiates CuTe's partitions (the slow templates fold-partitions avoids; about
# two minutes here), so it takes a covering sample: the README kernel (d=128, 4 warps), tlc.attention's
# d=256 tiles (8 warps), a replicated MMA (16 rows on 4 warps) and d_qk != d_v.
VIEW_BINDINGS = {
    "mha_fwd": [{}],
    "gqa_fwd": [{"HeadDim": "256", "BM": str(DEFAULT_TILES[256]["bm"]), "BN": str(DEFAULT_TILES[256]["bn"]),
                 "Warps": str(DEFAULT_TILES[256]["warps"])}],
    "mla_decode_fwd": [BINDINGS["mla_decode_fwd"][1]],
    "mla_prefill_fwd": [BINDINGS["mla_prefill_fwd"][1]],
}
# sm_90a kernels fold their epilogue (the persistent one inside its tile loop), the wgmma-matched copy, the
# wgmma accumulators, their coordinates (masks) and the operands' GMMA descriptors too: two and three consumer
# warp groups, N = 64 and 128
VIEW_BINDINGS_SM90A = {"mha_fwd": [{}, {"Causal": "true", "Persistent": "true"}],
                       "gqa_fwd": [{"HeadDim": "64", "BM": "192", "BN": "128", "Warps": "12", "Causal": "true"},
                                   {"HeadDim": "256", "BM": "128", "BN": "64", "Warps": "8"}]}


def check_program(views: bool) -> CheckProgram:
    check = CheckProgram()
    targets = [("sm_80", VIEW_BINDINGS if views else BINDINGS)] + ([("sm_90a", VIEW_BINDINGS_SM90A)] if views else [])
    for arch, spec, defines in [(a, s, d) for a, table in targets for s, ds in table.items() for d in ds]:
        program = kernel_ir(SPECS / f"{spec}.tl", arch, defines)
        if views:   # on sm_90a with the wgmma-matched copies too (the default; TLC_FOLD_PARTITIONS=no-wgmma leaves them to CuTe)
            kernel, _ = fold_partitions(program.kernels()[0], wgmma=arch == "sm_90a")
            ViewChecks(check, kernel).add()
        else:
            check.add_program(program)
    return check


def test_every_shipped_spec_is_checked() -> None:
    tv, views = check_program(False), check_program(True)
    assert tv.count >= 20, tv.count  # MMAs × roles and copies × sides, deduplicated
    assert views.count >= 80, views.count
    folded = fold_partitions(kernel_ir(SPECS / "mha_fwd.tl", "sm_80", SMALL).kernels()[0])[0]
    assert sum(isinstance(op, (K.PartitionOp, K.FragmentOp)) for op in K.walk(folded)) >= 20
    hopper = fold_partitions(kernel_ir(SPECS / "mha_fwd.tl", "sm_90a", {"Causal": "true"}).kernels()[0], wgmma=True)[0]
    accumulators = [op for op in K.walk(hopper) if isinstance(op, H.WgmmaFragmentOp) and op.role == "C"]
    assert accumulators and all(isinstance(op, WgmmaRegisterFragmentOp) for op in accumulators)
    assert any(isinstance(op, CoordViewOp) and op.slice == "thr_wgmma_S" for op in K.walk(hopper))
    descriptors = {op.name for op in K.walk(hopper) if isinstance(op, WgmmaDescriptorFragmentOp)}
    assert descriptors == {"tSrQ", "tSrK", "tOrV"}   # Q, K and V's GMMA descriptors, their partitions dropped
    assert not any(type(op) is K.PartitionOp and op.slice.startswith("thr_wgmma") for op in K.walk(hopper))


def _compile(check: CheckProgram) -> None:
    from tlc.backend_cute.nvrtc import compile_cubin

    result = compile_cubin(check.source(), "sm_80", name="layout_check.cu")
    assert result.cubin  # every static_assert held (a failing one names its number or view in the error)


@pytest.mark.slow
def test_cute_agrees_with_the_engine() -> None:
    _compile(check_program(False))


@pytest.mark.slow
def test_cute_agrees_with_the_folded_views() -> None:
    _compile(check_program(True))
