"""Launch ABI and launcher: one parameter struct by value, grid from the kernel IR's formula,
dynamic shared memory raised above 48 KB, `cuLaunchKernel` on torch's current stream.

No host synchronization and no allocation outside torch's allocator, so a call can be captured
in a CUDA graph (the module is loaded on the first call: make that call before capturing).
"""
from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import Mapping

from tlc.backend_cute.compile import CompiledKernel
from tlc.diagnostics import fail
from tlc.kir.evaluate import evaluate
from tlc.kir.expr import free_names, parse_expr
from tlc.kir.ops import KernelOp, ParamsOp
from tlc.kir.score_ops import SCORE_FIELDS

_CTYPES = {"ptr<bf16>": ctypes.c_uint64, "ptr<fp16>": ctypes.c_uint64, "ptr<f32>": ctypes.c_uint64,
           "i32": ctypes.c_int32, "i64": ctypes.c_int64, "f32": ctypes.c_float}
_TORCH_DTYPE = {"bf16": "bfloat16", "fp16": "float16"}
_INT32_MAX = 2**31 - 1


def params_struct(params: ParamsOp) -> type[ctypes.Structure]:
    return type(params.name, (ctypes.Structure,), {"_fields_": [(n, _CTYPES[t]) for n, t in params.fields]})


def _driver():
    try:
        from cuda.bindings import driver
    except ImportError:  # pragma: no cover
        raise fail("cuda-python is not installed: `pip install cuda-python` to launch kernels") from None
    return driver


def _check(result, what: str) -> None:
    driver = _driver()
    if result != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(result)
        raise fail(f"CUDA driver call {what} failed: {name.decode() if isinstance(name, bytes) else name}")


@dataclass(frozen=True)
class AttentionSpec:
    """What a two-GEMM kernel (attention, or a back-to-back GEMM without softmax) was specialized
    for, checked against the arguments. `tensor_names` are the program's names for the q, k, v and
    o slots (A, B, C, O for `relu(A·Bᵀ)·C`); `score_scalars[i]` is the host expression, over the
    runtime inputs, that fills the parameter field `score_s<i>`."""

    dtype: str
    d_qk: int
    d_v: int
    causal: bool
    lse: bool = False
    softcap: bool = False
    softmax: bool = True
    score_scalars: tuple[str, ...] = ()
    tensor_names: tuple[str, ...] = ("q", "k", "v", "o")


class _Loaded:
    def __init__(self, compiled: CompiledKernel, kernel: KernelOp, device_index: int) -> None:
        driver = _driver()
        (err,) = driver.cuInit(0)
        _check(err, "cuInit")
        err, ctx = driver.cuCtxGetCurrent()
        _check(err, "cuCtxGetCurrent")
        if int(ctx) == 0:
            # torch's runtime uses the device's primary context: make it current on this thread.
            err, dev = driver.cuDeviceGet(device_index)
            _check(err, "cuDeviceGet")
            err, ctx = driver.cuDevicePrimaryCtxRetain(dev)
            _check(err, "cuDevicePrimaryCtxRetain")
            (err,) = driver.cuCtxSetCurrent(ctx)
            _check(err, "cuCtxSetCurrent")
        err, self.module = driver.cuModuleLoadData(compiled.cubin)
        _check(err, "cuModuleLoadData (is the cubin for this GPU's arch?)")
        err, self.function = driver.cuModuleGetFunction(self.module, kernel.name.encode())
        _check(err, "cuModuleGetFunction")
        if kernel.smem_bytes > 48 * 1024:
            attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            (err,) = driver.cuFuncSetAttribute(self.function, attr, kernel.smem_bytes)
            _check(err, f"cuFuncSetAttribute(max dynamic smem = {kernel.smem_bytes} bytes)")
        self.attributes = {}
        for key, attr in (("registers", "CU_FUNC_ATTRIBUTE_NUM_REGS"),
                          ("local_bytes", "CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES"),
                          ("max_threads", "CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK")):
            err, value = driver.cuFuncGetAttribute(getattr(driver.CUfunction_attribute, attr), self.function)
            if err == driver.CUresult.CUDA_SUCCESS:
                self.attributes[key] = value


