"""NVRTC compiles of TL specs lowered for sm_90a, no GPU: the PTX holds wgmma.mma_async (SS for Q·Kᵀ, RS
for P·V); the default schedule (warp-specialize, overlap-gemms) loads with TMA bulk tensor copies on
mbarriers, reallocates registers (setmaxnreg) and overlaps the GEMMs (wait_group 1); the cp.async
schedule (`Param WarpSpecialize = false`) fences the async proxy after cp.async; a persistent kernel
draws its tiles with a global atomic. ptxas reports no
spills, no stack and no local memory (beyond what `PTXAS_BY_VERSION` allows one NVRTC release). ~25-60 s per kernel on a 2-core CPU machine; registers and
seconds are printed (`pytest -m slow -s tests/nvrtc/test_sm90a_nvrtc.py`).

ptxas differs between NVRTC releases in what it reports, so the few expectations that do are keyed by
NVRTC's version (`PTXAS_BY_VERSION`), each measured with the release it names. The install admits NVRTC
13.0-13.5 (setup.cfg) and the GPU machines run 13.0."""
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tlc.backend_cute.nvrtc import compile_options, nvrtc_version, parse_ptxas_info
from tlc.lowering.emit_text import emit_text

SPECS = Path(__file__).resolve().parents[2] / "specs"
BUILDS = {  # name → (spec, -D bindings, (SS wgmma shape, RS wgmma shape) as PTX spells them)
    "mha_d128": ("mha_fwd", {}, ("m64n64k16", "m64n128k16")),
    "mha_d128_causal": ("mha_fwd", {"Causal": "true"}, ("m64n64k16", "m64n128k16")),
    "gqa_d64": ("gqa_fwd", {"HeadDim": "64", "Warps": "8"}, ("m64n64k16", "m64n64k16")),
    "mha_d128_cpasync": ("mha_fwd", {"WarpSpecialize": "false"}, ("m64n64k16", "m64n128k16")),
    "mha_d128_tma_store": ("mha_fwd", {"TmaStore": "true"}, ("m64n64k16", "m64n128k16")),
    "mha_d128_causal_persistent": ("mha_fwd", {"Causal": "true", "Persistent": "true"}, ("m64n64k16", "m64n128k16")),
    # tlc.attention's d = 64 causal kernel: skip-masked-trips guards its masked trips' GEMMs
    "gqa_d64_bm192_causal": ("gqa_fwd", {"HeadDim": "64", "BM": "192", "BN": "128", "Warps": "12", "Causal": "true",
                                         "ReduceChains": "2", "SkipMaskedTrips": "true"}, ("m64n128k16", "m64n64k16")),
    # persistent, static tiles numbered heads fastest (causal): no tile counter, so no atomic
    "gqa_d64_causal_static_tiles": ("gqa_fwd", {"HeadDim": "64", "BM": "192", "BN": "128", "Warps": "12",
                                                "Causal": "true", "Persistent": "true", "StaticTiles": "true"},
                                    ("m64n128k16", "m64n64k16")),
    "mha_d128_traced_prefetch": ("mha_fwd", {"Trace": "true", "PrefetchTma": "true"}, ("m64n64k16", "m64n128k16")),
}


# What ptxas reports that depends on NVRTC's release, by NVRTC's `major.minor`:
# - "injected": the note ptxas prints where it adds a wgmma synchronisation the kernel did not write, which
#   happens only where skip-masked-trips puts wgmma under a branch (gqa_d64_bm192_causal): a wgmma.wait_group
#   (C7517) with NVRTC 13.5.37, a warpgroup.arrive (C7519) with 13.0.88. A release not listed may print either.
# - "ptxas": spill and stack bytes a build may have above zero: with 13.0.88 the causal persistent d = 128
#   kernel spills 4 bytes (168 registers; 13.5.37 spills none).
PTXAS_BY_VERSION = {
    "13.0": {"injected": "C7519", "ptxas": {"mha_d128_causal_persistent": {"spill_store_bytes": 4,
                                                                          "spill_load_bytes": 4,
                                                                          "stack_frame_bytes": 8}}},
    "13.5": {"injected": "C7517", "ptxas": {}},
}
INJECTED_SYNC_NOTES = ("C7517", "C7519")


def ptxas_allowance(case: str, version: str) -> dict[str, int]:
    """Spill and stack bytes ptxas may report for `case` under NVRTC `version` (zero unless measured)."""
    return PTXAS_BY_VERSION.get(version, {}).get("ptxas", {}).get(case, {})


def injected_sync_notes(log: str) -> set[str]:
    return {code for code in INJECTED_SYNC_NOTES if f"({code})" in log}


def expected_injected_notes(skips_masked_trips: bool, version: str) -> set[str] | None:
    """The notes expected for a build, or None where any non-empty set of them is right (an unmeasured release)."""
    if not skips_masked_trips:
        return set()
    measured = PTXAS_BY_VERSION.get(version, {}).get("injected")
    return {measured} if measured else None


