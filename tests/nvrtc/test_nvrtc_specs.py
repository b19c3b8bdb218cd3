"""NVRTC compiles of the shipped specs (no launch), and a clear refusal for the specs the backend
cannot build yet. Runs in CI on the CPU, where one compile costs 50-60 s: every supported spec is
compiled exactly once, at small tiles, for one arch (the archs alternate, so sm_80 and sm_90 are
both covered), all by one module-scoped fixture whose disk cache the other tests reuse."""
from __future__ import annotations

import json
import re
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from tlc.builder import _build_reporting, build_one

SPECS = Path(__file__).resolve().parents[2] / "specs"
# Small tiles keep NVRTC's template work (CI's cost) down: a 32-wide head, 64×32 tiles.
ATTENTION = {"HeadDim": "32", "BM": "64", "BN": "32"}
GEMMS = {"BM": "64", "BN": "32", "K1": "32", "N2": "32"}
BUILDS = {  # spec → (arch, -D bindings)
    "mha_fwd": ("sm_80", ATTENTION),
    "gqa_fwd": ("sm_90", ATTENTION),
    "mqa_fwd": ("sm_80", ATTENTION),
    "softcap_fwd": ("sm_90", ATTENTION),
    "mla_prefill_fwd": ("sm_80", {"DQK": "64", "DV": "32", "BM": "64", "BN": "32"}),  # d_qk != d_v
    "b2b_gemm_relu": ("sm_90", GEMMS),
    "chain3_fwd": ("sm_80", dict(GEMMS, N3="32")),
    "mla_decode_fwd": ("sm_90", {"DQK": "64", "DV": "64", "BM": "16", "BN": "32"}),  # 16 rows on 4 warps
    "group_sum_fwd": ("sm_80", ATTENTION),   # a reduce-store: atomicAdd into fp32
    "merge_states": ("sm_90", {"HeadDim": "32"}),   # no GEMM: tiles loaded straight into registers
}


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    out = tmp_path_factory.mktemp("build")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TLC_CACHE_DIR", str(out / "cache"))  # compile for real, not from an earlier run's cache
        tasks = [(str(SPECS / f"{s}.tl"), arch, str(out / s), defines) for s, (arch, defines) in BUILDS.items()]
        with ProcessPoolExecutor(max_workers=2) as pool:
            results = {Path(t[0]).stem: r for t, r in zip(tasks, pool.map(_build_reporting, tasks))}
        yield out, results


@pytest.mark.slow
@pytest.mark.parametrize("spec", sorted(BUILDS))
def test_spec_compiles(builds, spec: str) -> None:
    out, results = builds
    arch = BUILDS[spec][0]
    _, message, code, *_ = results[spec]   # and, where _build_reporting gives them, warnings
    assert code == 0, message
    meta = json.loads((out / spec / f"{spec}.json").read_text())
    assert meta["schema_version"] == 1 and meta["arch"] == arch and meta["abi"] and not meta["cached"]
    assert meta["ptxas"]["registers"] > 0 and meta["ptxas"].get("spill_store_bytes", 0) == 0
    assert (out / spec / f"{spec}.cubin").read_bytes()[:4] == b"\x7fELF"
    source = (out / spec / f"{spec}.cu").read_text()
    assert re.search(rf'^#line \d+ "{spec}\.tl"$', source, re.M)  # NVRTC errors map back to .tl lines
    # Every Compute on S is its own fragment op; the launch struct is read off the program.
    fields = [f["name"] for f in meta["abi"][f"{spec}_params"]["fields"]]
    tensors = [t["name"] for t in meta["launch"]["tensors"]]
    assert all(f"{t}_ptr" in fields for t in tensors)
    if spec == "b2b_gemm_relu":
        assert "acc_S(i) = tlc::max(x0, 0.0f);" in source and "exp2f" not in source and tensors == ["A", "B", "C", "O"]
    if spec == "chain3_fwd":
        assert source.count("tiled_mma.call(d_, ") == 3 and tensors == ["A", "B", "C", "D", "O"]   # one MMA per GEMM
    if spec == "softcap_fwd":
        assert "acc_S(i) = tanhf(x0);" in source
    if spec == "mla_decode_fwd":  # scores replicated per warp, O split by columns across the 4 warps
        assert "Tensor tAsQ = make_tensor(sQ.data() + (Swizzle<3, 3, 3>{}(int(threadIdx.x % 32 % 16 * 64" in source
        assert "tiled_mma_n.call(d_, tArP(_, m_s, kb_1), tBrV(_, n_, kb_1), d_);" in source
    if spec == "mla_prefill_fwd":
        assert [t["cols"] for t in meta["launch"]["tensors"]] == [64, 64, 32, 32]


@pytest.mark.slow
def test_a_second_build_comes_from_the_disk_cache(builds, tmp_path) -> None:
    """The same spec, arch and bindings again: a cache hit (no NVRTC), byte-identical artifacts."""
    from tlc.backend_cute import cache

    out, _ = builds
    arch, defines = BUILDS["mha_fwd"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TLC_CACHE_DIR", str(out / "cache"))
        cache.clear_memory()  # the workers filled the disk cache, not this process's memory
        meta = build_one(str(SPECS / "mha_fwd.tl"), arch, str(tmp_path), defines)
    assert meta["cached"]
    for suffix in ("cubin", "cu"):
        assert (tmp_path / f"mha_fwd.{suffix}").read_bytes() == (out / "mha_fwd" / f"mha_fwd.{suffix}").read_bytes()


@pytest.mark.parametrize("spec, defines, reason", [
    ("mla_decode_fwd", {"BM": "64"}, "registers per thread"),  # 64 rows: O alone is 256 registers
])
def test_unsupported_specs_fail_with_a_reason(tmp_path, spec: str, defines: dict, reason: str) -> None:
    _, message, code, *_ = _build_reporting((str(SPECS / f"{spec}.tl"), "sm_90", str(tmp_path), defines))
    assert code == 1
    assert reason in message and "Traceback" not in message
