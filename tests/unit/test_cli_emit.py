"""`tlc show FILE --emit kir|cute`: the lowering's output without NVRTC, refusals as diagnostics."""
from __future__ import annotations

from pathlib import Path

from tlc.cli import main
from tlc.passes.pipeline import LOWERING_PIPELINE

SPECS = Path(__file__).resolve().parents[2] / "specs"


def test_emit_cute_prints_the_kernel_source(capsys) -> None:
    assert main(["show", str(SPECS / "mha_fwd.tl"), "--emit", "cute", "--arch", "sm_80"]) == 0
    out = capsys.readouterr().out
    assert out.count("tiled_mma.call(d_, ") == 2 and '#line 39 "mha_fwd.tl"' in out   # the two GEMMs' MMA atom calls


def test_emit_kir_shows_the_pipelined_loop(capsys) -> None:
    assert main(["show", str(SPECS / "gqa_fwd.tl"), "--emit", "kir", "-D", "Stages=2"]) == 0
    out = capsys.readouterr().out
    assert "ForOp(var=n" in out and "stages=2, prefetch=true" in out and "WaitOp(pending=1" in out


def test_emit_of_a_refused_program_is_a_located_error(capsys) -> None:
    assert main(["show", str(SPECS / "mla_decode_fwd.tl"), "-D", "BM=64", "--emit", "cute"]) == 1
    err = capsys.readouterr().err
    assert "mla_decode_fwd.tl:" in err and "registers" in err and "Traceback" not in err


def test_print_after_names_every_lowering_pass() -> None:
    import subprocess
    import sys
    args = [a for name in LOWERING_PIPELINE for a in ("--print-after", name)]
    run = subprocess.run([sys.executable, "-m", "tlc.cli", "show", str(SPECS / "mha_fwd.tl"), *args],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    for name in LOWERING_PIPELINE:
        assert f"IR after {name}" in run.stdout


def test_a_wgmma_n_outside_cutes_default_shapes_enables_the_extended_ones(capsys) -> None:
    """BN = 176: without CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED, before the first CuTe include, CuTe's selector
    falls back to eleven m64n16 wgmmas per k-step; the define costs front-end time, so only where needed."""
    args = ["show", str(SPECS / "gqa_fwd.tl"), "--arch", "sm_90a", "--emit", "cute", "-D", "HeadDim=128", "-D", "Warps=8"]
    assert main(args + ["-D", "BN=176"]) == 0
    out = capsys.readouterr().out
    assert out.index("#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED") < out.index("#include <cute/tensor.hpp>")
    assert "// wgmma N = 176: CuTe's extended GMMA shapes" in out
    assert main(args + ["-D", "BN=128"]) == 0
    assert "CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED" not in capsys.readouterr().out
