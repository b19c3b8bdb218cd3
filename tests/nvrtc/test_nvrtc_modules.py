"""NVRTC compiles of a program of several kernels (specs/split_kv_fwd.tl, small tiles, no launch): `tlc build`
writes each kernel's `<file>.<kernel>.{cu,cubin,json}` and the program's `<file>.json` (the kernels in launch
order, the tensors' roles). CI, slow: two compiles."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tlc.cli import main

SPEC = Path(__file__).resolve().parents[2] / "specs" / "split_kv_fwd.tl"


@pytest.mark.slow
def test_tlc_build_writes_every_kernel_and_the_program_index(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("TLC_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "out"
    assert main(["build", str(SPEC), "--arch", "sm_90", "-o", str(out), "-D", "HeadDim=32", "-D", "BN=32"]) == 0
    said = capsys.readouterr().out
    assert "built split_kv_fwd_partial, split_kv_fwd_combine for sm_90" in said
    index = json.loads((out / "split_kv_fwd.json").read_text())
    assert [k["name"] for k in index["kernels"]] == ["partial", "combine"]
    assert index["tensors"]["O_part"] == "workspace" and index["tensors"]["O"] == "output"
    for kernel in ("partial", "combine"):
        assert (out / f"split_kv_fwd.{kernel}.cubin").read_bytes()[:4] == b"\x7fELF"
        meta = json.loads((out / f"split_kv_fwd.{kernel}.json").read_text())
        assert meta["program"] == f"split_kv_fwd_{kernel}" and meta["ptxas"].get("spill_store_bytes", 0) == 0