def compile_with_ptx(source: str, name: str) -> tuple[str, str, float]:
    """(PTX, program log, seconds) of one NVRTC compile for sm_90a (ptxas runs too: -v info in the log)."""
    from cuda.bindings import nvrtc

    options = [o.encode() for o in compile_options("sm_90a")]
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    try:
        start = time.perf_counter()
        (status,) = nvrtc.nvrtcCompileProgram(prog, len(options), options)
        seconds = time.perf_counter() - start
        err, size = nvrtc.nvrtcGetProgramLogSize(prog)
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        log_text = log.rstrip(b"\x00 ").decode(errors="replace")
        assert status == nvrtc.nvrtcResult.NVRTC_SUCCESS, log_text[:4000]
        err, size = nvrtc.nvrtcGetPTXSize(prog)
        ptx = b" " * size
        nvrtc.nvrtcGetPTX(prog, ptx)
        return ptx.rstrip(b"\x00 ").decode(), log_text, seconds
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(BUILDS))
def test_spec_compiles_to_wgmma_for_sm90a(case: str) -> None:
    spec, defines, (ss, rs) = BUILDS[case]
    path = SPECS / f"{spec}.tl"
    text = path.read_text()
    schedule = {k: v for k, v in defines.items() if f"\nParam {k} " not in text}   # not declared: appended
    text += "".join(f"\nParam {k} = {v}" for k, v in schedule.items())
    defines = {k: v for k, v in defines.items() if k not in schedule}
    source = emit_text(text.encode(), str(path), "sm_90a", defines, "cute")
    ptx, log, seconds = compile_with_ptx(source, f"{spec}.cu")
    info = parse_ptxas_info(log)
    version = nvrtc_version()
    print(f"\nNVRTC {version} sm_90a {case}: {seconds:.1f} s, {info}")
    assert info["registers"] > 0
    allowance = ptxas_allowance(case, version)
    for key in ("spill_store_bytes", "spill_load_bytes", "stack_frame_bytes"):
        assert info.get(key, 0) <= allowance.get(key, 0), (key, info, version)
    assert not re.search(r"\b(ld|st)\.local\b", ptx) and ".local" not in ptx   # no local memory at all
    wgmma = re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k16)\.f32\.bf16\.bf16", ptx)
    assert wgmma and set(wgmma) == {ss, rs}, sorted(set(wgmma))
    assert "wgmma.fence.sync.aligned" in ptx and "wgmma.commit_group.sync.aligned" in ptx
    assert "wgmma.wait_group.sync.aligned 0" in ptx
    assert "ldmatrix" not in ptx and "mma.sync" not in ptx
    if schedule.get("WarpSpecialize") == "false":
        assert "fence.proxy.async.shared::cta" in ptx and "cp.async.cg.shared.global" in ptx
        assert "cp.async.bulk.tensor" not in ptx
    else:
        assert "cp.async.bulk.tensor.4d.shared::cluster.global" in ptx and "cp.async.cg" not in ptx
        if schedule.get("TmaStore") == "true":
            assert "cp.async.bulk.tensor.4d.global.shared::cta" in ptx     # the epilogue's TMA store
            assert "cp.async.bulk.wait_group.read 0" in ptx
        else:
            assert "cp.async.bulk.tensor.4d.global.shared::cta" not in ptx
        assert "mbarrier.try_wait.parity" in ptx and "mbarrier.arrive.expect_tx" in ptx
        consumer_regs = 160 if BUILDS[case][1].get("Warps") == "12" else 240    # three consumer groups: 160 each
        assert f"setmaxnreg.inc.sync.aligned.u32 {consumer_regs}" in ptx and "setmaxnreg.dec.sync.aligned.u32 24" in ptx
        assert "wgmma.wait_group.sync.aligned 1" in ptx          # overlap-gemms: Q·Kᵀ(n) retired, P·V(n−1) not
        assert "C7508" not in log, log                            # ptxas would say so if it ignored setmaxnreg
        # a wgmma synchronisation ptxas injected: only where skip-masked-trips put wgmma under a branch
        expected = expected_injected_notes(schedule.get("SkipMaskedTrips") == "true", version)
        found = injected_sync_notes(log)
        assert found == expected if expected is not None else bool(found), (version, found, log)
        # persistent: the producer draws tiles from the launch's counter; one tile per CTA draws none
        assert ("atom.global.add.u32" in ptx) == (schedule.get("Persistent") == "true"
                                                  and schedule.get("StaticTiles") != "true")
        assert ("prefetch.tensormap" in ptx) == (schedule.get("PrefetchTma") == "true")
        assert ("%smid" in ptx and "%clock64" in ptx) == (schedule.get("Trace") == "true")   # trace-phases' stamps
