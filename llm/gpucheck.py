"""Correctness of a model-written kernel on the GPU, in a child process.

A faulting kernel poisons its CUDA context (or kills the process), so the launch and the
comparison run in `python gpucheck.py <dir>`, never in tlc gen's own process. The parent
writes the cubin and a JSON spec into a temp dir and reads one JSON line back. This file
has no tlc/tlc_llm imports in the child path so it runs by file name.

Tolerance is FlashAttention's rule (docs/correctness.md): pass iff max|out − ref| ≤ 2·max|lowp − ref|
+ 2·noise, with ref in fp32 from the test-dtype inputs, lowp in the test dtype with the
scale applied to K, noise = max|(ref + 0.3 − 0.3) − ref| in the test dtype.
"""
from __future__ import annotations

import ast
import json
import operator
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHILD_TIMEOUT_S = 300
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
        ast.Div: operator.floordiv}


@dataclass(frozen=True)
class CorrectnessResult:
    correct: bool | None  # None: not checked (no GPU), which is not a failure
    summary: str


def _int_expr(text: str) -> int | None:
    """Evaluate `64 * 2`-style integer constants; anything else is not ours to guess."""
    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError(text)
    try:
        return ev(ast.parse(text.replace("u", "").strip(), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError):
        return None


def launch_constants(source: str) -> dict[str, int] | str:
    """BLOCK_M, NUM_THREADS, SMEM_BYTES from the source, or why they cannot be read."""
    found: dict[str, int] = {}
    for name in ("BLOCK_M", "NUM_THREADS", "SMEM_BYTES"):
        m = re.search(rf"(?:\bconstexpr\s+(?:static\s+)?[\w:]+|#\s*define)\s+{name}\b\s*=?\s*([^;\n]+)", source)
        value = _int_expr(m.group(1).rstrip(";")) if m else None
        if value is None or value < 0:
            return f"the source does not define {name} as an integer constant"
        found[name] = value
    if found["BLOCK_M"] <= 0 or not 0 < found["NUM_THREADS"] <= 1024:
        return "BLOCK_M must be positive and NUM_THREADS in 1..1024"
    return found


def gpu_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def cases_for(variant: str, causal: bool) -> list[dict[str, int]]:
    """Odd sizes on purpose: partial tiles are where hand-written kernels go wrong."""
    heads = {"gqa": (4, 2), "mqa": (4, 1)}.get(variant, (2, 2))
    if variant == "mla_decode":
        return [dict(batch=2, hq=4, hkv=4, sq=1, sk=777), dict(batch=1, hq=2, hkv=2, sq=2, sk=130)]
    shapes = [(128, 128), (200, 333), (333, 200)] if not causal else [(128, 128), (200, 333), (97, 97)]
    return [dict(batch=2, hq=heads[0], hkv=heads[1], sq=sq, sk=sk) for sq, sk in shapes]


def check_vanilla_on_gpu(source: str, cubin: bytes, request: Any) -> CorrectnessResult:
    if not gpu_available():
        return CorrectnessResult(None, "not checked (no CUDA GPU here)")
    constants = launch_constants(source)
    if isinstance(constants, str):
        return CorrectnessResult(False, f"cannot launch: {constants}")
    spec = {
        "dtype": request.dtype, "d_qk": request.d_qk, "d_v": request.d_v, "causal": request.causal,
        "alignment": request.alignment or "top_left", "cases": cases_for(request.variant, request.causal),
        **constants,
    }
    return _run_child("vanilla", {"kernel.cubin": cubin}, spec)


def _run_child(mode: str, files: dict[str, bytes], spec: dict[str, Any]) -> CorrectnessResult:
    with tempfile.TemporaryDirectory(prefix="tlc-gpucheck-") as tmp:
        for name, data in files.items():
            Path(tmp, name).write_bytes(data)
        Path(tmp, "spec.json").write_text(json.dumps(spec))
        try:
            proc = subprocess.run([sys.executable, __file__, mode, tmp], capture_output=True, text=True,
                                  timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return CorrectnessResult(False, f"kernel did not finish within {CHILD_TIMEOUT_S} s")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        return CorrectnessResult(False, f"kernel run failed in the child process: {tail}")
    report = json.loads(lines[-1])
    return CorrectnessResult(report["correct"], report["summary"])


def check_tl_on_gpu(tl_path: Path, cubin: bytes, arch: str, defines: dict[str, str], request: Any) -> CorrectnessResult:
    """tlc's launcher on a built `.tl` (or on an LLM translation's cubin under the same ABI),
    compared with the *request's* attention: a kernel that is right for another variant is wrong."""
    if not gpu_available():
        return CorrectnessResult(None, "not checked (no CUDA GPU here)")
    spec = {"arch": arch, "defines": defines, "stem": tl_path.stem, "tl_name": tl_path.name,
            "dtype": request.dtype, "d_qk": request.d_qk, "d_v": request.d_v, "causal": request.causal,
            "alignment": request.alignment or "top_left", "cases": cases_for(request.variant, request.causal)}
    return _run_child("tl", {"program.tl": tl_path.read_bytes(), "kernel.cubin": cubin}, spec)


# ---- child process -------------------------------------------------------------------------

def _reference(q, k, v, scale: float, causal: bool, alignment: str, dtype):
    """(ref, lowp): fp32 attention from the inputs, and the test-dtype one with the scale on K."""
    import torch

    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    sq, sk = q.shape[2], k.shape[2]
    mask = None
    if causal:
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        mask = j <= i + (sk - sq if alignment == "bottom_right" else 0)

    def attend(qq, kk, vv, lowp: bool):
        s = qq @ (kk * scale).transpose(-1, -2) if lowp else (qq @ kk.transpose(-1, -2)) * scale
        s = s.float()
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # fully masked rows give 0
        return (p.to(vv.dtype) @ vv).float() if lowp else p @ vv

    ref = attend(q.float(), k.float(), v.float(), lowp=False)
    lowp = attend(q, k, v, lowp=True)
    return ref, lowp


def _tolerance(out, q, k, v, scale: float, causal: bool, alignment: str, dtype) -> tuple[bool, str]:
    """tlc's one tolerance rule (tlc.testing_tolerance) when importable; else the same rule here."""
    try:
        from tlc.testing_tolerance import check_attention
    except ImportError:
        check_attention = None
    if check_attention is not None:
        report = check_attention(out, q, k, v, scale=scale, causal=causal, alignment=alignment)
        return bool(report.passed), report.message
    ref, lowp = _reference(q, k, v, scale, causal, alignment, dtype)
    noise = ((ref.to(dtype) + 0.3 - 0.3).float() - ref).abs().max().item()
    err = (out.float() - ref).abs().max().item()
    bound = 2 * (lowp - ref).abs().max().item() + 2 * noise
    return bool(err <= bound), f"max|out-ref|={err:.3e} bound={bound:.3e}"  # NaN fails the comparison


def _compare_cases(spec: dict[str, Any], run_kernel) -> None:
    """Poisoned outputs, odd shapes; prints the one JSON line the parent reads."""
    import torch

    dtype = torch.bfloat16 if spec["dtype"] == "bf16" else torch.float16
    torch.manual_seed(0)
    last = ""
    for case in spec["cases"]:
        b, hq, hkv, sq, sk = case["batch"], case["hq"], case["hkv"], case["sq"], case["sk"]
        q = torch.randn(b, hq, sq, spec["d_qk"], device="cuda", dtype=dtype)
        k = torch.randn(b, hkv, sk, spec["d_qk"], device="cuda", dtype=dtype)
        v = torch.randn(b, hkv, sk, spec["d_v"], device="cuda", dtype=dtype)
        o = torch.full((b, hq, sq, spec["d_v"]), float("nan"), device="cuda", dtype=dtype)  # poisoned
        scale = spec["d_qk"] ** -0.5
        run_kernel(q, k, v, o, scale)
        torch.cuda.synchronize()
        ok, message = _tolerance(o, q, k, v, scale, spec["causal"], spec["alignment"], dtype)
        shape = f"B={b} Hq={hq} Hkv={hkv} Sq={sq} Sk={sk}"
        if not ok:
            print(json.dumps({"correct": False, "summary": f"wrong at {shape}: {message}"}))
            return
        last = f"{message} at {shape}"
    print(json.dumps({"correct": True, "summary": f"correct on {len(spec['cases'])} shapes ({last})"}))


def _child_tl(directory: str) -> None:
    """Rebuild the launcher's view of the kernel (same passes, same kernel IR) around the given cubin."""
    import torch
    from tlc.api import compile_graph
    from tlc.backend_cute.compile import CompiledKernel
    from tlc.backend_cute.launch import Kernel
    from tlc.lowering.passes import run_lowering
    from tlc.names import kernel_name

    spec = json.loads(Path(directory, "spec.json").read_text())
    text = Path(directory, "program.tl").read_bytes()
    graph, _ = compile_graph(text, spec["tl_name"], defines=spec["defines"])
    # the cubin's kernel is named as `tlc build` names it (a C++ identifier from the file name)
    state, _ = run_lowering(graph, spec["arch"], name=kernel_name(spec["tl_name"]))
    ins = [t for t in state.abi.tensors if not t.output]  # the launcher's q, k, v slots, in Allocate order
    built = {"dtype": ins[0].dtype if ins else None, "d_qk": ins[0].cols if ins else None,
             "d_v": ins[2].cols if len(ins) > 2 else None, "causal": bool(graph.params.get("Causal", False))}
    for field_name, value in built.items():
        if value != spec[field_name]:
            print(json.dumps({"correct": False, "summary": f"the kernel was built with {field_name}="
                              f"{value!r} but the request asks for {spec[field_name]!r}"}))
            return
    alignment = str(graph.params.get("Align", "top_left"))
    if spec["causal"] and alignment != spec["alignment"]:
        print(json.dumps({"correct": False, "summary": f"causal alignment {alignment} != requested "
                          f"{spec['alignment']}"}))
        return
    compiled = CompiledKernel(state.kir, spec["arch"], "", Path(directory, "kernel.cubin").read_bytes(), {}, 0.0)
    kernel = Kernel(compiled, state.abi)
    torch.zeros(1, device="cuda")
    _compare_cases(spec, lambda q, k, v, o, scale: kernel(q, k, v, scale=scale, out=o))


def _child(directory: str) -> None:
    """Vanilla mode: load the cubin with the driver API and launch the requested interface."""
    import ctypes

    import torch
    from cuda.bindings import driver as cu

    spec = json.loads(Path(directory, "spec.json").read_text())
    torch.zeros(1, device="cuda")  # makes torch's primary context current for the driver API
    err, module = cu.cuModuleLoadData(Path(directory, "kernel.cubin").read_bytes())
    if err != cu.CUresult.CUDA_SUCCESS:
        raise SystemExit(f"cuModuleLoadData failed: {err}")
    err, func = cu.cuModuleGetFunction(module, b"attention_fwd")
    if err != cu.CUresult.CUDA_SUCCESS:
        raise SystemExit("the cubin has no extern \"C\" attention_fwd kernel")
    smem = int(spec["SMEM_BYTES"])
    if smem > 48 * 1024:
        attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        (err,) = cu.cuFuncSetAttribute(func, attr, smem)
        if err != cu.CUresult.CUDA_SUCCESS:
            raise SystemExit(f"cannot raise dynamic shared memory to {smem} bytes: {err}")

    def run_kernel(q, k, v, o, scale: float) -> None:
        b, hq, sq, _ = q.shape
        hkv, sk = k.shape[1], k.shape[2]
        args = ((q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), b, hq, hkv, sq, sk, scale),
                (ctypes.c_void_p,) * 4 + (ctypes.c_int,) * 5 + (ctypes.c_float,))
        grid = (-(-sq // spec["BLOCK_M"]), hq, b)
        stream = torch.cuda.current_stream().cuda_stream
        (err,) = cu.cuLaunchKernel(func, *grid, spec["NUM_THREADS"], 1, 1, smem, stream, args, 0)
        if err != cu.CUresult.CUDA_SUCCESS:
            raise SystemExit(f"launch failed: {err}")

    _compare_cases(spec, run_kernel)


if __name__ == "__main__":
    {"vanilla": _child, "tl": _child_tl}[sys.argv[1]](sys.argv[2])
