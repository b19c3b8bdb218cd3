"""tlc.testing: property-test TL programs — hypothesis strategies for programs, shapes and
inputs, and checkers against an oracle: the float64 reference of the program's `Param Variant`,
your own reference function, or (without a Variant) the program as written. See docs/testing.md.

    from pathlib import Path
    from hypothesis import given
    from tlc.testing import attention_shapes, check_program

    @given(attention_shapes(Path("my_window.tl")))
    def test_compiled_program_means_what_i_wrote(shapes):
        assert check_program(Path("my_window.tl"), shapes, reference=my_window_reference)
"""
from __future__ import annotations

from tlc.testing.checks import (RTOL, CheckResult, Shapes, check_against, check_interpreter, check_program,
                                make_inputs, program_info, random_tensor)
from tlc.testing.oracle import Oracle, ReferenceProblem, load_reference, oracle_for
from tlc.testing.strategies import (ProgramChoices, attention_shapes, default_max_len, edge_lengths, inputs, lengths,
                                    program_choices, tl_programs, with_shapes)
from tlc.testing.structural import (StructuralChoices, output_difference, reference_graph, structural_choices,
                                    structural_program, structural_programs)

try:  # the one tolerance rule (docs/correctness.md) for low-precision (GPU) outputs lives with the backend
    from tlc.testing_tolerance import *  # noqa: F401,F403
    from tlc import testing_tolerance as _tol

    _TOLERANCE = [n for n in getattr(_tol, "__all__", dir(_tol)) if not n.startswith("_")]
except ImportError:
    _TOLERANCE = []

__all__ = ["RTOL", "CheckResult", "Shapes", "check_against", "check_interpreter", "check_program", "make_inputs",
           "program_info", "random_tensor", "Oracle", "ReferenceProblem", "load_reference", "oracle_for",
           "ProgramChoices", "attention_shapes", "default_max_len", "edge_lengths", "inputs", "lengths",
           "program_choices", "tl_programs", "with_shapes",
           "StructuralChoices", "output_difference", "reference_graph", "structural_choices", "structural_program",
           "structural_programs",
           *_TOLERANCE]
