"""The sm_90a lowering's first step (docs/hopper.md): wgmma with the sm_80-family cp.async copies.

Goldens (tests/lowering/sm90a.kirtest, FileCheck in process) of the kernel IR and the CuTe for the
shipped specs, refusals at the TL statement's file:line:col, and that the other targets never see a
Hopper op. No NVRTC here (tests/nvrtc/test_sm90a_nvrtc.py compiles; tests/gpu/test_sm90a_specs_gpu.py runs).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.lowering.variants import PV, _sub
from tests.unit.test_backend_emit import filecheck
from tlc.diagnostics import TlcError
from tlc.kir.ops import walk
from tlc.kir.ops_sm90 import SM90_OP_CLASSES, WgmmaOp
from tlc.lowering.emit_text import emit_text, kernel_ir

ROOT = Path(__file__).resolve().parents[2]
SPECS = ROOT / "specs"
GOLDEN = Path(__file__).with_name("sm90a.kirtest")
SEPARATOR = re.compile(r"^// -----\s*$", re.M)


def _emit(case: str) -> str:
    spec = re.search(r"^// TL: (\S+)(.*)$", case, re.M)
    what = re.search(r"^// EMIT: (kir|cute)$", case, re.M)
    assert spec and what, case
    path = SPECS / spec.group(1)
    defines = dict(kv.split("=", 1) for kv in spec.group(2).split())
    # A binding the spec does not declare (a schedule choice such as WarpSpecialize) becomes a Param line
    # at the end, so the spec's line numbers hold.
    source = path.read_text()
    extra = {k: v for k, v in defines.items() if not re.search(rf"^Param {k}\b", source, re.M)}
    source += "".join(f"\nParam {k} = {v}" for k, v in extra.items())
    defines = {k: v for k, v in defines.items() if k not in extra}
    out = emit_text(source.encode(), str(path.relative_to(ROOT)), "sm_90a", defines, what.group(1),
                    line_directives=False)
    return out


CASES = [c for c in SEPARATOR.split(GOLDEN.read_text()) if "CHECK" in c]


@pytest.mark.parametrize("case", CASES, ids=lambda c: re.search(r"^// TL: (.*)$", c, re.M).group(1))
def test_sm90a_goldens(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.setenv("TLC_FOLD_PARTITIONS", "0")   # the RUN line's: the lowering's own ops (folding: test_fold_partitions)
    output = _emit(case)
    rc = filecheck(case, output, tmp_path)
    report = capsys.readouterr()
    assert rc == 0, f"{report.out}{report.err}"


def test_no_shared_to_register_loads_and_wgmma_for_each_gemm() -> None:
    """prefetch-operands has nothing to do: wgmma reads its shared operands through descriptors. Each GEMM
    is issued at three sites (overlap-gemms peels the first Q·Kᵀ and the last P·V; split-masked-trips
    runs the loop twice, the trips before the diagonal without masks)."""
    program = kernel_ir(SPECS / "mha_fwd.tl", "sm_90a", {"Causal": True})
    text = emit_text((SPECS / "mha_fwd.tl").read_bytes(), "mha_fwd.tl", "sm_90a", {}, "kir")
    assert "s2r_" not in text and not re.search(r"\bMmaOp\(", text) and "LDSM" not in text
    assert [op.kind for op in walk(program) if type(op).__name__ == "WgmmaTiledMmaOp"] == ["SS", "RS"]
    assert [op.mma for op in walk(program) if isinstance(op, WgmmaOp)] == ["wgmma_S", "wgmma_S", "wgmma_O", "wgmma_S",
                                                                            "wgmma_O", "wgmma_O"]


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_89", "sm_90"])
@pytest.mark.parametrize("spec", ["mha_fwd", "gqa_fwd", "b2b_gemm_relu"])
def test_other_targets_see_no_hopper_op(arch: str, spec: str) -> None:
    program = kernel_ir(SPECS / f"{spec}.tl", arch, {"HeadDim": 64} if spec != "b2b_gemm_relu" else {})
    assert not [op for op in walk(program) if isinstance(op, SM90_OP_CLASSES)]


@pytest.mark.parametrize("spec", ["b2b_gemm_relu", "chain3_fwd", "softcap_fwd", "mqa_fwd"])
def test_other_specs_of_the_two_forms_lower(spec: str) -> None:
    """Programs whose GEMMs are Q·Kᵀ-like (SS) or P·V-like (RS) lower op by op, whatever else they compute."""
    program = kernel_ir(SPECS / f"{spec}.tl", "sm_90a", {"Causal": True} if spec == "mqa_fwd" else {})
    gemms = {op.mma for op in walk(program) if isinstance(op, WgmmaOp)}
    assert len(gemms) == (3 if spec == "chain3_fwd" else 2)


MHA = (SPECS / "mha_fwd.tl").read_text()
# (program text or spec, -D, file:line:col of the refusal, words of the message)
REFUSALS = {
    "bm32": ("mha_fwd", {"BM": "32"}, "mha_fwd.tl:39:3", "one warp group (4 warps) per 64 rows"),
    "bm320": ("mha_fwd", {"BM": "320", "HeadDim": "64"}, "mha_fwd.tl:39:3", "BM = 64, 128, 192 or 256"),
    "head_dim_320": ("mha_fwd", {"HeadDim": "320", "BM": "64"}, "mha_fwd.tl:45:3",
                     "N must be a multiple of 8 up to 256"),
    "warps_disagree": ("gqa_fwd", {"Warps": "4"}, "gqa_fwd.tl:41:3", "Param Warps = 4, but --arch sm_90a"),
    "mla_prefill_warps": ("mla_prefill_fwd", {"Warps": "4"}, "mla_prefill_fwd.tl:44:3", "needs Warps = 8"),
    "mla_decode": ("mla_decode_fwd", {}, "mla_decode_fwd.tl:49:3", "this GEMM has M = 16"),
    "k_both_majors": (_sub(PV, "  Compute GEMM P, K and accumulate O"), {}, "gemm_pk.tl:45:3",
                      "reads shared tile 'K' MN-major, an earlier one K-major"),
}


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_refusals_point_at_the_tl_statement(name: str) -> None:
    source, defines, where, words = REFUSALS[name]
    if "\n" in source:
        data, path = source.encode(), "gemm_pk.tl"
    else:
        data, path = (SPECS / f"{source}.tl").read_bytes(), f"specs/{source}.tl"
    with pytest.raises(TlcError) as info:
        emit_text(data, path, "sm_90a", defines, "kir")
    (d,) = [d for d in info.value.diagnostics if d.severity == "error"]
    assert f"{Path(d.loc.file).name}:{d.loc.line}:{d.loc.col}" == where and words in d.message, d.message


def test_cli_show_and_refusal(capsys: pytest.CaptureFixture[str]) -> None:
    from tlc.cli import main

    assert main(["show", str(SPECS / "mha_fwd.tl"), "--arch", "sm_90a", "--emit", "cute"]) == 0
    out = capsys.readouterr().out
    # Two GEMMs, each issued at three sites (overlap-gemms: the peeled first Q·Kᵀ, the last P·V after the
    # loop; split-masked-trips: the loop without masks and the loop of the partial last tile).
    assert out.count("warpgroup_arrive();") == 6 and '#line 39 "mha_fwd.tl"' in out
    assert main(["show", str(SPECS / "mla_decode_fwd.tl"), "--arch", "sm_90a", "--emit", "kir"]) == 1
    err = capsys.readouterr().err
    assert "mla_decode_fwd.tl:49:3: error:" in err and "Traceback" not in err


# CuTe's wgmma thread-value layouts (cute/atom/mma_traits_sm90_gmma.hpp): (thread, value) → m + 64·col.
def _c_tv(n: int):
    from pycute import Layout
    return Layout(((4, 8, 4), (2, 2, n // 8)), ((128, 1, 16), (64, 8, 512)))


def _a_tv():
    from pycute import Layout
    return Layout(((4, 8, 4), (2, 2, 2)), ((128, 1, 16), (64, 8, 512)))   # RS A, 64×16: m + 64·k


@pytest.mark.parametrize("n", [16, 64, 128, 256])
def test_acc_to_a_regroup_gives_the_rs_operand_layout(n: int) -> None:
    """preamble_sm90.cuh's acc_to_a: A value (c, r, j) of k16 slice s is C value (c, r, 2s + j), i.e.
    C's (2, 2, N/8) mode split as (2, 2, (2, N/16)); every register then holds the element of P the
    RS wgmma expects (row m, column 16·s + k), for every thread of the warp group."""
    c, a = _c_tv(n), _a_tv()
    for t in range(128):
        for s in range(n // 16):
            for v in range(8):
                cc, r, j = v % 2, v // 2 % 2, v // 4
                have = c((t, cc + 2 * r + 4 * (2 * s + j)))
                want = a((t, v))
                assert (have % 64, have // 64) == (want % 64, 16 * s + want // 64), (t, s, v)


def test_rowcol_rows_are_the_thread_rows() -> None:
    """preamble_sm90.cuh's rowcol: a thread's rows are mode (0, 1) of the C layout (r, r + 8) and its
    columns modes (0, 0) and (0, 2): every value in row mi of the view sits in one matrix row, and
    the 4 lanes of a quad (the AllReduceOp's shuffles) hold the same two rows."""
    c = _c_tv(64)
    for t in range(128):
        for mi in range(2):
            rows = {c((t, cc + 2 * mi + 4 * j)) % 64 for cc in range(2) for j in range(8)}
            assert len(rows) == 1
            quad = {c((t ^ x, 2 * mi)) % 64 for x in range(4)}
            assert quad == rows


@pytest.mark.parametrize("d,width", [(40, 64), (96, 128), (160, 192), (224, 256)])
def test_head_dims_pad_to_whole_gmma_atoms(d: int, width: int) -> None:
    """Tile widths pad to 64 columns (the 128-byte atom); the TMA boxes read zeros past the tensor's d."""
    from tlc.kir.ops_sm90 import GmmaSmemLayoutOp, TmaLoadOp

    program = kernel_ir(SPECS / "mha_fwd.tl", "sm_90a", {"HeadDim": d, "BM": 64} if d > 128 else {"HeadDim": d})
    shapes = {op.name: op.shape for op in walk(program) if isinstance(op, GmmaSmemLayoutOp)}
    assert shapes["sQ_layout"][1] == width and shapes["sK_layout"][1] == width
    loads = [op for op in walk(program) if isinstance(op, TmaLoadOp) and op.dst == "sK"]
    assert [op.dst_coord[1] for op in loads] == list(range(0, width, 64))
