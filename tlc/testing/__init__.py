"""tlc.testing: property-test TL programs — hypothesis strategies for programs, shapes and
inputs, and checkers against the float64 references (docs/correctness.md). See docs/testing.md.

    from hypothesis import given
    from tlc.testing import tl_programs, with_shapes, check_interpreter

    @given(tl_programs(variant="attention").flatmap(with_shapes))
    def test_interpreter_matches_reference(case):
        text, shapes = case
        assert check_interpreter(text, shapes)
"""
from __future__ import annotations

from tlc.testing.checks import (RTOL, CheckResult, Shapes, check_interpreter, make_inputs, program_info,
                                random_tensor)
from tlc.testing.strategies import ProgramChoices, attention_shapes, inputs, program_choices, tl_programs, with_shapes
from tlc.testing.structural import (StructuralChoices, output_difference, reference_graph, structural_choices,
                                    structural_program, structural_programs)

try:  # the one tolerance rule (docs/correctness.md) for low-precision (GPU) outputs lives with the backend
    from tlc.testing_tolerance import *  # noqa: F401,F403
    from tlc import testing_tolerance as _tol

    _TOLERANCE = [n for n in getattr(_tol, "__all__", dir(_tol)) if not n.startswith("_")]
except ImportError:
    _TOLERANCE = []

__all__ = ["RTOL", "CheckResult", "Shapes", "check_interpreter", "make_inputs", "program_info", "random_tensor",
           "ProgramChoices", "attention_shapes", "inputs", "program_choices", "tl_programs", "with_shapes",
           "StructuralChoices", "output_difference", "reference_graph", "structural_choices", "structural_program",
           "structural_programs",
           *_TOLERANCE]
