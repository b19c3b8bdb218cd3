"""Launch ABI and launcher: one parameter struct by value, grid from the kernel IR's formula,
dynamic shared memory raised above 48 KB, `cuLaunchKernel` on torch's current stream.

No host synchronization and no allocation outside torch's allocator, so a call can be captured
in a CUDA graph (the module is loaded on the first call: make that call before capturing).

A call's geometry (the tensors' shapes, strides, dtypes and device, the runtime Inputs) fixes everything but
the data pointers: its first call checks the tensors against the ABI and keeps a launch plan (the packed
struct without pointers, the grid, the module), and later calls of that geometry check their pointers'
alignment and fill them in; the TMA descriptors are kept per plan by the data pointers they encode, and a
persistent kernel's tile counter is a slot of a block zeroed once per `_TileCounters.SLOTS` launches. tlc's own
Python per call: 10-11 µs against 25-30 µs before the plans, d = 128 sm_90a kernels on the CPU machine
(`python3 bench/host_path_cpu.py`, 2026-11-27).
"""
from __future__ import annotations

import ctypes
import math
from typing import Mapping

from tlc.backend_cute.compile import CompiledKernel
from tlc.diagnostics import fail
from tlc.kir.evaluate import evaluate
from tlc.kir.expr import free_names
from tlc.kir.ops import KernelOp, ParamsOp, walk
from tlc.kir.ops_sm90 import (ELEMENT_BYTES, RESIDENT_CTAS_FIELD, TILE_COUNTER, AtomicAddOp, TmaDescriptorOp, TmaParamsOp,
                              TmaPrefetchTileOp, tma_descriptors)
from tlc.ir.tensor_inputs import batch_of, launch_sizes, tensor_pointer, tensor_shape
from tlc.lowering.abi import LaunchABI, TensorArg, query_heads
from tlc.recent import Recent

_CTYPES = {"ptr<bf16>": ctypes.c_uint64, "ptr<fp16>": ctypes.c_uint64, "ptr<f32>": ctypes.c_uint64, "ptr<i32>": ctypes.c_uint64,
           "i32": ctypes.c_int32, "i64": ctypes.c_int64, "f32": ctypes.c_float}
_TORCH_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
_INT32_MAX = 2**31 - 1


_TMA_BYTES, _TMA_ALIGN = 128, 64   # a CUtensorMap
_TMA_MEMO = 256   # encoded descriptors kept per kernel (the least recently used dropped first)
_PLAN_MEMO = 64   # call geometries whose launch plan a kernel keeps (likewise)
_PLAN_TEMPLATES = 16   # a plan's structs with descriptors in, by data pointers (a few buffers a geometry cycles)
_TMA_DTYPE = {"bf16": "BFLOAT16", "fp16": "FLOAT16", "fp32": "FLOAT32"}
_TMA_SWIZZLE = {0: "NONE", 32: "32B", 64: "64B", 128: "128B"}


def params_struct(params: ParamsOp) -> type[ctypes.Structure]:
    """The C layout of the struct. A `TmaParamsOp`'s descriptor slots follow the fields, each 128
    bytes at a 64-byte boundary, and the struct's size is a multiple of 64 (as `alignas(64)` makes it)."""
    fields = [(n, _CTYPES[t]) for n, t in params.fields]
    if isinstance(params, TmaParamsOp) and params.descriptors:
        head = type("_head", (ctypes.Structure,), {"_fields_": fields})
        last = getattr(head, fields[-1][0]) if fields else None
        offset = last.offset + last.size if last else 0   # the byte arrays below pack from here
        for i, slot in enumerate(params.descriptors):
            if pad := -offset % _TMA_ALIGN:
                fields.append((f"_pad{i}_", ctypes.c_uint8 * pad))
            fields.append((slot, ctypes.c_uint8 * _TMA_BYTES))
            offset += pad + _TMA_BYTES
        if tail := -offset % _TMA_ALIGN:
            fields.append(("_pad_end_", ctypes.c_uint8 * tail))
    return type(params.name, (ctypes.Structure,), {"_fields_": fields})


