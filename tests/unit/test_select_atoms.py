"""select-atoms reads the specialization from the TL program, and refuses what it cannot lower."""
from __future__ import annotations

from pathlib import Path

import pytest

from tlc.api import lower_source
from tlc.diagnostics import TlcError
from tlc.lowering.select_atoms import select_attention

SPECS = Path(__file__).resolve().parents[2] / "specs"


def _shape(name: str, arch: str = "sm_90", **defines: str):
    path = SPECS / name
    return select_attention(lower_source(path.read_bytes(), name, defines=defines), arch)


def test_mha_defaults() -> None:
    s = _shape("mha_fwd.tl")
    assert (s.dtype, s.d_qk, s.d_v, s.bm, s.bn, s.causal) == ("bf16", 128, 128, 128, 64, False)


def test_defines_reach_the_specialization() -> None:
    s = _shape("mha_fwd.tl", HeadDim="64", BN="32", Causal="true", dtype="fp16")
    assert (s.dtype, s.d_qk, s.bn, s.causal, s.alignment) == ("fp16", 64, 32, True, "top_left")


def test_gqa_offset_is_recorded() -> None:
    assert "group" in _shape("gqa_fwd.tl").kv_offset


def test_unsupported_arch_is_a_clear_error() -> None:
    with pytest.raises(TlcError, match="unsupported --arch sm_75"):
        _shape("mha_fwd.tl", arch="sm_75")


def test_b2b_gemm_is_refused_with_the_reason() -> None:
    with pytest.raises(TlcError) as exc:
        _shape("b2b_gemm_relu.tl")
    assert "attention-shaped" in exc.value.render()
