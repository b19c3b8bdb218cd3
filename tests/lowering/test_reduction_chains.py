"""`reduction-chains` (Param ReduceChains): each row's max / sum in independent partial results
combined pairwise. The ops it marks, the C++ the emitter writes for them (checked by NVRTC with the
other sm_90a builds on the GPU machine's precompile, and by tests/gpu at d = 64, where tlc.attention
uses two chains), the refusal of other counts, and tlc.attention's table (tlc/attention/tuning.py)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tlc.api import compile_graph
from tlc.backend_cute.emit import emit_program
from tlc.diagnostics import TlcError
from tlc.kir import ops as K
from tlc.lowering.passes import run_lowering
from tlc.attention.kernels import attention_spec
from tlc.attention.tuning import default_schedule

SPECS = Path(__file__).resolve().parents[2] / "specs"


def _lower(arch: str, text: str | None = None, **defines: str):
    path = SPECS / "mha_fwd.tl"
    graph, _ = compile_graph((text or path.read_text()).encode(), str(path), defines=defines)
    return run_lowering(graph, arch, name="mha_fwd")[0]


def _reductions(kir) -> list[K.RowReduceOp]:
    return [op for op in K.walk(kir) if isinstance(op, K.RowReduceOp)]


@pytest.mark.parametrize("arch", ["sm_90", "sm_90a"])
def test_every_row_reduction_takes_the_chains_and_the_emitter_combines_them_pairwise(arch: str) -> None:
    assert {op.chains for op in _reductions(_lower(arch).kir)} == {1}
    state = _lower(arch, ReduceChains="4")
    ops = _reductions(state.kir)
    assert ops and {op.chains for op in ops} == {4} and {op.kind for op in ops} == {"max", "sum"}
    assert any(re.fullmatch(r"reduction-chains: \d+ row reduction\(s\) in 4 chains", n) for n in state.schedule)
    cute = emit_program(state.kir)
    assert "float r_[4];" in cute and ": -INFINITY;" in cute and ": 0.f;" in cute
    assert "r_[ni % 4] = fmaxf(r_[ni % 4], " in cute and "r_[ni % 4] = r_[ni % 4] + " in cute
    assert re.search(r"r_\[k\] = fmaxf\(r_\[k\], r_\[k \+ 2\]\);(.|\n)*r_\[k\] = fmaxf\(r_\[k\], r_\[k \+ 1\]\);", cute)
    assert "r_[" not in emit_program(_lower(arch).kir)


def test_other_counts_are_refused_at_the_param() -> None:
    text = (SPECS / "mha_fwd.tl").read_text() + "\nParam ReduceChains = 3"
    with pytest.raises(TlcError, match=re.escape("Param ReduceChains = 3: use 1, 2, 4 or 8")) as exc:
        _lower("sm_90a", text)
    assert exc.value.diagnostics[0].loc.line == len(text.splitlines())


def test_tlc_attention_uses_two_chains_at_d64_on_sm90a_only() -> None:
    def chains(*args):
        return default_schedule(*args).get("ReduceChains", 1)
    assert chains(64, 64, "sm_90a") == 2 == chains(40, 40, "sm_90a") == chains(64, 64, "sm_90a", True, 1024)
    assert chains(128, 128, "sm_90a") == 1 == chains(256, 256, "sm_90a") == chains(192, 128, "sm_90a")
    assert default_schedule(64, 64, "sm_90") == {"FoldLdmatrix": False}
    assert default_schedule(64, 64, "sm_90a") == {"ReduceChains": 2, "PrefetchNext": True}
    assert default_schedule(128, 128, "sm_90a") == {"PrefetchNext": True}
    assert attention_spec("bf16", 64, 64, True, "sm_90a")[1]["ReduceChains"] == 2
    assert "ReduceChains" not in attention_spec("bf16", 64, 64, True, "sm_90")[1]
