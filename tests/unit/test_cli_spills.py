"""A build that spills says why in its output: the registers a thread may hold, what the kernel's data
needs (largest users first) and the knob that lowers it; `tlc check` says the same from the estimate."""
from __future__ import annotations

from pathlib import Path

import tlc.backend_cute.compile
from tlc.cli import main

MHA = str(Path(__file__).resolve().parents[2] / "specs" / "mha_fwd.tl")
USE = ("128 for Allocate O in register, 64 for result of the GEMM at line 39, 24 for per-row statistics (m, l, m_1, "
       "m_2, alpha, l_1), 48 for the GEMM's operand fragments")
KNOB = ("each of the 4 warps computes 32 of the block's 128 rows: Param Warps = 8 gives each 16, halving its "
        "accumulators' registers; a smaller BM or BN lowers them too")


def _ptxas_says(monkeypatch, spilled: int) -> None:
    """compile_kir without NVRTC: ptxas' report is what the test says (the default mha_fwd.tl spills 24-48 B
    at 255 registers, by NVRTC version)."""
    def compile_kir(program, arch, **_):
        meta = {"program": "mha_fwd", "ptxas": {"registers": 255, "spill_store_bytes": spilled}}
        return tlc.backend_cute.compile.CompiledKernel(program, arch, "// cu", b"cubin", meta, 0.1)
    monkeypatch.setattr(tlc.backend_cute.compile, "compile_kir", compile_kir)


def test_a_build_that_spills_says_why_and_which_knob_lowers_it(tmp_path, capsys, monkeypatch) -> None:
    """Before: '255 registers, 32 B spilled' and an estimate that said 'expect spills', with no cause or fix."""
    _ptxas_says(monkeypatch, 32)
    assert main(["build", MHA, "--arch", "sm_90", "-o", str(tmp_path)]) == 0
    out = capsys.readouterr()
    assert (f"{MHA}:39:3: warning: tlc build (sm_90): ptxas spilled 32 B of registers to local memory: a thread may "
            f"hold 255 registers, and the kernel's data needs about 264 at its hungriest GEMM before addresses and "
            f"temporaries ({USE}); {KNOB}") in out.err
    assert "expect spills" not in out.err   # ptxas' count replaces the estimate
    assert "255 registers, 32 B spilled" in out.out


def test_a_build_that_does_not_spill_says_nothing_of_it(tmp_path, capsys, monkeypatch) -> None:
    _ptxas_says(monkeypatch, 0)
    assert main(["build", MHA, "--arch", "sm_90", "-o", str(tmp_path), "-D", "BN=32"]) == 0
    assert "spill" not in capsys.readouterr().err


def test_check_names_what_takes_the_registers_and_the_knob(capsys) -> None:
    assert main(["check", MHA, "--arch", "sm_90"]) == 0
    assert ("warning: registers: about 264 per thread at the hungriest GEMM (estimate, data only) exceeds 255 on "
            f"sm_90; expect spills: {USE}; {KNOB}") in capsys.readouterr().err
