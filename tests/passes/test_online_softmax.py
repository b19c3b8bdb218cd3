"""online-softmax: the explicit online form keeps the loop-domain meaning of Softmax
(hypothesis, against the interpreter and the float64 reference), folds the scale, adds the
final division when the program lacks it, and is idempotent."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from softmax_props import apply, cases, interpret, keeps_meaning
from tlc.ir.ops import ElementwiseOp, FullOp, LoopOp, ScalarOp, ScaledExpOp, SoftmaxOp
from tlc.ir.printer import print_graph
from tlc.passes.base import PassContext
from tlc.passes.online_softmax import LOG2E, OnlineSoftmaxPass
from tlc.testing.checks import Shapes, as_graph
from tests.spec_files import ONE_KERNEL_SPECS

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted(p for p in ONE_KERNEL_SPECS if "Softmax" in p.read_text())  # GEMM chains have none
ONLINE = OnlineSoftmaxPass()


def nothing(graph) -> None:
    pass


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_keeps_meaning(case) -> None:
    program, sh, seed = case
    outcome = keeps_meaning(program.render(), nothing, apply(ONLINE), sh, seed)
    assert outcome, outcome.why


def rewrite(path_or_text, **defines):
    g = as_graph(path_or_text, {k: str(v) for k, v in defines.items()})
    ctx = PassContext()
    ONLINE.apply(ctx, g)
    ctx.sink.raise_if_errors()
    return g, ctx


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_specs_become_online_and_idempotent(spec: Path) -> None:
    g, ctx = rewrite(spec)
    assert not any(isinstance(op, SoftmaxOp) for _, op in g.walk())
    inits = [op for _, op in g.walk() if isinstance(op, FullOp)]
    assert sorted(op.value for op in inits) == [float("-inf"), 0.0]
    once = print_graph(g)
    ONLINE.apply(ctx, g)
    assert print_graph(g) == once


def test_scale_is_folded_with_log2e_and_remarked() -> None:
    g, ctx = rewrite(Path(ROOT / "specs" / "mha_fwd.tl"))
    loop = next(op for _, op in g.walk() if isinstance(op, LoopOp))
    body = loop.body.ops()
    assert not any(isinstance(op, ElementwiseOp) and op.fn == "mul" and op.operands[0].base == "S" for op in body)
    scalar = next(op for op in body if isinstance(op, ScalarOp))
    assert str(scalar.expr) == f"scale * {LOG2E!r}"
    assert all(op.operands[-1] is scalar.result for op in body if isinstance(op, ScaledExpOp))
    lines = {d.loc.line: d.message for d in ctx.sink.items if d.severity == "remark"}
    assert "folded" in lines[40] and "online softmax" in lines[42]


def test_accumulator_rescaled_and_stats_carried() -> None:
    g, _ = rewrite(Path(ROOT / "specs" / "mha_fwd.tl"))
    loop = next(op for _, op in g.walk() if isinstance(op, LoopOp))
    assert len(loop.operands) == 3 and len(loop.results) == 3  # O, m, l: no exports left
    alpha = next(op for op in loop.body.ops() if isinstance(op, ScaledExpOp) and op.operands[0] is loop.args[2])
    rescale = [op for op in loop.body.ops() if isinstance(op, ElementwiseOp) and op.operands == (loop.args[1], alpha.result)]
    assert len(rescale) == 1


NORMALISED = """\
Param BM = 8
Param BN = 8
Param D = 8
Input seqlen_q, seqlen_k : int
Input scale : float
Allocate Q in global (seqlen_q, D) with offset head_idx
Allocate K in global (seqlen_k, D) with offset head_idx
Allocate V in global (seqlen_k, D) with offset head_idx
Allocate O in global (seqlen_q, D) with offset head_idx
Allocate O in register (BM, D)
Copy Q (BM, D) in coordinate [L = block_idx] from global to shared
for n = 0:seqlen_k / BN
  Copy K (BN, D) in coordinate [L = n] from global to shared
  Copy V (BN, D) in coordinate [L = n] from global to shared
  Compute GEMM Q, K.T and get S
  Compute Multiply S, scale and get new S
  Compute Softmax S and get P
  Reshape P from (MMA_C, MMA_M, MMA_N) to (MMA_A, MMA_M, MMA_N) as bf16
  Compute GEMM P, V and accumulate O
