"""CuTe checks tlc's layout engine (tlc/layout): one NVRTC compile, no launch, of static_asserts
that CuTe's TV layouts of every tiled MMA and tiled copy the lowering declares for the shipped
specs (default tiles, the tuning table's, and the small tiles CI builds) equal the engine's."""
from __future__ import annotations

from pathlib import Path

import pytest

from tlc.layout.crosscheck import CheckProgram
from tlc.lowering.emit_text import kernel_ir
from tlc.tuning import DEFAULT_TILES

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


def check_program() -> CheckProgram:
    check = CheckProgram()
    for spec, bindings in BINDINGS.items():
        for defines in bindings:
            check.add_program(kernel_ir(SPECS / f"{spec}.tl", "sm_80", defines))
    return check


def test_every_shipped_spec_is_checked() -> None:
    check = check_program()
    assert check.count >= 20, check.count  # MMAs × roles and copies × sides, deduplicated


@pytest.mark.slow
def test_cute_agrees_with_the_engine() -> None:
    from tlc.backend_cute.nvrtc import compile_cubin

    result = compile_cubin(check_program().source(), "sm_80", name="layout_check.cu")
    assert result.cubin  # every static_assert held (a failing one names its number in the error)