def tma_encode_args(desc: TmaDescriptorOp, tensor) -> dict:
    """The arguments of `cuTensorMapEncodeTiled` for `desc` over a torch tensor: its shape and
    strides innermost first, the box, the swizzle; refuses what TMA cannot address, saying why."""
    rank, size = len(desc.box), ELEMENT_BYTES[desc.dtype]
    shape, strides = tuple(tensor.shape), tuple(tensor.stride())
    what = f"TMA descriptor {desc.name} over {desc.field}"
    if len(shape) != rank:
        raise fail(f"{what}: the tensor has {len(shape)} dimensions, the box {desc.box} has {rank}")
    if tensor.element_size() != size:
        raise fail(f"{what}: the tensor's elements are {tensor.element_size()} bytes; the kernel reads {desc.dtype}")
    if strides[-1] != 1:
        raise fail(f"{what}: the last dimension must be contiguous (stride 1), got {strides[-1]}; call .contiguous()")
    if tensor.data_ptr() % 16:
        raise fail(f"{what}: the data pointer is not 16-byte aligned (TMA needs it); pass a fresh tensor")
    for dim, stride in enumerate(strides[:-1]):
        if (stride * size) % 16 and shape[dim] > 1:
            raise fail(f"{what}: stride({dim}) = {stride * size} bytes is not a multiple of 16 (TMA needs it)")
    return {"dtype": _TMA_DTYPE[desc.dtype], "rank": rank, "address": tensor.data_ptr(),
            "dims": tuple(reversed(shape)), "strides": tuple(s * size for s in reversed(strides[:-1])),
            "box": tuple(reversed(desc.box)), "element_strides": (1,) * rank, "swizzle": _TMA_SWIZZLE[desc.swizzle]}


