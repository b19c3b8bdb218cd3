"""The issue's done-when for the repairs: for every spec, deleting its Reshape line (or
dropping / adding a `.T` whose intent is unique) gives the same final IR as the original
plus one remark at the right line; each pass is idempotent; layouts check afterwards."""
from __future__ import annotations

import pytest

from spec_variants import MY_PIPELINE, SPECS, VARIANTS, available_pipeline, lower, make_variant
from tlc.diagnostics import TlcError
from tlc.ir.interpreter import InterpError, run_program
from tlc.ir.printer import print_graph
from tlc.passes.base import PassContext
from tlc.passes.pipeline import parse_pipeline, run_pipeline
from tlc.testing.checks import Shapes, make_inputs

SMALL = {"HeadDim": "16", "DQK": "24", "DV": "16", "K1": "16", "N2": "8", "BM": "16", "BN": "8"}
REPAIRS = [k for k in VARIANTS if k != "orig"]


def _defines(spec) -> dict[str, str]:
    text = spec.read_text()
    return {k: v for k, v in SMALL.items() if f"Param {k} " in text}


def _compile(text: str, name: str, defines: dict[str, str], pipeline: list[str]) -> tuple[str, PassContext]:
    g = lower(text, name, defines)
    ctx = run_pipeline(g, pipeline, ctx=PassContext())
    return print_graph(g, with_locs=False), ctx


def _orig(spec):
    v = make_variant(spec, "orig")
    assert v is not None
    return v


@pytest.mark.parametrize("kind", REPAIRS)
@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
@pytest.mark.parametrize("pipeline", ["mine", "default"])
def test_repair_gives_the_original_ir(spec, kind: str, pipeline: str) -> None:
    variant = make_variant(spec, kind)
    if variant is None:
        pytest.skip(f"{spec.stem} has nothing to break for {kind}")
    passes = MY_PIPELINE if pipeline == "mine" else available_pipeline()
    want, want_ctx = _compile(_orig(spec).text, spec.stem, _defines(spec), passes)
    got, ctx = _compile(variant.text, spec.stem, _defines(spec), passes)
    assert got == want
    assert not [d for d in want_ctx.sink.items if d.severity != "remark"]
    usual = [d.message for d in want_ctx.sink.items]  # later passes' own remarks, e.g. a folded scale
    remarks = [d for d in ctx.sink.items if d.severity == "remark"]
    for message in usual:
        remarks.remove(next(d for d in remarks if d.message == message))
    assert sorted(d.loc.line for d in remarks) == list(variant.remark_lines), [d.render() for d in remarks]
    assert all(d.loc.file == f"{spec.stem}.tl" for d in remarks)


@pytest.mark.parametrize("name", MY_PIPELINE)
@pytest.mark.parametrize("kind", list(VARIANTS))
@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_each_pass_is_idempotent(spec, kind: str, name: str) -> None:
    variant = make_variant(spec, kind)
    if variant is None:
        pytest.skip("variant does not apply")
    g = lower(variant.text, spec.stem, _defines(spec))
    upto = MY_PIPELINE[: MY_PIPELINE.index(name) + 1]
    run_pipeline(g, upto)
    once = print_graph(g)
    ctx = PassContext()
    for p in parse_pipeline(name):
        p.apply(ctx, g)
    assert print_graph(g) == once
    assert not ctx.sink.items, [d.render() for d in ctx.sink.items]


@pytest.mark.parametrize("spec", [p for p in SPECS if "\nReshape" in p.read_text() or "  Reshape" in p.read_text()],
                         ids=lambda p: p.stem)   # a program with a GEMM-to-GEMM Reshape to delete
def test_layout_check_fails_before_insert_reshape_and_passes_after(spec) -> None:
    variant = make_variant(spec, "no_reshape")
    assert variant is not None
    defines = _defines(spec)
    g = lower(variant.text, spec.stem, defines)
    shapes = Shapes(heads=2 if "group" in spec.read_text() else 1, ints={"seqlen_q": 19, "seqlen_k": 13},
                    floats={"scale": 0.25} if "scale" in g.inputs else {})
    if "b2b" in spec.stem:
        shapes.kv_heads = shapes.heads
    tensors, _, scalars = make_inputs(g, shapes, seed=1)
    run_pipeline(g, ["verify", "infer-shapes", "resolve-transpose"])
    with pytest.raises(InterpError, match="without a Reshape"):
        run_program(g, tensors, scalars, check_layouts=True)
    run_pipeline(g, ["insert-reshape"])
    out = run_program(g, tensors, scalars, check_layouts=True)
    orig = lower(_orig(spec).text, spec.stem, defines)
    want = run_program(orig, tensors, scalars, check_layouts=True)
    name = "O"
    assert out[name].isfinite().all()
    assert (out[name] - want[name]).abs().max() <= 1e-12


def test_wrong_reshape_target_is_one_error_at_its_line() -> None:
    spec = SPECS[0]
    text = _orig(spec).text
    line = next(i for i, ln in enumerate(text.split("\n"), 1) if ln.strip().startswith("Reshape"))
    broken = text.replace("to (MMA_A", "to (MMA_B")
    g = lower(broken, spec.stem, _defines(spec))
    with pytest.raises(TlcError) as exc:
        run_pipeline(g, MY_PIPELINE)
    assert [d.loc.line for d in exc.value.diagnostics] == [line]
    assert "MMA_B" in exc.value.diagnostics[0].message
