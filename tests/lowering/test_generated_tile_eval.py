"""Structurally varied programs (tlc.testing.structural, tile sizes the targets build) lowered for the
sm_80 family (`--arch sm_90`: TL passes, then the lowering passes down to kernel IR; no NVRTC) compute
what the program as written means: the tile evaluator (tlc.kir.tile_eval) against the TL interpreter
of the program before any pass, on bf16/fp16-valued inputs with NaN-poisoned outputs at odd sizes,
equal within 1e-2 of max(1, |expected|) (bf16 P and outputs, as tests/lowering/test_tile_eval.py) and
writing exactly the elements the program writes. A program the target cannot build must be refused
with a location (a line > 0), never with a traceback."""
from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tlc.builder import lower_to_kernel_ir
from tlc.diagnostics import TlcError
from tlc.ir.interpreter import InterpError, run_program
from tlc.kir.tile_eval import evaluate_program
from tlc.testing.checks import Shapes, make_inputs
from tlc.testing.structural import (StructuralChoices, choices_of_seed, head_counts, output_difference, reference_graph,
                                    structural_choices)

torch.set_num_threads(1)
ARCH = "sm_90"
TOL = 1e-2
FILE = "generated.tl"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def sizes(c: StructuralChoices) -> list[tuple[int, int]]:
    return [(1, 1), (17, 33), (c.bm + 1, 2 * c.bn + 1)]


def check_kernel_ir(choices: StructuralChoices, seed: int) -> None:
    text, defines = choices.render(), choices.defines_dict()
    try:
        reference = reference_graph(text, defines, FILE, meaningful_as_written=choices.as_written_meaningful)
        state, _ = lower_to_kernel_ir(text.encode(), FILE, ARCH, defines or {}, name="generated")
    except TlcError as exc:
        lines = [d.loc.line if d.loc else None for d in exc.diagnostics]
        assert all(line and line > 0 for line in lines), f"refused without a line:\n{exc.render()}\n{text}"
        return
    heads, kv_heads = head_counts(choices)
    for sq, sk in sizes(choices):
        floats = {"scale": 0.125} if "scale" in reference.inputs else {}
        shapes = Shapes(batch=1, heads=heads, kv_heads=kv_heads, ints={"seqlen_q": sq, "seqlen_k": sk}, floats=floats)
        tensors, _, scalars = make_inputs(reference, shapes, seed, DTYPES[choices.dtype])
        try:
            want = run_program(reference, tensors, scalars)["O"]
        except InterpError:   # no meaning at this size (a loop of no trips leaves its softmax undefined)
            continue
        inputs = {a.name: tensors[a.name] for a in state.abi.tensors if not a.output}
        got = evaluate_program(state.kir, state.abi, inputs, scalars)["O"]
        why, err = output_difference(got, want)
        assert not why and err <= TOL, f"{ARCH} at {sq}x{sk}: {why or f'max relative error {err:.3e}'}\n{text}"


@settings(max_examples=400, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(choices=structural_choices(sizes="target"), seed=st.integers(0, 1 << 16))
def test_generated_kernel_ir_equals_the_program_as_written(choices: StructuralChoices, seed: int) -> None:
    check_kernel_ir(choices, seed)


SEEDS = range(0, 400)   # the programs bench/differential_gpu.py runs as --seeds 0:400


def test_seeded_programs_kernel_ir_equals_the_program_as_written() -> None:
    """Every program of SEEDS (structural_program(seed)), all failures listed at once."""
    failures = []
    for seed in SEEDS:
        choices = choices_of_seed(seed)
        try:
            check_kernel_ir(choices, seed)
        except AssertionError as exc:
            failures.append(f"seed {seed}: {str(exc).splitlines()[0]} | {choices.describe()}")
    assert not failures, "\n".join(failures)


def test_a_kernel_that_differs_from_the_program_fails_the_check() -> None:
    """The check compares with the program as written: a kernel built from another program fails it."""
    plain = StructuralChoices()
    check_kernel_ir(plain, 0)
    text = plain.render()
    other = text.replace("Compute Multiply S, scale and get new S", "Compute Multiply S, 2.0 and get new S")
    state, _ = lower_to_kernel_ir(other.encode(), FILE, ARCH, {}, name="generated")
    reference = reference_graph(text)
    tensors, _, scalars = make_inputs(reference, Shapes(1, 2, 1, {"seqlen_q": 17, "seqlen_k": 33}, {"scale": 0.125}),
                                      0, torch.bfloat16)
    got = evaluate_program(state.kir, state.abi, {k: v for k, v in tensors.items() if k != "O"}, scalars)["O"]
    _, err = output_difference(got, run_program(reference, tensors, scalars)["O"])
    assert err > TOL


PAGED_SEEDS = range(0, 150)   # about a third build (the rest are refused at a line, as without pages)


def test_seeded_paged_programs_kernel_ir_equals_the_program_as_written() -> None:
    """The same programs with K and V read from pages through a block table (`structural_program(seed,
    paged=True)`: a row map; random table entries, some past the pool, read zeros in both)."""
    check_seeds(PAGED_SEEDS, paged=True)


def check_seeds(seeds, **choice: bool) -> None:
    """check_kernel_ir on each seed's program with the opt-in `choice`, every failure reported together."""
    failures = []
    for seed in seeds:
        choices = choices_of_seed(seed, **choice)
        try:
            check_kernel_ir(choices, seed)
        except AssertionError as exc:
            failures.append(f"seed {seed}: {str(exc).splitlines()[0]} | {choices.describe()}")
    assert not failures, "\n".join(failures)


WINDOW_SEEDS = range(0, 150)


def test_seeded_windowed_programs_kernel_ir_equals_the_program_as_written() -> None:
    """The same programs with their scores also masked outside a window of keys around the row
    (`choices_of_seed(seed, windowed=True)`: a predicate mask with one edge or both, beside any causal mask;
    the mask pass bounds the loop by the window and masks only its partial tiles)."""
    check_seeds(WINDOW_SEEDS, windowed=True)
