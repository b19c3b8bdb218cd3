"""NVRTC compiles of specs/sliding_window_fwd.tl (a predicate mask) for each target, no launch: the sm_90
kernel at small tiles and the sm_90a kernel at the spec's defaults build without spills, and their source
masks each element with the window's predicate; specs/document_mask_fwd.tl (tensor Inputs read by element)
builds for both. Not run on a GPU."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tlc.builder import build_one

SPEC = Path(__file__).resolve().parents[2] / "specs" / "sliding_window_fwd.tl"
BUILDS = {  # arch → (-D bindings, the predicate as the emitted C++ spells it)
    "sm_90": ({"HeadDim": "32", "BM": "64", "BN": "32", "Window": "40"}, "kv_idx > q_idx || kv_idx < q_idx - 40"),
    "sm_90a": ({}, "kv_idx > q_idx || kv_idx < q_idx - 256"),
}


@pytest.mark.slow
@pytest.mark.parametrize("arch", sorted(BUILDS))
def test_sliding_window_compiles(arch: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TLC_CACHE_DIR", str(tmp_path / "cache"))   # compile for real
    defines, predicate = BUILDS[arch]
    meta = build_one(str(SPEC), arch, str(tmp_path), defines)
    assert meta["arch"] == arch and not meta["cached"]
    assert meta["ptxas"]["registers"] > 0 and meta["ptxas"].get("spill_store_bytes", 0) == 0
    assert (tmp_path / "sliding_window_fwd.cubin").read_bytes()[:4] == b"\x7fELF"
    source = (tmp_path / "sliding_window_fwd.cu").read_text()
    assert f"if ({predicate}) {{ acc_S(i) = -INFINITY; }}" in source
    assert json.loads((tmp_path / "sliding_window_fwd.json").read_text())["arch"] == arch


DOCUMENTS = SPEC.parent / "document_mask_fwd.tl"


@pytest.mark.slow
@pytest.mark.parametrize("arch, defines", [("sm_90", {"HeadDim": "32", "BM": "64", "BN": "32"}),
                                           ("sm_90a", {"Causal": "true"})])
def test_document_mask_with_tensor_inputs_compiles(arch: str, defines: dict, tmp_path, monkeypatch) -> None:
    """specs/document_mask_fwd.tl: tensor Inputs read through int pointers in the loop bound and the predicate."""
    monkeypatch.setenv("TLC_CACHE_DIR", str(tmp_path / "cache"))
    meta = build_one(str(DOCUMENTS), arch, str(tmp_path), defines)
    assert meta["arch"] == arch and not meta["cached"] and meta["ptxas"]["registers"] > 0
    assert (tmp_path / "document_mask_fwd.cubin").read_bytes()[:4] == b"\x7fELF"
    source = (tmp_path / "document_mask_fwd.cu").read_text()
    assert "int* kv_lengths_ptr;" in source and "p.doc_k_ptr[batch_idx * p.seqlen_k + kv_idx]" in source
    struct = json.loads((tmp_path / "document_mask_fwd.json").read_text())["abi"]["document_mask_fwd_params"]
    assert {"bytes": 8, "name": "kv_lengths_ptr", "type": "ptr<i32>"}.items() <= next(
        f for f in struct["fields"] if f["name"] == "kv_lengths_ptr").items()


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_90", "sm_90a"])
def test_kv_lengths_row_extent_compiles(arch: str, tmp_path, monkeypatch) -> None:
    """specs/kv_lengths_fwd.tl: K and V seen to min(kv_lengths[b], seqlen_k) rows; sm_90a by cp.async."""
    monkeypatch.setenv("TLC_CACHE_DIR", str(tmp_path / "cache"))
    spec = SPEC.parent / "kv_lengths_fwd.tl"
    defines = {"HeadDim": "32", "BM": "64", "BN": "32", "Causal": "true"} if arch == "sm_90" else {"Causal": "true"}
    meta = build_one(str(spec), arch, str(tmp_path), defines)
    assert meta["arch"] == arch and not meta["cached"] and meta["ptxas"].get("spill_store_bytes", 0) == 0
    source = (tmp_path / "kv_lengths_fwd.cu").read_text()
    assert "tlc::min(((batch_idx >= 0 && batch_idx < p.batch) ? p.kv_lengths_ptr[batch_idx] : 0), p.seqlen_k)" in source


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_90", "sm_90a"])
def test_a_row_vector_store_compiles(arch: str, tmp_path, monkeypatch) -> None:
    """specs/mha_lse_fwd.tl: the log-sum-exp stored as an fp32 row vector (RowStoreOp) on both targets."""
    monkeypatch.setenv("TLC_CACHE_DIR", str(tmp_path / "cache"))
    defines = {"HeadDim": "64", "Causal": "true"}
    meta = build_one(str(SPEC.parent / "mha_lse_fwd.tl"), arch, str(tmp_path), defines)
    assert meta["arch"] == arch and not meta["cached"] and meta["ptxas"].get("spill_store_bytes", 0) == 0
    source = (tmp_path / "mha_lse_fwd.cu").read_text()
    assert "float* LSE_ptr;" in source and "gLSE_rows(row) = " in source


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_90", "sm_90a"])
def test_a_paged_cache_compiles(arch: str, tmp_path, monkeypatch) -> None:
    """specs/paged_kv_fwd.tl: K and V gathered row by row from pages of 16 (a row map); cp.async on both targets."""
    monkeypatch.setenv("TLC_CACHE_DIR", str(tmp_path / "cache"))
    defines = {"HeadDim": "32", "BM": "64", "BN": "32"} if arch == "sm_90" else {}
    meta = build_one(str(SPEC.parent / "paged_kv_fwd.tl"), arch, str(tmp_path), defines)
    assert meta["arch"] == arch and not meta["cached"] and meta["ptxas"].get("spill_store_bytes", 0) == 0
    source = (tmp_path / "paged_kv_fwd.cu").read_text()
    assert "int K_storage_rows;" in source and "int64_t(at_ - row_) * stride<0>(mV)" in source