class Kernel:
    """Forward attention on torch tensors in SDPA layout: q (B, Hq, Sq, Dqk), k (B, Hkv, Sk, Dqk),
    v (B, Hkv, Sk, Dv) → o (B, Hq, Sq, Dv) [and fp32 lse (B, Hq, Sq)]. Hq must be a multiple of Hkv
    (GQA/MQA); the last dimension must be contiguous; strides are free otherwise. A back-to-back
    GEMM takes its A, B, C in the q, k, v slots (same shapes: rows, N1, N1 rows) and returns O."""

    def __init__(self, compiled: CompiledKernel, spec: AttentionSpec) -> None:
        kernels = compiled.program.kernels()
        if len(kernels) != 1:
            raise fail(f"attention Kernel expects one kernel in the program, found {len(kernels)}")
        self.compiled, self.spec, self.kernel = compiled, spec, kernels[0]
        struct = next(op for op in compiled.program.body if isinstance(op, ParamsOp) and op.name == self.kernel.params)
        self._params_op = struct
        self._struct = params_struct(struct)
        self._loaded: dict[int, _Loaded] = {}

    # ------------------------------------------------------------------ validation
    def _validate(self, q, k, v):
        import torch
        spec = self.spec
        want = getattr(torch, _TORCH_DTYPE[spec.dtype])
        nq, nk, nv = spec.tensor_names[:3]
        for name, t in ((nq, q), (nk, k), (nv, v)):
            if not isinstance(t, torch.Tensor):
                raise fail(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if not t.is_cuda:
                raise fail(f"{name} is on {t.device}; move {nq}, {nk}, {nv} to a CUDA device")
            if t.dtype != want:
                raise fail(f"{name} has dtype {t.dtype}; this kernel was built for {want} (rebuild with another dtype)")
            if t.dim() != 4:
                raise fail(f"{name} must be 4-D (batch, heads, seq, head_dim) like SDPA, got shape {tuple(t.shape)}")
            if t.stride(-1) != 1 and t.shape[-1] > 1:
                raise fail(f"{name}'s last dimension must be contiguous (stride 1), got stride {t.stride(-1)}; "
                           f"call .contiguous()")
            if t.data_ptr() % 16:
                raise fail(f"{name}'s data pointer is not 16-byte aligned (needed by cp.async); pass a fresh tensor")
            for dim in range(3):
                if (t.stride(dim) * t.element_size()) % 16 and t.shape[dim] > 1:
                    raise fail(f"{name}.stride({dim}) = {t.stride(dim)} elements is not a multiple of 16 bytes "
                               f"(needed by cp.async); call .contiguous()")
            if any(s > _INT32_MAX for s in t.shape):
                raise fail(f"{name} has a dimension above 2^31-1: {tuple(t.shape)}")
        if not (q.device == k.device == v.device):
            raise fail(f"{nq}, {nk}, {nv} are on different devices: {q.device}, {k.device}, {v.device}")
        B, Hq, Sq, Dqk = q.shape
        if k.shape[0] != B or v.shape[0] != B:
            raise fail(f"batch sizes differ: {nq} {B}, {nk} {k.shape[0]}, {nv} {v.shape[0]}")
        if Dqk != spec.d_qk or k.shape[3] != spec.d_qk:
            raise fail(f"head dim of {nq}/{nk} is {Dqk}/{k.shape[3]}; this kernel was built for d_qk={spec.d_qk}")
        if v.shape[3] != spec.d_v:
            raise fail(f"head dim of {nv} is {v.shape[3]}; this kernel was built for d_v={spec.d_v}")
        if k.shape[1] != v.shape[1] or k.shape[2] != v.shape[2]:
            raise fail(f"{nk} {tuple(k.shape)} and {nv} {tuple(v.shape)} disagree on heads or sequence length")
        Hkv = k.shape[1]
        if Hkv == 0 or Hq % Hkv:
            raise fail(f"{nq} heads ({Hq}) must be a multiple of key/value heads ({nk}/{nv}: {Hkv}) for GQA/MQA")
        return B, Hq, Hkv, Sq, k.shape[2]

    # ------------------------------------------------------------------ launch
    def _module(self, device_index: int) -> _Loaded:
        if device_index not in self._loaded:
            import torch
            with torch.cuda.device(device_index):
                torch.cuda.init()
                self._loaded[device_index] = _Loaded(self.compiled, self.kernel, device_index)
        return self._loaded[device_index]

    def grid(self, env: dict) -> tuple[int, int, int]:
        gx, gy, gz = (int(evaluate(g, env)) for g in self.kernel.grid)
        return gx, gy, gz

    def __call__(self, q, k, v, *, scale: float | None = None, softcap: float | None = None, out=None,
                 return_lse: bool = False, inputs: Mapping[str, float] | None = None):
        """`inputs`: values of the program's other runtime scalar Inputs (those the score program reads)."""
        import torch
        B, Hq, Hkv, Sq, Sk = self._validate(q, k, v)
        spec = self.spec
        if return_lse and not spec.lse:
            raise fail("return_lse=True but this kernel was built without the LSE output (build with lse)")
        if (softcap is not None) != spec.softcap:
            raise fail("softcap given but the kernel was built without it" if softcap is not None
                       else "this kernel was built with softcap: pass softcap=<value>")
        scale = 1.0 / math.sqrt(spec.d_qk) if scale is None else float(scale)
        if out is None:
            out = torch.empty((B, Hq, Sq, spec.d_v), dtype=q.dtype, device=q.device)
        elif out.shape != (B, Hq, Sq, spec.d_v) or out.dtype != q.dtype or out.stride(-1) != 1:
            raise fail(f"out must be {(B, Hq, Sq, spec.d_v)} {q.dtype} with a contiguous last dim")
        lse = torch.empty((B, Hq, Sq), dtype=torch.float32, device=q.device) if spec.lse else None
        if B * Hq * Sq == 0:
            return (out, lse) if return_lse else out
        if softcap is not None:
            softcap_scale, scale_log2 = scale / softcap, softcap * math.log2(math.e)
        else:
            softcap_scale, scale_log2 = 0.0, scale * math.log2(math.e)
        values = {
            "q": q.data_ptr(), "k": k.data_ptr(), "v": v.data_ptr(), "o": out.data_ptr(),
            "lse": lse.data_ptr() if lse is not None else 0,
            "b": B, "hq": Hq, "hkv": Hkv, "h_ratio": Hq // Hkv, "sq": Sq, "sk": Sk,
            "lse_stride_b": lse.stride(0) if lse is not None else 0,
            "lse_stride_h": lse.stride(1) if lse is not None else 0,
            "scale": scale, "scale_log2": scale_log2, "softcap_scale": softcap_scale,
            **self._score_values(scale, inputs or {}),
        }
        for name, t in (("q", q), ("k", k), ("v", v), ("o", out)):
            values[f"{name}_stride_b"], values[f"{name}_stride_h"], values[f"{name}_stride_s"] = t.stride()[:3]
        self.launch(values, q.device, torch.cuda.current_stream(q.device).cuda_stream)
        return (out, lse) if return_lse else out

    def _score_values(self, scale: float, inputs: Mapping[str, float]) -> dict[str, float]:
        """p.score_s<i> from the host expressions the kernel was built with (the .json's `score_scalars`)."""
        env = {"scale": scale, **{k: float(v) for k, v in inputs.items()}}
        values = {f: 0.0 for f in SCORE_FIELDS}
        for field, text in zip(SCORE_FIELDS, self.spec.score_scalars):
            missing = sorted(free_names(parse_expr(text)) - set(env))
            if missing:
                raise fail(f"this kernel reads the runtime input(s) {', '.join(missing)} (in {text}): "
                           f"pass inputs={{{missing[0]!r}: <value>, ...}}")
            try:
                values[field] = float(evaluate(parse_expr(text), env))
            except ZeroDivisionError:
                raise fail(f"the score scalar {text} divides by zero for inputs {env}") from None
        return values

    def launch(self, values: dict, device, stream: int) -> None:
        """Pack `values` (field name → value) into the struct and launch on `stream`."""
        driver = _driver()
        missing = [n for n, _ in self._params_op.fields if n not in values]
        if missing:
            raise fail(f"launch: no value for parameter field(s) {', '.join(missing)}")
        params = self._struct(**{n: values[n] for n, _ in self._params_op.fields})
        env = {f"p.{n}": values[n] for n, _ in self._params_op.fields}
        grid = self.grid(env)
        if grid[1] > 65535 or grid[2] > 65535:
            raise fail(f"grid {grid} exceeds 65535 in y/z: too many heads or batches for one launch")
        import torch
        with torch.cuda.device(device):
            loaded = self._module(device.index if device.index is not None else torch.cuda.current_device())
            arg = (ctypes.c_void_p * 1)(ctypes.addressof(params))
            (err,) = driver.cuLaunchKernel(loaded.function, *grid, self.kernel.threads, 1, 1, self.kernel.smem_bytes,
                                           driver.CUstream(stream), ctypes.addressof(arg), 0)
            _check(err, f"cuLaunchKernel({self.kernel.name}, grid={grid})")

    def attributes(self, device_index: int = 0) -> dict:
        """Registers and local (spill) bytes from cuFuncGetAttribute, once loaded on a GPU."""
        return dict(self._module(device_index).attributes)
