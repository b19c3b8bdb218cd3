"""Every TL pass keeps what a program means (specs/LANGUAGE.md), on structurally varied programs
(tlc.testing.structural, small tiles): the program is interpreted as written (frontend only, as
`tlc interp --no-passes` does) and after each pass of the default pipeline, on NaN-poisoned outputs at
odd sizes (1, 17, a tile ± 1, several tiles), and the results must be equal to 1e-9 relative,
including which output elements are written. A pass may instead refuse the program, at a line.

Exempt repairs, and why: a missing Reshape is not exempt, because the interpreter ignores fragment roles
(its values are the same with and without it; the layouts are checked after `insert-reshape`); a
slipped `.T` means nothing as written, so such a program is compared from after `resolve-transpose`.
Sizes at which the program as written has no meaning (a loop that runs no trip leaves its softmax
statistics undefined) are skipped."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tlc.api import lower_source
from tlc.diagnostics import TlcError
from tlc.ir.interpreter import InterpError, run_program
from tlc.passes.base import PassContext
from tlc.passes.pipeline import DEFAULT_PIPELINE, PassManager, parse_pipeline
from tlc.testing.checks import Shapes, make_inputs
from tlc.testing.structural import (StructuralChoices, head_counts, odd_lengths, output_difference,
                                    reference_graph, structural_choices)

torch.set_num_threads(1)
RTOL = 1e-9
FILE = "generated.tl"


def located(exc: TlcError) -> bool:
    return all(d.loc is not None and d.loc.line > 0 for d in exc.diagnostics)


def refusal(exc: TlcError, text: str) -> str:
    return f"refused without a line:\n{exc.render()}\n{text}"


def cases(choices: StructuralChoices, reference, seed: int):
    """(tensors, scalars, result as written, size) at every size where the program as written has a meaning."""
    heads, kv_heads = head_counts(choices)
    out = []
    for sq, sk in odd_lengths(choices):
        floats = {"scale": 0.7} if "scale" in reference.inputs else {}
        shapes = Shapes(batch=1, heads=heads, kv_heads=kv_heads, ints={"seqlen_q": sq, "seqlen_k": sk}, floats=floats)
        tensors, _, scalars = make_inputs(reference, shapes, seed)
        try:
            want = run_program(reference, tensors, scalars)["O"]
        except InterpError:
            continue
        out.append((tensors, scalars, want, f"{sq}x{sk}"))
    return out


def check_pipeline(choices: StructuralChoices, seed: int) -> None:
    text, defines = choices.render(), choices.defines_dict()
    try:
        reference = reference_graph(text, defines, FILE, meaningful_as_written=choices.as_written_meaningful)
    except TlcError as exc:   # the frontend refuses it: fine, at a line
        assert located(exc), refusal(exc, text)
        return
    examples = cases(choices, reference, seed)
    graph, ctx = lower_source(text, FILE, defines=defines), PassContext()
    comparing = choices.as_written_meaningful
    for p in parse_pipeline(",".join(DEFAULT_PIPELINE)):
        try:
            PassManager([p]).run(graph, ctx)
        except TlcError as exc:
            assert located(exc), refusal(exc, text)
            return
        comparing = comparing or p.name == "resolve-transpose"
        layouts = p.name in DEFAULT_PIPELINE[DEFAULT_PIPELINE.index("insert-reshape"):]
        if not comparing:
            continue
        for tensors, scalars, want, size in examples:
            got = run_program(graph, tensors, scalars, check_layouts=layouts)["O"]
            why, err = output_difference(got, want)
            assert not why and err <= RTOL, (f"after {p.name} at {size}: {why or f'max relative error {err:.3e}'}"
                                             f"\n{text}")


@settings(max_examples=200, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(choices=structural_choices(sizes="small"), seed=st.integers(0, 1 << 16))
def test_every_tl_pass_keeps_the_meaning_of_generated_programs(choices: StructuralChoices, seed: int) -> None:
    check_pipeline(choices, seed)


def test_a_pass_that_changes_the_meaning_fails_the_check(monkeypatch) -> None:
    """A planted bug (online softmax without the accumulator's rescale) makes the property fail."""
    import tlc.passes.online_softmax as online_mod

    plain = StructuralChoices(d_qk=4, d_v=4, qk_width=4, bm=4, bn=4)
    check_pipeline(plain, 0)
    monkeypatch.setattr(online_mod._Rewrite, "rescale_chain", lambda self, *a: None)
    with pytest.raises(AssertionError, match="after online-softmax"):
        check_pipeline(plain, 0)


def test_which_elements_are_written_is_part_of_the_comparison() -> None:
    want = torch.tensor([[[[1.0, 2.0], [float("nan"), float("nan")]]]])
    same, err = output_difference(want.clone(), want)
    assert (same, err) == ("", 0.0)
    written = want.nan_to_num(5.0)
    why, err = output_difference(written, want)
    assert "0 left unwritten that the program writes, 2 written that it leaves unwritten (rows 1)" in why
    assert err == 0.0
    why, _ = output_difference(torch.full_like(want, float("nan")), want)
    assert "2 left unwritten that the program writes, 0 written that it leaves unwritten (rows 0)" in why


def test_equal_infinities_are_equal_and_a_finite_value_is_not() -> None:
    """`Compute Add O, m` leaves -inf in rows without a finite score; both sides writing -inf agree."""
    inf = float("inf")
    want = torch.tensor([[[[1.0, -inf], [3.0, 2.0]]]])
    assert output_difference(want.clone(), want) == ("", 0.0)
    assert output_difference(torch.tensor([[[[1.0, 5.0], [3.0, 2.0]]]]), want)[1] == inf
    assert output_difference(torch.tensor([[[[1.0, -inf], [3.0, 2.5]]]]), want) == ("", 0.5 / 3.0)
