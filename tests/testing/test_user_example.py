"""The example from docs/testing.md, as a user would copy it into their own suite:
property-test your own TL program (and generated ones) against the float64 reference."""
from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings

from tlc.testing import attention_shapes, check_interpreter, tl_programs, with_shapes

MY_PROGRAM = Path(__file__).resolve().parents[2] / "specs" / "softcap_fwd.tl"
DEFINES = {"HeadDim": 5, "BM": 3, "BN": 4, "Causal": "true"}   # small, odd sizes for the CPU


@settings(max_examples=25, deadline=None)
@given(shapes=attention_shapes(MY_PROGRAM, defines=DEFINES))
def test_my_program_matches_reference(shapes):
    result = check_interpreter(MY_PROGRAM, shapes, defines=DEFINES)
    assert result.ok, result.describe()   # e.g. "max relative error 3.1e-01 at batch 0, head 1, row 2"


@settings(max_examples=25, deadline=None)
@given(tl_programs(variant="attention", causal=True, kv="head_idx / group").flatmap(with_shapes))
def test_generated_causal_gqa_programs(case):
    text, shapes = case
    assert check_interpreter(text, shapes).ok
