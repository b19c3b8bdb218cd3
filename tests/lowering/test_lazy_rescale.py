"""`lazy-rescale`: a stale running max within 2^8 after exp2, and the output rescaled only when a row of
the warp moved its max. Structure (sm_90a by default, sm_90 when asked), the switch, and tile-evaluated
equality with the interpreter on scores that grow from tile to tile (so the max does move, past the
threshold), with planted bugs caught. GPU: tests/gpu/test_sm90a_specs_gpu.py runs the default."""
from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import pytest
import torch

from tests.lowering.test_tile_eval import CASES, TOL, lowered, reference
from tlc.api import compile_graph
from tlc.diagnostics import TlcError
from tlc.kir import ops as K
from tlc.kir.expr import BinOp, Var
from tlc.kir.tile_eval import evaluate_program
from tlc.kir.transforms.attention.lazy_rescale import lazy_rescale
from tlc.lowering.passes import run_lowering

SPECS = Path(__file__).resolve().parents[2] / "specs"


def _lower(arch: str, **defines: str):
    path = SPECS / "mha_fwd.tl"
    graph, _ = compile_graph(path.read_bytes(), str(path), defines=defines)
    return run_lowering(graph, arch, name="mha_fwd")[0]


def _votes(kir) -> list[K.WarpAnyOp]:
    return [op for op in K.walk(kir) if isinstance(op, K.WarpAnyOp)]


def test_the_rescale_runs_under_a_warp_vote_and_the_max_moves_past_the_threshold() -> None:
    state = _lower("sm_90a", Causal="true")
    votes = _votes(state.kir)
    assert votes and all(str(v.fn) == "x != 1.0" and v.vec == "alpha" for v in votes)
    guarded = [op for op in K.walk(state.kir) if isinstance(op, K.IfOp) and op.cond in {Var(v.name) for v in votes}]
    assert len(guarded) == len(votes) and all(
        [type(b) for b in op.body] == [K.RowBroadcastOp] and op.body[0].target == "rO" for op in guarded)
    maxes = {str(op.fn) for op in K.walk(state.kir) if isinstance(op, K.MapOp) and op.target == "m_2"}
    assert maxes == {"select((x1 - x0) * scale_log2e > 8.0, x1, x0)"}
    alphas = {str(op.fn) for op in K.walk(state.kir) if isinstance(op, K.MapOp) and op.target == "alpha"}
    assert all(a.startswith("select(x0 == x1, 1.0, exp2(") for a in alphas)
    assert any(n.startswith("lazy-rescale: rO rescaled only when") for n in state.schedule)


def test_where_it_runs_and_the_switch() -> None:
    assert not _votes(_lower("sm_90a", LazyRescale="false").kir)
    assert not _votes(_lower("sm_90").kir) and _votes(_lower("sm_90", LazyRescale="true").kir)
    path = SPECS / "mha_fwd.tl"
    text = path.read_text() + "\nParam LazyRescale = 1"
    graph, _ = compile_graph(text.encode(), str(path))
    with pytest.raises(TlcError, match=re.escape("Param LazyRescale = 1: use true or false")) as exc:
        run_lowering(graph, "sm_90a", name="mha_fwd")
    (diag,) = exc.value.diagnostics
    assert diag.loc is not None and diag.loc.line == len(text.splitlines())


def _growing(case: str, sq: int, sk: int) -> tuple[dict, dict]:
    """Q·Kᵀ scores that grow along the keys (K rows scaled up to 6×): every tile raises each row's max,
    some by more than the threshold, so stale and moved maxes both occur."""
    graph, _, abi = lowered(case)
    heads, kv_heads = CASES[case][2]
    gen = torch.Generator().manual_seed(sq * 7 + sk)
    tensors = {}
    for arg in abi.tensors:
        if arg.output:
            continue
        n = sq if arg.rows == "seqlen_q" else sk
        t = torch.randn(1, heads if arg.head == "head_idx" else kv_heads, n, arg.cols, generator=gen)
        if arg.name == "K":
            t = t * torch.linspace(1.0, 6.0, n)[None, None, :, None]
        tensors[arg.name] = t.to(torch.bfloat16).double()
    return tensors, {"seqlen_q": sq, "seqlen_k": sk, "scale": 1.0 / math.sqrt(abi.tensors[0].cols)}


def _error(case: str, program: K.ProgramOp, sq: int, sk: int) -> float:
    _, _, abi = lowered(case)
    tensors, scalars = _growing(case, sq, sk)
    ref = reference(case, tensors, scalars, 1)["O"]
    got = evaluate_program(program, abi, tensors, scalars)["O"]
    return float("inf") if torch.isnan(got).any() else (got - ref).abs().max().item() / max(1.0, ref.abs().max().item())


def _mutate(program: K.ProgramOp, fix) -> K.ProgramOp:
    def block(ops):
        return tuple(fix(dataclasses.replace(op, **{r: block(getattr(op, r)) for r in op.regions}) if op.regions
                         else op) for op in ops)
    return dataclasses.replace(program, body=block(program.body))


