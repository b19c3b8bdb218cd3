"""One source of truth for what each target lowers: a program with an additive bias tile (a global tensor
loaded per tile and added to S), written the ways a user would, is refused by `tlc check` with the words
`tlc build` prints, at the Compute that reads the tile, saying what the targets do lower; every lowering
refusal names the target that gave it, and no sm_90a refusal speaks of sm_80."""
from __future__ import annotations

from pathlib import Path

import pytest

from tlc.cli import main
from tlc.passes.verify import LOWERED_OPERANDS

ROOT = Path(__file__).resolve().parents[2]
MHA_TEXT = (ROOT / "specs" / "mha_fwd.tl").read_text()
ADD = "  Compute Add S, Bias and get new S\n"


def _bias_program(tmp_path: Path, *, shared: bool, to_register: bool, columns: str = "seqlen_k") -> Path:
    """mha_fwd.tl with `Bias (seqlen_q, columns)` loaded per (query, key) tile and added to the scaled S:
    through shared memory (then copied to registers when `to_register`), or straight into registers."""
    space = "shared" if shared else "register"
    load = f"  Copy Bias (BM, BN) in coordinate [L = block_idx, C = n] from global to {space}\n"
    if shared and to_register:
        load += "  Copy Bias from shared to register\n"
    text = (MHA_TEXT
            .replace("Allocate O in global (seqlen_q, HeadDim) with offset head_idx\n",
                     "Allocate O in global (seqlen_q, HeadDim) with offset head_idx\n"
                     f"Allocate Bias in global (seqlen_q, {columns})\n")
            .replace("Allocate O in register (BM, HeadDim)\n",
                     f"Allocate O in register (BM, HeadDim)\nAllocate Bias in {space} (BM, BN)\n")
            .replace("  Compute Multiply S, scale and get new S\n",
                     "  Compute Multiply S, scale and get new S\n" + load + ADD))
    path = tmp_path / "bias.tl"
    path.write_text(text)
    return path


def _line_of(path: Path, text: str) -> int:
    return path.read_text().splitlines().index(text.rstrip("\n")) + 1


def _refusal(err: str) -> str:
    """The first diagnostic line of stderr."""
    return next(line for line in err.splitlines() if ": error: " in line)


@pytest.mark.parametrize("shared, to_register", [(True, True), (False, True)], ids=["via-shared", "to-register"])
@pytest.mark.parametrize("columns", ["seqlen_k", "4096"])
def test_a_bias_tile_is_refused_by_check_and_build_alike_at_its_compute(tmp_path, capsys, shared, to_register,
                                                                       columns) -> None:
    """Before: check and build refused the runtime column count first, then the register copy ('no sm_80
    lowering', on sm_90a too), each fix leading to the next refusal."""
    path = _bias_program(tmp_path, shared=shared, to_register=to_register, columns=columns)
    where = f"{path}:{_line_of(path, ADD)}:3: error: "
    for arch in ("sm_90", "sm_90a"):
        assert main(["build", str(path), "--arch", arch, "-o", str(tmp_path / "out")]) == 1
        built = _refusal(capsys.readouterr().err)
        assert built.startswith(f"{where}tlc build ({arch}): Compute Add reads 'Bias', a tile copied to registers")
        assert built.endswith(LOWERED_OPERANDS) and "sm_80 lowering" not in built
        assert main(["check", str(path), "--arch", arch]) == 1
        assert f"{arch}: {built}" in capsys.readouterr().err
    assert main(["check", str(path)]) == 1   # every target says it: once, under both names
    err = capsys.readouterr().err
    assert f"sm_90, sm_90a: {where}tlc build: Compute Add" in err and "tlc build (sm_90" not in err


def test_a_bias_tile_read_from_shared_memory_is_refused_saying_what_the_targets_lower(tmp_path, capsys) -> None:
    """Before: "'elementwise' reads 'Bias' from shared memory; copy it to registers", a copy the build then
    refused."""
    path = _bias_program(tmp_path, shared=True, to_register=False)
    assert main(["check", str(path)]) == 1
    err = _refusal(capsys.readouterr().err)
    assert err == (f"{path}:{_line_of(path, ADD)}:3: error: Compute Add reads 'Bias' from shared memory; as TL it "
                   f"needs a copy to registers, but no target builds that: {LOWERED_OPERANDS}")


@pytest.mark.parametrize("arch", ["sm_90", "sm_90a"])
def test_a_lowering_refusal_names_its_target_and_no_other(tmp_path, capsys, arch) -> None:
    """A copy from global to registers feeding a GEMM: before, both targets said 'has no sm_80 lowering'."""
    path = tmp_path / "k.tl"
    path.write_text(MHA_TEXT.replace("Allocate K in shared (BN, HeadDim)", "Allocate K in register (BN, HeadDim)")
                    .replace("Copy K (BN, HeadDim) in coordinate [L = n] from global to shared",
                             "Copy K (BN, HeadDim) in coordinate [L = n] from global to register")
                    .replace("  Copy K from shared to register\n", ""))
    assert main(["build", str(path), "--arch", arch, "-o", str(tmp_path / "out")]) == 1
    built = _refusal(capsys.readouterr().err)
    assert (f"error: tlc build ({arch}): 'K' is loaded from global memory into registers in a kernel with GEMMs"
            in built) and "copy it to shared memory as a GEMM operand" in built
    assert "sm_80" not in built
    assert main(["check", str(path), "--arch", arch]) == 1
    assert f"{arch}: {built}" in capsys.readouterr().err


def test_a_bias_read_straight_from_global_memory_says_what_the_targets_lower(tmp_path: Path, capsys) -> None:
    """`Compute Add S, Bias` with Bias only allocated in global: the frontend's refusal names what every target
    lowers, not a copy the next stage would refuse."""
    text = MHA_TEXT.replace("Allocate O in global (seqlen_q, HeadDim) with offset head_idx\n",
                            "Allocate O in global (seqlen_q, HeadDim) with offset head_idx\n"
                            "Allocate Bias in global (seqlen_q, seqlen_k)\n").replace(
        "  Compute Multiply S, scale and get new S\n", "  Compute Multiply S, scale and get new S\n" + ADD)
    path = tmp_path / "bias_global.tl"
    path.write_text(text)
    assert main(["check", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"bias_global.tl:{_line_of(path, ADD)}:" in err and LOWERED_OPERANDS in err
