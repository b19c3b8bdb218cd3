"""The row max a program names (`Softmax S with max m`) keeps its meaning through online-softmax:
reading it after the loop gives the max of the scores as the program scaled them."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tlc.api import compile_graph, lower_source
from tlc.ir.interpreter import run_program

MHA = (Path(__file__).resolve().parents[2] / "specs" / "mha_fwd.tl").read_text()
DIVIDE = "Compute Divide O, l and get new O\n"
PROGRAMS = {
    "max_after_loop": MHA.replace(DIVIDE, DIVIDE + "Compute Add O, m and get new O\n"),
    "plain": MHA,
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("sq, sk, scale", [(17, 70, 0.125), (5, 130, 2.0), (1, 1, 0.3)])
def test_passes_keep_the_programs_meaning(name, sq, sk, scale):
    text, defines = PROGRAMS[name], {"HeadDim": "32", "BM": "64", "BN": "32"}
    raw = lower_source(text, f"{name}.tl", defines=defines)
    built, _ = compile_graph(text, f"{name}.tl", defines=defines)
    gen = torch.Generator().manual_seed(sq * 7 + sk)
    tensors = {n: torch.randn(1, 2, rows, 32, generator=gen, dtype=torch.float64)
               for n, rows in (("Q", sq), ("K", sk), ("V", sk))}
    tensors["O"] = torch.full((1, 2, sq, 32), float("nan"), dtype=torch.float64)
    scalars = {"seqlen_q": sq, "seqlen_k": sk, "scale": scale}
    want = run_program(raw, {k: v.clone() for k, v in tensors.items()}, scalars)["O"]
    got = run_program(built, {k: v.clone() for k, v in tensors.items()}, scalars)["O"]
    assert torch.allclose(got, want, rtol=1e-9, atol=1e-9), (got - want).abs().max()


def test_reading_the_max_inside_the_loop_is_refused_at_its_line():
    from tlc.diagnostics import TlcError
    text = "  Compute GEMM P, V and accumulate O\n  Compute Add O, m and get new O\n".join(
        MHA.rsplit("  Compute GEMM P, V and accumulate O\n", 1))
    with pytest.raises(TlcError, match="only the running value exists") as exc:
        compile_graph(text, "in_loop.tl")
    line = exc.value.diagnostics[0].loc.line
    assert text.splitlines()[line - 1].strip() == "Compute Add O, m and get new O"


def test_the_scale_is_still_folded_when_the_max_is_not_read():
    from tlc.ir.ops import ElementwiseOp
    built, _ = compile_graph(MHA, "mha.tl")
    assert not any(isinstance(op, ElementwiseOp) and op.fn == "mul" and "scale" in str(op.operands)
                   for _, op in built.walk() if not isinstance(op, type(None)))
