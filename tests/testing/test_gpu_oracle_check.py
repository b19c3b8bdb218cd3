"""`tlc test --gpu` for a program without a Variant compares the kernel with the program as written (the
elements it leaves unwritten included), not with attention. No GPU here: the kernel IR on the tile evaluator
stands in for the launch, through the same comparison the GPU check runs."""
from __future__ import annotations

from pathlib import Path

import torch

from tlc.builder import lower_to_kernel_ir
from tlc.kir.tile_eval import evaluate_program
from tlc.testing.checks import Shapes
from tlc.testing.gpu_check import _oracle_check
from tlc.testing.oracle import oracle_for
from tlc.testing.checks import as_graph

ROOT = Path(__file__).resolve().parents[2]
# b2b_gemm_relu.tl without its Variant line: checked against itself as written
TEXT = "\n".join(line for line in (ROOT / "specs" / "b2b_gemm_relu.tl").read_text().splitlines()
                 if not line.startswith("Param Variant")) + "\n"
DEFINES = {"K1": "32", "N2": "32", "BM": "64", "BN": "32"}


class TileEvalKernel:
    """The kernel IR evaluated on the CPU, called like a built kernel (inputs, out=, Inputs by keyword)."""

    def __init__(self, scale: float = 1.0):
        state, _ = lower_to_kernel_ir(TEXT.encode(), "b2b.tl", "sm_90", DEFINES, name="b2b")
        self.kir, self.abi, self.scale = state.kir, state.abi, scale
        self.inputs = [a for a in state.abi.tensors if not a.output]
        self.outputs = [a for a in state.abi.tensors if a.output]

    def __call__(self, *tensors, out=None, **inputs):
        given = {a.name: t.double() for a, t in zip(self.inputs, tensors)}
        rows = {"seqlen_q": tensors[0].shape[2], "seqlen_k": tensors[1].shape[2]}
        got = evaluate_program(self.kir, self.abi, given, {**rows, **inputs})[self.outputs[0].name]
        out.copy_((got * self.scale).to(out.dtype))
        return out


def _check(kernel):
    graph = as_graph(TEXT, DEFINES)
    oracle = oracle_for(lambda: as_graph(TEXT, DEFINES))
    assert oracle.as_written is not None and "as written" in oracle.label
    return _oracle_check(kernel, graph, torch.bfloat16, oracle, device="cpu")


def test_the_kernel_is_compared_with_the_program_as_written() -> None:
    check = _check(TileEvalKernel())
    for sq, sk in ((1, 1), (17, 33), (65, 40)):
        result = check(Shapes(1, 2, 2, {"seqlen_q": sq, "seqlen_k": sk}), seed=sq)
        assert result.ok, result.message


def test_a_kernel_that_computes_something_else_fails() -> None:
    result = _check(TileEvalKernel(scale=1.1))(Shapes(1, 2, 2, {"seqlen_q": 17, "seqlen_k": 33}), seed=1)
    assert not result.ok and "as written" in result.message
