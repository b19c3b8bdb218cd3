"""`tlc test --gpu`: the same hypothesis shapes, run through the built kernel on the GPU.

The kernel is built once (TL passes → lowering → NVRTC → launcher) and compared, example by
example, with the float64 reference under docs/correctness.md's tolerance rule (attention) or its
analogue for a back-to-back GEMM (the same product in the kernel's precision as the yardstick). A
program checked against itself as written, or against the author's reference, is compared with that
oracle's float64 outputs under 2e-2 · max(1, max|ref|) (tests/gpu/differential.py's bound), the
elements the program leaves unwritten included (outputs are NaN-poisoned before the launch).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from tlc.diagnostics import TlcError
from tlc.ir.graph import Graph
from tlc.reference import b2b_gemm_reference
from tlc.testing.checks import CheckResult, Shapes, make_inputs

GpuCheck = Callable[[Shapes, int], CheckResult]


def gpu_problem(arch: str | None) -> str | None:
    """Why the GPU check cannot run here, or None."""
    if not torch.cuda.is_available():
        return "no CUDA device is visible"
    try:
        from tlc.runtime import device_arch

        device_arch() if arch is None else None
    except TlcError as exc:
        return str(exc.diagnostics[0].message)
    return None


def _torch_dtype(graph: Graph) -> torch.dtype:
    return torch.float16 if str(graph.params.get("dtype", "bf16")) == "fp16" else torch.bfloat16


def _b2b_tolerance(out: torch.Tensor, a, b, c) -> tuple[bool, float, float]:
    ref = b2b_gemm_reference(a, b, c).float()
    low = torch.relu(a @ b.transpose(-1, -2)).to(a.dtype) @ c  # the product in the kernel's precision
    noise = ((ref + 0.3 - 0.3) - ref).abs().max().item() if ref.numel() else 0.0
    bound = 2 * (low.float() - ref).abs().max().item() + 2 * noise
    err = (out.float() - ref).abs().max().item() if ref.numel() else 0.0
    return bool(torch.isfinite(out.float()).all()) and err <= bound, err, bound


ORACLE_RTOL = 2e-2


def make_gpu_check(path: str | Path, graph: Graph, defines: Mapping[str, Any], arch: str | None,
                   oracle=None) -> GpuCheck:
    """Build the kernel for `path` once; return a checker for (shapes, seed). `oracle` (a
    tlc.testing.oracle.Oracle) that is the program as written or the author's reference replaces the
    Variant's reference."""
    import tlc
    from tlc.testing_tolerance import check_attention

    kernel = tlc.build(Path(path), arch=arch, defines=dict(defines))
    dtype = _torch_dtype(graph)
    variant = str(graph.params.get("Variant", "attention"))
    if oracle is not None and (oracle.as_written is not None or oracle.function is not None):
        return _oracle_check(kernel, graph, dtype, oracle)

    def check(shapes: Shapes, seed: int) -> CheckResult:
        stored, ref_in, scalars = make_inputs(graph, shapes, seed)
        # The kernel reads each global tensor as the program stores it (the interpreter's layout);
        # the reference takes them as (seq, cols). Runtime Inputs go by name; row counts come from the tensors.
        args = [stored[t.name].to(device="cuda", dtype=dtype) for t in kernel.inputs]
        ref_args = [ref_in[t.name].to(device="cuda", dtype=dtype) for t in kernel.inputs]
        runtime = {name: scalars[name] for name, _ in kernel.abi.inputs if name in scalars}
        runtime.update({name: scalars[name].cuda() for name, _, _ in kernel.abi.tensor_inputs if name in scalars})
        try:
            out = kernel(*args, **runtime)
        except TlcError as exc:
            return CheckResult(False, math.inf, None, f"launch refused: {exc.diagnostics[0].message}", shapes, seed)
        torch.cuda.synchronize()
        out = out[0] if isinstance(out, tuple) else out
        if variant == "b2b_gemm":
            ok, err, bound = _b2b_tolerance(out, *ref_args)
            return CheckResult(ok, err, None, f"GPU: max|out-ref|={err:.3e} bound={bound:.3e}", shapes, seed)
        report = check_attention(out, *ref_args[:3], scale=scalars.get("scale"),
                                 causal=bool(graph.params.get("Causal")),
                                 alignment=str(graph.params.get("Align", "top_left")),
                                 softcap=float(graph.params.get("Softcap", 0) or scalars.get("Softcap", 0)) or None)
        return CheckResult(report.passed, report.max_err, None, f"GPU: {report.message}", shapes, seed)

    return check


def _oracle_check(kernel, graph: Graph, dtype: torch.dtype, oracle, device: str = "cuda") -> GpuCheck:
    """The kernel against `oracle`'s float64 outputs on the same (dtype-rounded) inputs (`device`: where the
    kernel takes its tensors; the CPU tests pass a tile-evaluator kernel and "cpu")."""
    from tlc.testing.checks import outputs_of
    from tlc.testing.structural import output_difference

    def check(shapes: Shapes, seed: int) -> CheckResult:
        stored, ref_in, scalars = make_inputs(graph, shapes, seed, dtype)
        outputs = outputs_of(graph, shapes)
        expected = oracle.expected(outputs, stored, ref_in, scalars)
        args = [stored[t.name].to(device=device, dtype=dtype) for t in kernel.inputs]
        runtime = {name: scalars[name] for name, _ in kernel.abi.inputs if name in scalars}
        runtime.update({name: scalars[name].to(device) for name, _, _ in kernel.abi.tensor_inputs if name in scalars})
        first = next(o for o in outputs if o.name == kernel.outputs[0].name)
        poisoned = torch.full(stored[first.name].shape, float("nan"), device=device, dtype=dtype)
        try:
            out = kernel(*args, out=poisoned, **runtime)
        except TlcError as exc:
            return CheckResult(False, math.inf, None, f"launch refused: {exc.diagnostics[0].message}", shapes, seed)
        out = (out[0] if isinstance(out, tuple) else out).double().cpu()   # waits for the kernel
        want = expected[first.name]
        got = out.transpose(-1, -2) if first.transposed else out
        if not oracle.compares_written_elements:
            got, want = got.nan_to_num(math.inf), want.nan_to_num(math.inf)
        why, err = output_difference(got, want)
        ok = not why and err <= ORACLE_RTOL
        return CheckResult(ok, err, None, f"GPU vs {oracle.label}: {why or f'max relative error {err:.3e}'}",
                           shapes, seed)

    return check