end
Copy O (BM, D) in coordinate [L = block_idx] from register to global
"""


def test_missing_division_is_added_with_a_remark() -> None:
    g, ctx = rewrite(NORMALISED)
    divs = [op for op in g.ops() if isinstance(op, ElementwiseOp) and op.fn == "div"]
    assert len(divs) == 1 and divs[0].loc.line == 17
    assert any("added the final division" in d.message and d.loc.line == 17 for d in ctx.sink.items)
    sh = Shapes(1, 1, 1, {"seqlen_q": 17, "seqlen_k": 31}, {"scale": 0.3})
    assert keeps_meaning(NORMALISED, nothing, apply(ONLINE), sh, 3)


SINGLE_TILE = """\
Param BM = 8
Param BN = 16
Param D = 8
Input seqlen_q, seqlen_k : int
Input scale : float
Allocate Q in global (seqlen_q, D) with offset head_idx
Allocate K in global (seqlen_k, D) with offset head_idx
Allocate V in global (seqlen_k, D) with offset head_idx
Allocate O in global (seqlen_q, D) with offset head_idx
Copy Q (BM, D) in coordinate [L = block_idx] from global to shared
Copy K (BN, D) in coordinate [L = 0] from global to shared
Copy V (BN, D) in coordinate [L = 0] from global to shared
Compute GEMM Q, K.T and get S
Compute Multiply S, scale and get new S
Compute Softmax S and get P
Reshape P from (MMA_C, MMA_M, MMA_N) to (MMA_A, MMA_M, MMA_N) as bf16
Compute GEMM P, V and get O
Copy O (BM, D) in coordinate [L = block_idx] from register to global
"""


@pytest.mark.parametrize("seqlen_k", [1, 5, 16])
def test_softmax_outside_a_loop_is_per_tile(seqlen_k: int) -> None:
    g, _ = rewrite(SINGLE_TILE)
    assert not any(isinstance(op, (SoftmaxOp, LoopOp, FullOp)) for op in g.ops())
    sh = Shapes(1, 2, 2, {"seqlen_q": 9, "seqlen_k": seqlen_k}, {"scale": 0.5})
    assert keeps_meaning(SINGLE_TILE, nothing, apply(ONLINE), sh, 1)


def test_negative_multiplier_is_not_folded() -> None:
    text = NORMALISED.replace("Compute Multiply S, scale", "Compute Multiply S, -0.5")
    g, ctx = rewrite(text)
    assert any(isinstance(op, ElementwiseOp) and op.fn == "mul" and op.operands[0].base == "S"
               for _, op in g.walk())
    assert not any("folded" in d.message for d in ctx.sink.items)
    sh = Shapes(1, 1, 1, {"seqlen_q": 9, "seqlen_k": 20}, {"scale": 0.5})
    g0 = as_graph(text)
    assert (interpret(g0, sh, 0)[0] - interpret(g, sh, 0)[0]).abs().max() < 1e-12


def test_stat_used_inside_the_loop_is_an_error() -> None:
    text = NORMALISED.replace("Compute Softmax S and get P", "Compute Softmax S with max m, sum l and get P\n"
                              "  Compute Multiply S, l and get T")
    g = as_graph(text)
    ctx = PassContext()
    ONLINE.apply(ctx, g)
    assert [d.loc.line for d in ctx.sink.errors] == [18]


def test_row_count_falls_back_to_the_accumulator() -> None:
    """Scores with no tile shape in reach (a sketch): the running max takes O's rows."""
    from tlc.frontend.lower import lower_program
    from tlc.frontend.parser import parse_text

    text = ("Allocate O in register (BM, D)\nCopy Q from global to shared\nfor n = 0:N\n"
            "  Copy K from global to shared\n  Copy V from global to shared\n"
            "  Compute GEMM Q, K.T and get S\n  Compute Softmax S\n  Compute GEMM S, V and accumulate O\nend\n")
    g = lower_program(parse_text(text), sketch=True)
    ctx = PassContext()
    ONLINE.apply(ctx, g)
    assert not ctx.sink.errors
    assert [tuple(map(str, op.shape)) for op in g.ops() if isinstance(op, FullOp)] == [("BM",)] * 2