@pytest.mark.parametrize("case", ["mha_causal_lazy", "gqa_lazy", "softcap_causal_lazy"])
@pytest.mark.parametrize("sq, sk", [(17, 150), (70, 96), (1, 33)])
def test_lazy_kernel_ir_equals_the_interpreter_on_growing_scores(case: str, sq: int, sk: int) -> None:
    assert _votes(lowered(case)[1])
    assert _error(case, lowered(case)[1], sq, sk) <= TOL


def test_planted_bugs_are_caught() -> None:
    case, program = "gqa_lazy", lowered("gqa_lazy")[1]
    never = _mutate(program, lambda op: dataclasses.replace(op, fn=BinOp("!=", Var("x"), Var("x")))
                    if isinstance(op, K.WarpAnyOp) else op)           # the vote never passes: O is never rescaled
    assert _error(case, program, 17, 150) <= TOL and _error(case, never, 17, 150) > TOL
    # A vote of the wrong sense is not checkable here: the evaluator has no lanes and its vote is the whole
    # tile's, and rescaling every row (alpha = 1 rows included) is always right.
    # Not checkable here: a max that never moves is a valid reference point in float64 (the evaluator's
    # precision); on the GPU its exp2 would overflow fp32, which tests/gpu's large-score cases would show.


def test_an_alpha_of_another_form_is_left_alone() -> None:
    """Only online softmax's own rescale factor exp2((m_old − m_new)·s) is made exactly 1 and voted on: a
    MapOp of m and m_2 computing something else keeps its meaning and the rescale stays unconditional."""
    kernel = lowered("gqa")[1].kernels()[0]          # sm_90, lazy-rescale off by default
    assert _votes(lazy_rescale(kernel)[0])

    def other(ops):
        return tuple(dataclasses.replace(op, fn=BinOp("-", Var("x0"), Var("x1")))
                     if isinstance(op, K.MapOp) and op.target == "alpha" else
                     dataclasses.replace(op, **{r: other(getattr(op, r)) for r in op.regions}) if op.regions
                     else op for op in ops)
    changed = dataclasses.replace(kernel, body=other(kernel.body))
    rewritten, notes = lazy_rescale(changed)
    assert not _votes(rewritten) and not notes and rewritten == changed


# Programs a stale running max would change: O divided by a function of l, the max read after the loop, an
# op on P before P·V. The pass proves its precondition on the TL graph and declines them (tlc.lowering.stale_max).
MHA_TEXT = (SPECS / "mha_fwd.tl").read_text()
STALE_BREAKERS = {
    "o_over_l_plus_1": MHA_TEXT.replace("Compute Divide O, l and get new O\n",
                                        "Compute Add l, 1.0 and get l2\nCompute Divide O, l2 and get new O\n"),
    "o_plus_max": MHA_TEXT.replace("Compute Divide O, l and get new O\n",
                                   "Compute Divide O, l and get new O\nCompute Add O, m and get new O\n"),
    "p_times_half": MHA_TEXT.replace("  Reshape P from", "  Compute Multiply P, 0.5 and get new P\n  Reshape P from"),
}
SMALL_LAZY = {"HeadDim": "64", "BM": "64", "BN": "32", "LazyRescale": "true"}


def _lowered_text(name: str, arch: str = "sm_90"):
    graph, _ = compile_graph(STALE_BREAKERS[name].encode(), f"{name}.tl", defines=SMALL_LAZY)
    state, _ = run_lowering(graph, arch, name=name)
    return graph, state


@pytest.mark.parametrize("arch", ["sm_90", "sm_90a"])
@pytest.mark.parametrize("name", sorted(STALE_BREAKERS))
def test_a_program_a_stale_max_would_change_keeps_the_exact_rescale(name: str, arch: str) -> None:
    _, state = _lowered_text(name, arch)
    assert not _votes(state.kir)
    assert any(n.startswith("lazy-rescale: not applied:") for n in state.schedule), state.schedule


def test_the_precondition_is_needed() -> None:
    """Forced onto O / (l + 1), the lazy rescale computes something else (the tile evaluator, float64)."""
    graph, state = _lowered_text("o_over_l_plus_1")
    kernel, _ = lazy_rescale(state.kir.kernels()[0])
    forced = dataclasses.replace(state.kir, body=tuple(kernel if isinstance(op, K.KernelOp) else op
                                                       for op in state.kir.body))
    assert _votes(forced)
    gen = torch.Generator().manual_seed(3)
    sq, sk = 17, 150
    tensors = {}
    for arg in state.abi.tensors:
        if not arg.output:
            t = torch.randn(1, 2, sq if arg.rows == "seqlen_q" else sk, arg.cols, generator=gen)
            tensors[arg.name] = (t * torch.linspace(1.0, 6.0, t.shape[2])[None, None, :, None] if arg.name == "K"
                                 else t).to(torch.bfloat16).double()
    scalars = {"seqlen_q": sq, "seqlen_k": sk, "scale": 0.125}
    from tlc.ir.interpreter import run_program
    want = run_program(graph, {**tensors, "O": torch.full((1, 2, sq, 64), float("nan"), dtype=torch.float64)},
                       scalars)["O"]

    def err(program) -> float:
        got = evaluate_program(program, state.abi, tensors, scalars)["O"]
        return float((got - want).abs().max()) / max(1.0, float(want.abs().max()))
    assert err(state.kir) <= TOL < err(forced)
