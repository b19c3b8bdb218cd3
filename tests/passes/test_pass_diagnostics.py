"""Done-when: wrong Reshapes, GEMM shape mismatches, ambiguous `.T` and undefined loop
bounds get exactly one diagnostic, at the right line, and `tlc check` exits 1."""
from __future__ import annotations

from pathlib import Path

import pytest

from tlc.cli import main
from tlc.diagnostics import TlcError
from tlc.frontend.lower import lower_program
from tlc.frontend.parser import parse_text
from tlc.ir.irparser import parse_ir
from tlc.passes.pipeline import run_pipeline

SPEC = Path(__file__).resolve().parents[2] / "specs" / "mha_fwd.tl"


def _line_of(text: str, start: str) -> int:
    return next(i for i, ln in enumerate(text.split("\n"), 1) if ln.strip().startswith(start))


BREAKAGES = {  # name → (edit of the spec text, the statement the one diagnostic must point at)
    "wrong_reshape": (lambda t: t.replace("to (MMA_A", "to (MMA_B"), "Reshape P"),
    "reshape_to_acc": (lambda t: t.replace("to (MMA_A", "to (MMA_C"), "Reshape P"),
    "gemm_mismatch": (lambda t: t.replace("Compute GEMM P, V and", "Compute GEMM P, Q and"), "Compute GEMM P"),
    "gemm_square_ambiguous": (lambda t: t.replace("Compute GEMM Q, K.T and get S", "Compute GEMM Q, Q and get S"),
                              "Compute GEMM Q"),
}


@pytest.mark.parametrize("name", sorted(BREAKAGES))
def test_one_diagnostic_at_the_right_line(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edit, statement = BREAKAGES[name]
    text = edit(SPEC.read_text())
    assert text != SPEC.read_text()
    graph = lower_program(parse_text(text, "broken.tl"))
    with pytest.raises(TlcError) as exc:
        run_pipeline(graph)
    diags = exc.value.diagnostics
    assert [(d.severity, d.loc.line) for d in diags] == [("error", _line_of(text, statement))], exc.value.render()
    path = tmp_path / "broken.tl"
    path.write_text(text)
    assert main(["check", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.count(": error:") == 1 and f"broken.tl:{_line_of(text, statement)}:" in err


def test_undefined_loop_bound_in_ir_is_one_error_at_the_loop() -> None:
    ir = """tl.program "b.tl"
input seqlen_k : int
%O = allocate() {name = O, space = global, shape = (`seqlen_k`, `4`), dtype = bf16, offset = none} : global(seqlen_k, 4) bf16  loc(3:1)
%O.1 = allocate() {name = O, space = register, shape = (`4`, `4`), dtype = fp32, offset = none} : register(4, 4) fp32  loc(4:1)
loop() {var = n, start = `0`, stop = `seqlen_k / BN`} ^(%n : scalar int) [
  yield
]  loc(7:1)
%O.2 = elementwise(%O.1) {fn = exp} : register(4, 4) fp32  loc(8:1)
%O.3 = copy(%O.2, %O) {src_space = register, dst_space = global, tile = (`4`, `4`), coord = [L = `block_idx`], oob = absent} : global(4, 4) bf16  loc(9:1)
"""
    with pytest.raises(TlcError) as exc:
        run_pipeline(parse_ir(ir))
    assert [(d.loc.line, "'BN' in the loop bound is not defined" in d.message) for d in exc.value.diagnostics] \
        == [(7, True)]


def test_undefined_loop_bound_in_tl_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bound.tl"
    path.write_text(SPEC.read_text().replace("for n = 0:seqlen_k / BN", "for n = 0:seqlen_kv / BN"))
    assert main(["check", str(path)]) == 1
    assert capsys.readouterr().err.count(": error:") == 1
