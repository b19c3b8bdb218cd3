"""NVRTC compiles of specs/sliding_window_fwd.tl (a predicate mask) for each target, no launch: the sm_90
kernel at small tiles and the sm_90a kernel at the spec's defaults build without spills, and their source
masks each element with the window's predicate. Not run on a GPU."""
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
