"""NVRTC compiles of the shipped specs (no launch): one instantiation per supported spec
and arch, in parallel processes, and a clear refusal for the specs the backend cannot
build yet. Runs in CI on the CPU."""
from __future__ import annotations

import json
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from tlc.builder import _build_reporting

SPECS = Path(__file__).resolve().parents[2] / "specs"
SUPPORTED = ["mha_fwd", "gqa_fwd", "mqa_fwd", "mla_prefill_fwd", "softcap_fwd", "b2b_gemm_relu", "chain3_fwd"]
# One instantiation per spec and arch; small tiles keep NVRTC's template work (CI's cost) down.
SMALL = {"mha_fwd": {"HeadDim": "64", "BM": "64", "BN": "32"}, "gqa_fwd": {"HeadDim": "64", "BM": "64", "BN": "32"},
         "mqa_fwd": {"HeadDim": "64", "BM": "64", "BN": "32"}, "softcap_fwd": {"HeadDim": "64", "BM": "64", "BN": "32"},
         "mla_prefill_fwd": {"BM": "64", "BN": "32"}, "b2b_gemm_relu": {"BM": "64", "BN": "32"},
         "chain3_fwd": {"BM": "64", "BN": "32"}}
ARCHES = ["sm_80", "sm_90"]


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    import os

    out = tmp_path_factory.mktemp("build")
    os.environ["TLC_CACHE_DIR"] = str(out / "cache")  # compile for real, not from an earlier run's cache
    tasks = [(str(SPECS / f"{s}.tl"), a, str(out / a), SMALL[s]) for s in SUPPORTED for a in ARCHES]
    with ProcessPoolExecutor(max_workers=2) as pool:
        results = {(Path(t[0]).stem, t[1]): r for t, r in zip(tasks, pool.map(_build_reporting, tasks))}
    return out, results


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("spec", SUPPORTED)
def test_spec_compiles(builds, spec: str, arch: str) -> None:
    out, results = builds
    _, message, code = results[(spec, arch)]
    assert code == 0, message
    meta = json.loads((out / arch / f"{spec}.json").read_text())
    assert meta["schema_version"] == 1 and meta["arch"] == arch and meta["abi"]
    assert (out / arch / f"{spec}.cubin").stat().st_size > 1000
    source = (out / arch / f"{spec}.cu").read_text()
    assert "#line" in source
    # Every Compute on S is its own fragment op; the launch struct is read off the program.
    fields = [f["name"] for f in meta["abi"][f"{spec}_params"]["fields"]]
    tensors = [t["name"] for t in meta["launch"]["tensors"]]
    assert all(f"{t}_ptr" in fields for t in tensors)
    if spec == "b2b_gemm_relu":
        assert "acc_S(i) = max(x0, 0.0f);" in source and "exp2f" not in source and tensors == ["A", "B", "C", "O"]
    if spec == "chain3_fwd":
        assert source.count("cute::gemm(") == 3 and tensors == ["A", "B", "C", "D", "O"]
    if spec == "softcap_fwd":
        assert "acc_S(i) = tanhf(x0);" in source


@pytest.mark.parametrize("spec, reason", [
    ("mla_decode_fwd", "registers per thread"),
])
def test_unsupported_specs_fail_with_a_reason(tmp_path, spec: str, reason: str) -> None:
    _, message, code = _build_reporting((str(SPECS / f"{spec}.tl"), "sm_90", str(tmp_path), {}))
    assert code == 1
    assert reason in message and "Traceback" not in message
