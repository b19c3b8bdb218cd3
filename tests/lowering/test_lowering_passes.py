"""The lowering passes: registry, golden FileCheck output, stage choice, resource errors,
and that BM/BN/warps/stages reach the emitted TiledMMA and shared layouts (no NVRTC)."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tlc.api import compile_graph
from tlc.arch import ARCHES, arch_info
from tlc.diagnostics import TlcError
from tlc.lowering.passes import run_lowering
from tlc.passes.registry import REGISTRY

ROOT = Path(__file__).resolve().parents[2]
MHA = ROOT / "specs" / "mha_fwd.tl"
sys.path.insert(0, str(ROOT / "tests" / "passes"))


# mha_fwd.tl with the schedule parameters declared, so -D Warps=… / -D Stages=… bind (lines shift by 2).
MHA_PARAMS = MHA.read_text().replace("Param BN = 64\n", "Param BN = 64\nParam Warps = 4\nParam Stages = 2\n")


def lower(defines: dict[str, str] | None = None, arch: str = "sm_90", path: Path = MHA):
    defines = defines or {}
    if {"Warps", "Stages"} & set(defines):
        graph, _ = compile_graph(MHA_PARAMS, str(path), defines=defines)
    else:
        graph, _ = compile_graph(path.read_bytes(), str(path), defines=defines)
    return run_lowering(graph, arch, name=path.stem)


def test_registry_names_match_classes() -> None:
    for name, factory in REGISTRY.items():
        assert factory().name == name
    assert {"lower-tile-ops", "infer-layouts", "insert-sync", "pipeline", "defer-reductions",
            "check-resources"} <= set(REGISTRY) and "select-atoms" not in REGISTRY


def test_arch_table() -> None:
    assert set(ARCHES) == {"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"}
    assert arch_info("sm_80").smem_per_block == 163 * 1024 and arch_info("sm_80").gpus["A100"] == 108
    assert arch_info("sm_86").smem_per_block == arch_info("sm_89").smem_per_block == 99 * 1024
    assert arch_info("sm_90").smem_per_block == 227 * 1024 and arch_info("sm_90").gpus["H200"] == 132
    assert all(a.regs_per_thread == 255 and a.regs_per_sm == 65536 for a in ARCHES.values())
    assert arch_info("sm_90").mma_path == "mma.sync" and not arch_info("sm_90").tma
    assert arch_info("sm_90a").mma_path == "wgmma" and arch_info("sm_90a").tma
    with pytest.raises(TlcError, match="unknown target 'sm_75'.*sm_80, sm_86"):
        arch_info("sm_75")


def test_golden_filecheck(capsys: pytest.CaptureFixture[str]) -> None:
    from test_filecheck_passes import compile_file, filecheck

    path = Path(__file__).with_name("mha_lowering.tl")
    run, output = compile_file(path)
    assert filecheck(path, output, run.check_prefix) == 0, capsys.readouterr().out + "\n" + output


def test_operand_loads_follow_resolve_transpose() -> None:
    """K read as K.T (k-major) → ldmatrix; V as stored (mn-major) → ldmatrix.trans; P from registers."""
    from tests.lowering.programs import gemms
    from tlc.kir.ops import TiledCopyOp, walk

    state, _ = lower()
    copies = {op.name: op.atom for op in walk(state.kir) if isinstance(op, TiledCopyOp)}
    (s_gemm, s_loads), (o_gemm, o_loads) = gemms(state.kir)
    assert [(copies[c], op.reads) for c, op in s_loads.items()] == [("SM75_U32x4_LDSM_N", ("sQ",)),
                                                                     ("SM75_U32x4_LDSM_N", ("sK",))]
    assert o_gemm.a == "tArP" and [(copies[c], op.reads) for c, op in o_loads.items()] == [
        ("SM75_U16x8_LDSM_T", ("sV",))]


@pytest.mark.parametrize("defines, arch, stages", [
    ({}, "sm_90", 2),                                     # 96 KB double-buffered fits everywhere
    ({"HeadDim": "256", "BM": "64", "BN": "64"}, "sm_86", 1),  # 2 stages: 160 KB > 99 KB
    ({"HeadDim": "256", "BM": "64", "BN": "64"}, "sm_80", 2),  # 160 KB ≤ 163 KB
    ({"Stages": "1"}, "sm_90", 1),                        # a Param fixes it
])
def test_stage_choice(defines: dict[str, str], arch: str, stages: int) -> None:
    state, _ = lower(defines, arch)
    assert state.stages == stages and state.resources.smem_bytes <= state.arch.smem_per_block


def test_hopper_path_lowers_gemms_to_wgmma() -> None:
    """--arch sm_90a: wgmma SS then RS (tests/lowering/test_sm90a_lowering.py has the rest)."""
    from tlc.kir.ops import walk
    from tlc.kir.ops_sm90 import WgmmaOp, WgmmaTiledMmaOp

    state, _ = lower(arch="sm_90a")
    kinds = [op.kind for op in walk(state.kir) if isinstance(op, WgmmaTiledMmaOp)]
    # overlap-gemms peels the first trip and issues the last P·V after the loop, split-masked-trips runs
    # the loop twice (before and from the partial last tile): each GEMM has three wgmma sites.
    assert kinds == ["SS", "RS"] and [op.mma for op in walk(state.kir) if isinstance(op, WgmmaOp)] == \
        ["wgmma_S", "wgmma_S", "wgmma_O", "wgmma_S", "wgmma_O", "wgmma_O"]


def test_over_limit_shared_memory_is_one_error_at_the_biggest_allocation() -> None:
    with pytest.raises(TlcError) as exc:
        lower({"BM": "256", "HeadDim": "256"}, "sm_86")
    smem = [d for d in exc.value.diagnostics if d.message.startswith("shared memory")]
    assert len(smem) == 1
    d = smem[0]
    assert d.loc.line == 28  # Allocate Q in shared (BM, HeadDim): 128 KB, the biggest
    assert "196608 bytes per block" in d.message and "101376 bytes (99 KB) of sm_86" in d.message
    assert re.search(r"sQ 131072 bytes, sK 32768 bytes, sV 32768 bytes", d.message)
    assert [n.loc.line for n in d.notes if n.loc] == [28, 29, 30]
    regs = [d for d in exc.value.diagnostics if d.message.startswith("registers")]
    assert len(regs) == 1 and regs[0].loc.line == 31 and "rO 512 registers" in regs[0].message


def test_same_program_fits_sm80_not_sm86() -> None:
    defines = {"HeadDim": "256", "BM": "64", "BN": "128"}
    state, _ = lower(defines, "sm_80")
    assert state.resources.smem_bytes == 163840
    with pytest.raises(TlcError, match="shared memory: the kernel needs 163840 bytes") as exc:
        lower(defines, "sm_86")
    assert exc.value.diagnostics[0].loc.line == 29  # sK: 64 KB, tied with sV, first


def test_register_estimate_warns_for_the_spilling_default() -> None:
    # bench/README.md: d=128, 128×64 tiles spill 48 bytes at 255 registers.
    state, ctx = lower()
    assert state.resources.regs_peak > 255
    assert any(d.severity == "warning" and "expect spills" in d.message for d in ctx.sink.items)
    state, ctx = lower({"BN": "32"})
    assert state.resources.regs_peak <= 255 and not ctx.sink.items


def _emitted(defines: dict[str, str]) -> tuple[str, str]:
    from tlc.backend_cute.emit import emit_program

    state, _ = lower({**defines, "FoldLdmatrix": "false"})   # CuTe's TiledMMA spells the warp layout
    src = emit_program(state.kir, line_directives=False)
    mma = re.search(r"TiledMMA[^;]*;|make_tiled_mma\([^;]*;", src)
    layouts = "\n".join(line for line in src.splitlines() if "Swizzle" in line or "tile_to_shape" in line)
    assert mma and layouts, src[:2000]
    return mma.group(0), layouts


@pytest.mark.parametrize("change", [{"BM": "64"}, {"BN": "32"}, {"Warps": "8"}, {"Stages": "1"}],
                         ids=lambda d: next(iter(d)))
def test_tile_parameters_change_the_emitted_mma_and_layouts(change: dict[str, str]) -> None:
    base_mma, base_layouts = _emitted({})
    mma, layouts = _emitted(change)
    if "Warps" in change:
        assert mma != base_mma
    else:
        assert layouts != base_layouts


def test_build_one_runs_the_lowering_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tlc build goes through the lowering passes (NVRTC stubbed out)."""
    import tlc.backend_cute.compile as compile_mod
    from tlc.builder import build_one

    seen = {}

    def fake_compile(program, arch, **kw):
        seen["program"] = program
        return compile_mod.CompiledKernel(program, arch, "// cu", b"cubin", {"program": program.name}, 0.0)

    monkeypatch.setattr(compile_mod, "compile_kir", fake_compile)
    meta = build_one(str(MHA), "sm_86", str(tmp_path), {"HeadDim": "64"})
    assert [t["name"] for t in meta["launch"]["tensors"]] == ["Q", "K", "V", "O"]
    assert any("2 stages for sK, sV" in line for line in meta["schedule"])
    assert seen["program"].kernels()[0].smem_bytes == 49152
    assert (tmp_path / "mha_fwd.cu").read_text() == "// cu"
    with pytest.raises(TlcError, match="shared memory"):
        build_one(str(MHA), "sm_86", str(tmp_path), {"HeadDim": "256", "BM": "64", "BN": "128"})