def encode_tma(desc: TmaDescriptorOp, tensor) -> bytes:
    """The 128-byte CUtensorMap of `desc` over `tensor` (interleave none, L2 promotion 128 B,
    out-of-bounds elements read as zeros)."""
    driver, args = _driver(), tma_encode_args(desc, tensor)
    u64, u32 = driver.cuuint64_t, driver.cuuint32_t   # the binding takes these wrappers, not ints
    err, tensor_map = driver.cuTensorMapEncodeTiled(
        getattr(driver.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{args['dtype']}"), args["rank"],
        args["address"], [u64(d) for d in args["dims"]], [u64(s) for s in args["strides"]],
        [u32(b) for b in args["box"]], [u32(e) for e in args["element_strides"]],
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        getattr(driver.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{args['swizzle']}"),
        driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    _check(err, f"cuTensorMapEncodeTiled({desc.name}: dims {args['dims']}, box {args['box']})")
    return ctypes.string_at(tensor_map.getPtr(), _TMA_BYTES)


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
        self.resident_ctas = self._resident_ctas(driver, kernel, device_index)
        self.attributes = {}
        for key, attr in (("registers", "CU_FUNC_ATTRIBUTE_NUM_REGS"),
                          ("local_bytes", "CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES"),
                          ("max_threads", "CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK")):
            err, value = driver.cuFuncGetAttribute(getattr(driver.CUfunction_attribute, attr), self.function)
            if err == driver.CUresult.CUDA_SUCCESS:
                self.attributes[key] = value

    def _resident_ctas(self, driver, kernel: KernelOp, device_index: int) -> int:
        """How many CTAs of this kernel the GPU holds at once (SMs × occupancy): a persistent
        kernel's grid (`launch.ctas` in the kernel IR's grid formula)."""
        err, per_sm = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(self.function, kernel.threads,
                                                                          kernel.smem_bytes)
        _check(err, "cuOccupancyMaxActiveBlocksPerMultiprocessor")
        err, dev = driver.cuDeviceGet(device_index)
        _check(err, "cuDeviceGet")
        attr = driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
        err, sms = driver.cuDeviceGetAttribute(attr, dev)
        _check(err, "cuDeviceGetAttribute(multiprocessor count)")
        return max(1, int(per_sm)) * int(sms)


class _TileCounters:
    """Zeroed int32 tile counters for persistent launches: one slot per launch, from a block of `SLOTS` zeroed in
    one torch.zeros on the launch's stream (a torch.zeros per launch cost 7.5-12.4 µs of host time and a fill
    kernel: bench/launch_overhead.py, H200, 2026-11-27). A slot is never reused; a used-up block is dropped and freed behind its launches
    in stream order, like any tensor of that stream. A launch being captured into a CUDA graph gets its own
    torch.zeros, which the graph replays before each replay's kernel."""
    SLOTS = 1024

    def __init__(self) -> None:
        self._blocks = Recent(64)   # (device index, stream) → (block, its slot numbers)

    def take(self, device, stream: int):
        """(a tensor to keep alive until the launch is queued, the address of a zeroed counter)."""
        import torch
        if torch.cuda.is_current_stream_capturing():
            counter = torch.zeros(1, dtype=torch.int32, device=device)
            return counter, counter.data_ptr()
        key = (device.index, stream)
        found = self._blocks.recent(key)
        slot = next(found[1], None) if found is not None else None   # next() on a count is atomic under the GIL
        if slot is None:
            found = self._blocks.keep(key, (torch.zeros(self.SLOTS, dtype=torch.int32, device=device),
                                            iter(range(self.SLOTS))))
            slot = next(found[1])
        return found[0], found[0].data_ptr() + 4 * slot


_TILE_COUNTERS = _TileCounters()


def _current_stream(device) -> int:
    """The raw handle of `device`'s current stream (torch's private accessor, as its compiled code uses: 0.1 µs
    against 3.1 for torch.cuda.current_stream(device).cuda_stream, bench/launch_overhead.py, H200, 2026-11-27)."""
    import torch
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is None:
        return torch.cuda.current_stream(device).cuda_stream
    return raw(device.index if device.index is not None else torch.cuda.current_device())


def _on_device(device):
    """`torch.cuda.device(device)`, or nothing where it is current already (the switch and back cost a few µs of a
    launch's host time)."""
    import contextlib

    import torch
    if device.index is None or device.index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(device)


def _is_tensor(t) -> bool:
    import torch
    return isinstance(t, torch.Tensor)


def _on_gpu(t) -> bool:
    return t.is_cuda


def default_scale(tensors) -> float:
    """SDPA's default softmax scale, 1/sqrt of the first (rows, cols) input's columns (a vector has none)."""
    cols = next((a.cols for a in tensors if a.cols), 1)
    return 1.0 / math.sqrt(cols)


def _check_aligned(t, arg: TensorArg) -> None:
    if t.data_ptr() % 16:
        raise fail(f"{arg.name}'s data pointer is not 16-byte aligned (its rows move 16 bytes at a time); pass a "
                   "fresh tensor")


class _Plan:
    """What a call's geometry (shapes, strides, dtypes, device, runtime Inputs) fixes, checked once: the outputs'
    shapes, the parameter struct with every field but the data pointers, the grid, the loaded module."""
    __slots__ = ("shapes", "dtype", "dtypes", "device", "template", "grid", "loaded", "descriptors")

    def __init__(self, shapes, dtype, device, template=None, grid=None, loaded=None, dtypes=None) -> None:
        self.shapes, self.dtype, self.device = shapes, dtype, device
        self.dtypes = dtypes or [dtype] * len(shapes)   # each output's: the inputs', fp32 for a row vector
        self.template, self.grid, self.loaded = template, grid, loaded   # None: the outputs are empty, no launch
        self.descriptors = Recent(_PLAN_TEMPLATES)   # the template with the TMA slots in, by the pointers they encode


def _geometry(tensors, out, inputs: Mapping) -> tuple | None:
    """A call's geometry as a dict key, or None when it has none (something is not a tensor, an Input is not a
    plain number): such calls take the checked path every time."""
    if not all(type(v) in (int, float, bool) for v in inputs.values()):
        return None
    try:
        return (tuple((t.shape, t.stride(), t.dtype, t.device) for t in tensors),
                None if out is None else (out.shape, out.stride(), out.dtype, out.device),
                tuple(sorted((k, v, math.copysign(1, v)) for k, v in inputs.items())))   # -0.0 is not 0.0
    except (AttributeError, TypeError):
        return None


def launcher_filled_fields(kernel: KernelOp) -> set[str]:
    """The parameter fields the launcher fills for `kernel`, known by the ops that read them, not by their names
    (a TL `Input` of the same name stays the caller's): a persistent kernel's tile counter, prefetch-next-tile's
    resident CTA count."""
    out = set()
    for op in walk(kernel):
        if isinstance(op, AtomicAddOp) and f"p.{TILE_COUNTER}" in free_names(op.ptr):
            out.add(TILE_COUNTER)
        elif isinstance(op, TmaPrefetchTileOp):
            out.add(RESIDENT_CTAS_FIELD)
    return out


class Kernel:
    """A built TL program on torch tensors. Inputs are the program's global tensors that it does
    not store, in `Allocate` order, each (batch, heads, rows, cols) like SDPA's q/k/v; the stored
    tensors are allocated and returned. Runtime `Input`s are keyword arguments; an int Input that
    is a tensor's row count is read from the tensors, and a float Input named `scale` defaults to
    1/sqrt(cols of the first tensor), as SDPA's."""

    def __init__(self, compiled: CompiledKernel, abi: LaunchABI) -> None:
        kernels = compiled.program.kernels()
        if len(kernels) != 1:
            raise fail(f"a TL kernel has one kernel in its program, found {len(kernels)}")
        self.compiled, self.abi, self.kernel = compiled, abi, kernels[0]
        self._params_op = next(op for op in compiled.program.body
                               if isinstance(op, ParamsOp) and op.name == self.kernel.params)
        self._struct = params_struct(self._params_op)
        self._filled = launcher_filled_fields(self.kernel)
        self._tma = tma_descriptors(compiled.program).get(self.kernel.params, {})
        self._tma_bytes = Recent(_TMA_MEMO)   # encoded descriptors, by tensor geometry
        self._loaded: dict[int, _Loaded] = {}
        self._plans = Recent(_PLAN_MEMO)   # launch plans, by call geometry
        self._slots = [(getattr(self._struct, slot).offset, slot, desc) for slot, desc in self._tma.items()]
        self._heads_ok: set[tuple] = set()  # head geometries whose offsets were checked
        self.inputs = [t for t in abi.tensors if not t.output]
        self._input_names = frozenset(n for n, _ in abi.inputs)   # a keyword outside them and the tensor Inputs is refused
        self.outputs = [t for t in abi.tensors if t.output]
        # what every launch reads of them, once: the pointer fields, the tensors moved 16 bytes at a time, the
        # reduce-stores' targets (zeroed first)
        self._pointers = tuple(a.ptr for a in self.inputs + self.outputs)
        self._aligned = tuple(a.dtype != "fp32" for a in self.inputs)
        self._added = tuple(i for i, a in enumerate(self.outputs) if a.added)

    # ------------------------------------------------------------------ validation
    def _check_tensor(self, t, arg: TensorArg):
        import torch
        want = getattr(torch, _TORCH_DTYPE[arg.dtype])
        if not isinstance(t, torch.Tensor):
            raise fail(f"{arg.name} must be a torch.Tensor, got {type(t).__name__}")
        if not _on_gpu(t):
            raise fail(f"{arg.name} is on {t.device}; move the tensors to a CUDA device")
        if t.dtype != want:
            raise fail(f"{arg.name} has dtype {t.dtype}; this kernel was built for {want} (rebuild with -D dtype=...)")
        if arg.cols == 0:   # a global vector, loaded into registers element by element
            if t.dim() != 3:
                raise fail(f"{arg.name} is a vector per (batch, head): it must be 3-D (batch, heads, rows), got shape "
                           f"{tuple(t.shape)}")
        elif arg.rows_at and (t.dim() != 4 or t.shape[0] != 1):
            raise fail(f"{arg.name} is read through a row map (rows at {arg.rows_at}): pass its storage, which the "
                       f"batch shares, as (1, heads, storage rows, cols), got shape {tuple(t.shape)}")
        elif t.dim() != 4:
            raise fail(f"{arg.name} must be 4-D (batch, heads, rows, cols) like SDPA, got shape {tuple(t.shape)}")
        elif t.shape[3] != arg.cols:
            raise fail(f"{arg.name} has {t.shape[3]} columns; this kernel was built for {arg.cols}")
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            raise fail(f"{arg.name}'s last dimension must be contiguous (stride 1), got stride {t.stride(-1)}; "
                       "call .contiguous()")
        if arg.dtype != "fp32":   # bf16/fp16 inputs move through cp.async or TMA; fp32 ones are loaded per element
            _check_aligned(t, arg)
            for dim in range(3):
                if (t.stride(dim) * t.element_size()) % 16 and t.shape[dim] > 1:
                    raise fail(f"{arg.name}.stride({dim}) = {t.stride(dim)} elements is not a multiple of 16 bytes "
                               "(needed by cp.async); call .contiguous()")
        if any(x > _INT32_MAX for x in t.shape):
            raise fail(f"{arg.name} has a dimension above 2^31-1: {tuple(t.shape)}")

    def _bind(self, tensors, inputs: Mapping[str, float], runtime: Mapping | None = None) -> tuple[dict, dict]:
        """Runtime values of the Inputs, the grid's heads and batch, and the group, from the tensors (the batch from
        the tensor Inputs' sizes when every tensor is read through a row map: packed sequences)."""
        env: dict = {}
        for arg, t in zip(self.inputs, tensors):
            if arg.rows_at:   # a storage the batch shares: its rows are not the program's rows
                env[arg.storage_rows] = t.shape[2]
            elif not arg.rows.isdigit():
                if env.setdefault(arg.rows, t.shape[2]) != t.shape[2]:
                    raise fail(f"{arg.name} has {t.shape[2]} rows but an earlier tensor gave {arg.rows} = {env[arg.rows]}")
            elif t.shape[2] != int(arg.rows):
                raise fail(f"{arg.name} has {t.shape[2]} rows; this kernel was built for {arg.rows}")
        for name, kind in self.abi.inputs:
            if name in inputs:
                value = inputs[name]
                if name in env and int(value) != env[name]:   # a row count the tensors set: the struct must agree
                    raise fail(f"{name} = {value} was given, but the tensors have {env[name]} rows there "
                               f"({', '.join(a.name for a in self.inputs if a.rows == name)}); drop {name}= or pass "
                               "tensors of that length")
                env[name] = int(value) if kind == "int" else float(value)
            elif name not in env:
                if name == "scale" and kind == "float":
                    env[name] = default_scale(self.inputs)
                else:
                    raise fail(f"this kernel needs the runtime input '{name}': pass {name}=<value>")
        batch = {t.shape[0] for a, t in zip(self.inputs, tensors) if not a.rows_at}
        if len(batch) > 1:
            raise fail(f"batch sizes differ: {', '.join(f'{a.name} {t.shape[0]}' for a, t in zip(self.inputs, tensors))}")
        heads_of = {a.name: t.shape[1] for a, t in zip(self.inputs, tensors)}
        full = [a for a in self.inputs if a.head == "head_idx"]
        heads = query_heads(self.inputs, heads_of, env)
        grouped = [a for a in self.inputs if "group" in a.head]
        group = 1
        if grouped:
            kv = heads_of[grouped[0].name]
            if kv == 0 or heads % kv:
                raise fail(f"{full[0].name if full else 'the query'} heads ({heads}) must be a multiple of "
                           f"{grouped[0].name}'s heads ({kv}) (GQA/MQA)")
            group = heads // kv
        self._check_head_offsets(heads, group, heads_of, env)
        if not batch:
            found = batch_of({n: dims for n, _, dims in self.abi.tensor_inputs},
                             {n: (runtime or {}).get(tensor_pointer(n)) for n, _, _ in self.abi.tensor_inputs}, env)
            batch = {found if found is not None else 1}
        return env, {"batch": batch.pop(), "heads": heads, "group": group}

    def _check_head_offsets(self, heads: int, group: int, heads_of: dict[str, int], env: Mapping) -> None:
        """Every tensor's head offset stays in its heads for the last query head, at the last value of each grid
        axis and loop variable it reads (once per head geometry: the offsets are parsed once per kernel, the
        check memoised)."""
        key = (heads, group, tuple(heads_of.items()), tuple(sorted((k, v) for k, v in env.items()
                                                                  if isinstance(v, int))))
        if key in self._heads_ok:
            return
        from tlc.expr import ExprError
        from tlc.lowering.abi import head_offset
        for a in self.inputs:
            try:
                last = head_offset(a.head_last or a.head, dict(env, head_idx=heads - 1, group=group))
            except ExprError as exc:
                raise fail(f"cannot evaluate {a.name}'s head offset '{a.head}': {exc}") from None
            if heads and not 0 <= last < heads_of[a.name]:
                raise fail(f"{a.name} has {heads_of[a.name]} heads but query head {heads - 1} reads head {last} "
                           f"(offset {a.head})")
        self._heads_ok.add(key)

    def __call__(self, *tensors, out=None, **inputs):
        """`kernel(q, k, v, scale=None)`: returns the stored tensor (a tuple when several). The first call of a
        geometry checks everything and keeps its launch plan; a later call of that geometry checks its data
        pointers' alignment and fills them in (the host time of a launch is most of a short call's)."""
        if out is not None and not _is_tensor(out):
            raise fail(f"out must be a torch.Tensor for the first output, {self.outputs[0].name}, got "
                       f"{type(out).__name__}; the other outputs are returned")
        inputs = {k: v for k, v in inputs.items() if v is not None}
        runtime = self._tensor_inputs(inputs)
        if inputs.keys() - self._input_names:   # a misspelt Input (`scael=`) would otherwise be dropped without a word
            unknown = min(inputs.keys() - self._input_names)
            raise fail(f"this kernel has no Input '{unknown}'; its Inputs are "
                       f"{', '.join(sorted(self._input_names | {n for n, _, _ in self.abi.tensor_inputs}))}")
        key = _geometry((*tensors, *runtime.values()), out, inputs)
        if key is None:
            return self._run(self._plan(tensors, out, inputs, runtime), tensors, out, runtime)
        plan = self._plans.recent(key) or self._plans.keep(key, self._plan(tensors, out, inputs, runtime))
        return self._run(plan, tensors, out, runtime)

    def _tensor_inputs(self, inputs: dict) -> dict:
        """The call's tensor Inputs (`seqlens=<tensor>`), taken out of `inputs`; each the program declares must
        be there (their dtype and shape are checked with the call's sizes, in `_check_tensor_inputs`)."""
        runtime = {}
        for name, dtype, dims in self.abi.tensor_inputs:
            if name not in inputs:
                raise fail(f"this kernel needs the tensor Input '{name}' ({dtype}[{', '.join(dims)}]): pass "
                           f"{name}=<tensor>")
            runtime[tensor_pointer(name)] = inputs.pop(name)
        return runtime

    def _check_tensor_inputs(self, runtime: Mapping, device, env: Mapping, dims: Mapping) -> None:
        import torch
        from tlc.expr import ExprError
        sizes = dict(env, **launch_sizes(dims["batch"], dims["heads"], dims["heads"] // max(dims["group"], 1)))
        for name, dtype, shape in self.abi.tensor_inputs:
            t = runtime[tensor_pointer(name)]
            declared = f"{dtype}[{', '.join(shape)}]"
            if not isinstance(t, torch.Tensor):
                raise fail(f"tensor Input '{name}' ({declared}) must be a torch.Tensor, got {type(t).__name__}")
            want_dtype = torch.int32 if dtype == "int32" else torch.float32
            if t.dtype != want_dtype:
                raise fail(f"tensor Input '{name}' is {declared}: pass a {want_dtype} tensor, not {t.dtype}")
            if t.device != device:
                raise fail(f"tensor Input '{name}' is on {t.device}, the other tensors on {device}")
            try:
                want = tensor_shape(shape, sizes)
            except ExprError as exc:
                raise fail(f"cannot size tensor Input '{name}' ({declared}): {exc}") from None
            if tuple(t.shape) != want:
                raise fail(f"tensor Input '{name}' is {declared} = {list(want)} for this call, got shape "
                           f"{list(t.shape)}")
            if not t.is_contiguous():
                raise fail(f"tensor Input '{name}' must be contiguous (row-major); call .contiguous()")
            if t.numel() > _INT32_MAX:   # the kernel indexes its elements with a 32-bit int
                raise fail(f"tensor Input '{name}' has {t.numel()} elements, more than 2^31 - 1; split the call")

    def plan_of(self, tensors, inputs: Mapping) -> _Plan | None:
        """The launch plan an earlier call of this geometry (no `out`) left, or None: what a caller that keeps
        its own calls to one geometry hands back to `run_plan`."""
        found = self.plan_for(tensors, None, inputs)
        return None if found is None else found[0]

    def run_plan(self, plan: _Plan, tensors, out=None, runtime: Mapping | None = None):
        """A call of `plan`'s geometry on `tensors` (the caller vouches for the geometry; the pointers'
        alignment is checked here; `runtime`: the tensor Inputs by their pointer fields, `tensor_pointer`):
        the outputs, as `__call__` returns them."""
        return self._run(plan, tensors, out, runtime)

    def plan_for(self, tensors, out, inputs: Mapping) -> tuple[_Plan, tuple[str, ...]] | None:
        """The plan an earlier `__call__(*tensors, out=out, **inputs)` left and the names of the tensor Inputs
        among `inputs` (what `run_plan` takes by pointer field), or None where that call had no geometry."""
        inputs = {k: v for k, v in inputs.items() if v is not None}
        tensor_names = tuple(n for n, _, _ in self.abi.tensor_inputs)
        runtime = [inputs.pop(n) for n in tensor_names if n in inputs]
        key = _geometry((*tensors, *runtime), out, inputs)
        plan = None if key is None else self._plans.get(key)
        return None if plan is None else (plan, tensor_names)

    def _plan(self, tensors, out, inputs: Mapping, runtime: Mapping | None = None) -> _Plan:
        """Check a call's tensors and Inputs and work out everything its geometry fixes."""
        import torch
        if len(tensors) != len(self.inputs):
            raise fail(f"this kernel takes {len(self.inputs)} tensor(s) ({', '.join(a.name for a in self.inputs)}), "
                       f"got {len(tensors)}")
        for arg, t in zip(self.inputs, tensors):
            self._check_tensor(t, arg)
        if len({t.device for t in tensors}) > 1:
            raise fail(f"the tensors are on different devices: {', '.join(str(t.device) for t in tensors)}")
        env, dims = self._bind(tensors, inputs, runtime or {})
        dev, dtype = tensors[0].device, tensors[0].dtype
        if self.abi.tensor_inputs:
            self._check_tensor_inputs(runtime or {}, dev, env, dims)
        shapes, strides, dtypes = [], [], []
        for i, arg in enumerate(self.outputs):
            rows = int(arg.rows) if arg.rows.isdigit() else env.get(arg.rows)
            if rows is None:
                raise fail(f"the rows of output {arg.name} ({arg.rows}) are not set by any input tensor")
            # a row vector (cols 0: the log-sum-exp of each row) is (batch, heads, rows) of fp32
            shape = (dims["batch"], arg.head_count(dims["heads"], dims["group"], env), rows) + ((arg.cols,) if arg.cols else ())
            if arg.rows_at:   # stored through a row map: into the storage the caller gives, (1, heads, rows, cols)
                if i != 0 or out is None or not _is_tensor(out) or out.dim() != 4 or out.shape[0] != 1:
                    raise fail(f"{arg.name} is stored through a row map (rows at {arg.rows_at}): pass out=, its "
                               f"(1, heads, storage rows, {arg.cols}) storage")
                shape = (1, shape[1], out.shape[2], arg.cols)
                env[arg.storage_rows] = out.shape[2]
            odt = getattr(torch, _TORCH_DTYPE[arg.dtype])   # as built: the inputs may be of another type
            if out is not None and i == 0:
                if tuple(out.shape) != shape or out.stride(-1) != 1 or out.dtype != odt:
                    raise fail(f"out must be {odt} {shape} with a contiguous last dimension")
                if arg.dtype != "fp32" and any((out.stride(d) * out.element_size()) % 16 and out.shape[d] > 1
                                               for d in range(out.dim() - 1)):
                    raise fail(f"out's strides {tuple(out.stride())} are not multiples of 16 bytes (its rows are "
                               "stored 16 bytes at a time); pass a contiguous tensor")
                strides.append(out.stride())
            else:   # what torch.empty will give it
                strides.append(torch.empty(shape, dtype=odt, device="meta").stride())
            shapes.append(shape)
            dtypes.append(odt)
        if all(math.prod(shape) == 0 for shape in shapes):
            return _Plan(shapes, dtype, dev, dtypes=dtypes)
        values = dict(env, **dims)
        if TILE_COUNTER in self._filled:
            values[TILE_COUNTER] = 0   # each launch's own zeroed counter (_run)
        for ptr in runtime or {}:
            values[ptr] = 0   # each launch's own tensor Inputs (_run)
        for arg, stride3 in [(a, t.stride()) for a, t in zip(self.inputs, tensors)] + list(zip(self.outputs, strides)):
            values[arg.ptr] = 0   # each launch's own pointers (_run)
            for which, stride in zip(("batch", "head", "row"), stride3[:3]):
                values[arg.stride(which)] = stride
        params, grid, loaded = self._prepare(values, dev)
        return _Plan(shapes, dtype, dev, bytes(params), grid, loaded, dtypes)

    def _run(self, plan: _Plan, tensors, out, runtime: Mapping | None = None):
        """Launch a planned call: allocate the outputs, fill in the data pointers (the tensor Inputs' too) and
        descriptors."""
        import torch
        for arg, t, aligned in zip(self.inputs, tensors, self._aligned):
            if aligned and t.data_ptr() % 16:
                _check_aligned(t, arg)
        if out is not None and self.outputs[0].dtype != "fp32":
            _check_aligned(out, self.outputs[0])   # a caller's output: stored 16 bytes at a time
        outs = [out if (out is not None and i == 0) else torch.empty(shape, dtype=odt, device=plan.device)
                for i, (shape, odt) in enumerate(zip(plan.shapes, plan.dtypes))]
        for i in self._added:   # a reduce-store's target: the kernel adds into it, so it starts at zero (`out=` too)
            outs[i].zero_()
        if plan.template is not None:
            bound = dict(zip(self._pointers, (*tensors, *outs)))
            if runtime:
                bound.update(runtime)
            with _on_device(plan.device):
                params = self._struct.from_buffer_copy(self._template(plan, bound))
                for ptr, t in bound.items():
                    setattr(params, ptr, t.data_ptr())
                stream = _current_stream(plan.device)
                if TILE_COUNTER in self._filled:   # a persistent kernel's tile counter, zeroed on this stream
                    counter, address = _TILE_COUNTERS.take(plan.device, stream)
                    setattr(params, TILE_COUNTER, address)
                self._fire(plan.loaded, plan.grid, params, stream)
        return outs[0] if len(outs) == 1 else tuple(outs)

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

    def _fill_descriptors(self, params: ctypes.Structure, values: dict, tensors: Mapping) -> None:
        """Encode each TMA slot from the tensor bound to its pointer field (on the host, per launch:
        the descriptor travels in the struct by value, so a captured CUDA graph keeps it)."""
        for slot, desc in self._tma.items():
            tensor = tensors.get(desc.field)
            if tensor is None:
                raise fail(f"launch: TMA descriptor {slot} needs the tensor of {desc.field}: pass tensors={{"
                           f"'{desc.field}': <tensor>}}")
            if tensor.data_ptr() != values[desc.field]:
                raise fail(f"launch: {desc.field} = {values[desc.field]:#x} but its tensor is at {tensor.data_ptr():#x}")
        self._write_descriptors(params, tensors)

    def _write_descriptors(self, params: ctypes.Structure, tensors: Mapping) -> None:
        """Each TMA slot's encoded descriptor, from the tensor of its pointer field, into the struct."""
        for offset, slot, desc in self._slots:
            ctypes.memmove(ctypes.addressof(params) + offset, self._encoded(slot, desc, tensors[desc.field]),
                           _TMA_BYTES)

    def _template(self, plan: _Plan, tensors: Mapping) -> bytes:
        """The plan's struct with the TMA slots of these tensors in: the geometry is the plan's, so their data
        pointers alone key it (encoded on the first call with these pointers, one lookup on later ones)."""
        if not self._slots:
            return plan.template
        pointers = tuple(tensors[desc.field].data_ptr() for _, _, desc in self._slots)
        found = plan.descriptors.recent(pointers)
        if found is None:
            params = self._struct.from_buffer_copy(plan.template)
            self._write_descriptors(params, tensors)
            found = plan.descriptors.keep(pointers, bytes(params))
        return found

    def _encoded(self, slot: str, desc: TmaDescriptorOp, tensor) -> bytes:
        """`encode_tma` memoised on what the descriptor depends on (pointer, shape, strides, device):
        a model calling the same kernel on the same buffers pays the driver call once, not per launch."""
        key = (slot, tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype, tensor.device)
        return self._tma_bytes.recent(key) or self._tma_bytes.keep(key, encode_tma(desc, tensor))

    def launch(self, values: dict, device, stream: int, tensors: Mapping | None = None) -> None:
        """Pack `values` (field name → value) into the struct and launch on `stream`. `tensors`
        (pointer field → torch tensor) gives the tensors TMA descriptors are encoded from."""
        import torch
        params, grid, loaded = self._prepare(values, device)
        with torch.cuda.device(device):
            self._fill_descriptors(params, values, tensors or {})   # after the module load: the driver is up
            self._fire(loaded, grid, params, stream)

    def _prepare(self, values: dict, device) -> tuple[ctypes.Structure, tuple[int, int, int], _Loaded]:
        """The parameter struct packed from `values` (the resident CTA count filled in), the grid, the module."""
        # the tile counter comes in `values` (__call__ allocates it per launch); the resident count is filled below
        missing = [n for n, _ in self._params_op.fields if n not in values and n not in self._filled - {TILE_COUNTER}]
        if missing:
            why = (f"; {TILE_COUNTER} is a zeroed int32 on the launch's stream (a persistent kernel's tile counter)"
                   if TILE_COUNTER in missing else "")
            raise fail(f"launch: no value for parameter field(s) {', '.join(missing)}{why}")
        import torch
        with torch.cuda.device(device):
            loaded = self._module(device.index if device.index is not None else torch.cuda.current_device())
        if RESIDENT_CTAS_FIELD in self._filled:   # SMs x occupancy: where the hardware's next wave of CTAs starts
            values = dict(values, **{RESIDENT_CTAS_FIELD: loaded.resident_ctas})
        params = self._struct(**{n: values[n] for n, _ in self._params_op.fields})
        env = {f"p.{n}": values[n] for n, _ in self._params_op.fields}
        env["launch.ctas"] = loaded.resident_ctas
        grid = self.grid(env)
        if grid[1] > 65535 or grid[2] > 65535:
            raise fail(f"grid {grid} exceeds 65535 in y/z: too many heads or batches for one launch")
        if grid[0] > 2**31 - 1:   # one grid axis of every tile (l2-sections): query tiles × heads × batches
            raise fail(f"grid {grid} exceeds 2^31 - 1 CTAs in x: split the batch over several calls")
        return params, grid, loaded

    def _fire(self, loaded: _Loaded, grid: tuple[int, int, int], params: ctypes.Structure, stream: int) -> None:
        """cuLaunchKernel with the struct by value, on `stream` (the kernel's device current)."""
        driver = _driver()
        arg = (ctypes.c_void_p * 1)(ctypes.addressof(params))
        (err,) = driver.cuLaunchKernel(loaded.function, *grid, self.kernel.threads, 1, 1, self.kernel.smem_bytes,
                                       driver.CUstream(stream), ctypes.addressof(arg), 0)
        _check(err, f"cuLaunchKernel({self.kernel.name}, grid={grid})")

    def attributes(self, device_index: int = 0) -> dict:
        """Registers and local (spill) bytes from cuFuncGetAttribute, once loaded on a GPU."""
        return dict(self._module(device_index).attributes)
