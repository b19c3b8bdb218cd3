"""`emulate-exp2` (`Param Exp2Poly = k`): every k-th exp2 of a thread's scores by tlc::exp2_poly on the FMA
pipe. Off by default; the pass marks every score exp2 site (the peeled trip's and both split loops'),
the emitter tests the column, a bad value is one error. The polynomial: tests/unit/test_exp2_poly.py;
on the GPU: tests/gpu/test_sm90a_specs_gpu.py's `*_exp2poly` cases."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tlc.api import compile_graph
from tlc.backend_cute.emit import emit_program
from tlc.diagnostics import TlcError
from tlc.kir import ops as K
from tlc.lowering.passes import run_lowering

SPECS = Path(__file__).resolve().parents[2] / "specs"


def _lower(arch: str = "sm_90a", text: str | None = None, **defines: str):
    path = SPECS / "mha_fwd.tl"
    graph, _ = compile_graph((text or path.read_text()).encode(), str(path), defines=defines)
    return run_lowering(graph, arch, name="mha_fwd")[0]


@pytest.mark.parametrize("arch", ["sm_90", "sm_90a"])
def test_every_score_exp2_site_takes_the_polynomial_column(arch: str) -> None:
    assert {op.poly_every for op in K.walk(_lower(arch, Causal="true").kir) if isinstance(op, K.Exp2ScaleOp)} == {0}
    state = _lower(arch, Causal="true", Exp2Poly="4")
    sites = [op for op in K.walk(state.kir) if isinstance(op, K.Exp2ScaleOp)]
    assert sites and {op.poly_every for op in sites} == {4}
    assert any(n.startswith("emulate-exp2: every 4th exp2 of ") for n in state.schedule)
    src = emit_program(state.kir, line_directives=False)
    assert src.count("? tlc::exp2_poly(acc_S_rc(mi, ni) * scale_ - max_scaled) : exp2f(") == len(sites)
    assert len(re.findall(r"ni % 4 == 3 \?", src)) == len(sites)


def test_a_bad_value_is_one_error_at_its_param() -> None:
    text = (SPECS / "mha_fwd.tl").read_text() + "\nParam Exp2Poly = 65"
    with pytest.raises(TlcError, match=re.escape("Param Exp2Poly = 65: use 0 (off) or k from 1 to 64")) as exc:
        _lower(text=text)
    (diag,) = exc.value.diagnostics
    assert diag.loc is not None and diag.loc.line == len(text.splitlines())
