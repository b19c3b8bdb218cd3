"""Evaluate a kernel-IR `ProgramOp` on the CPU at tile level: every CTA of the grid runs the kernel
body in order on whole tiles (float64), with the launch ABI binding the parameter struct as the
launcher does. CI compares the result with the TL interpreter (`tlc.ir.interpreter`), so the
kernel IR the lowering passes produced is checked end to end without a GPU.

Not modelled: threads, lanes and register layouts (partitions are their whole tile, AllReduceOp is
a no-op), swizzles, fp32 rounding of accumulators. Modelled beyond values: cp.async groups, waits
and barriers (a read of a stage in flight, unpublished or overwritten is an error), bounds of
every global access, and that copies, loads and masks use consistently partitioned operands.
"""
from __future__ import annotations

import math
from typing import Mapping

import torch

from tlc.diagnostics import Note
from tlc.kir import ops as K
from tlc.kir import tile_eval_decl, tile_eval_ops  # noqa: F401 - they register the op handlers
from tlc.kir.evaluate import evaluate
from tlc.kir.tile_eval_expr import F64, round_to
from tlc.kir.tile_eval_state import HANDLERS, Block, Bound, TileEvalError
from tlc.expr import ExprError
from tlc.ir.tensor_inputs import batch_of, launch_sizes, tensor_pointer, tensor_shape
from tlc.lowering.abi import LaunchABI, TensorArg, query_heads

__all__ = ["TileEvalError", "evaluate_program", "known_ops"]


def known_ops() -> list[str]:
    """Kernel-IR op classes the evaluator reads: a handler of their own or of the op they specialise."""
    return sorted(name for name, cls in K.OP_CLASSES.items() if any(b in HANDLERS for b in cls.__mro__))


def _rows(arg: TensorArg, env: Mapping[str, object]) -> int:
    if arg.rows.isdigit():
        return int(arg.rows)
    if arg.rows not in env:
        raise TileEvalError(f"the rows of {arg.name} ({arg.rows}) are set by no input tensor or input value")
    return int(env[arg.rows])  # type: ignore[arg-type]


def _bind(abi: LaunchABI, tensors: Mapping[str, torch.Tensor], inputs: Mapping[str, float | int]
          ) -> tuple[dict[str, object], dict[str, torch.Tensor]]:
    """p.<field> values and float64 storage per tensor, as `tlc.backend_cute.launch` binds them."""
    env: dict[str, object] = {}
    store: dict[str, torch.Tensor] = {}
    ins = [t for t in abi.tensors if not t.output]
    for arg in ins:
        if arg.name not in tensors:
            raise TileEvalError(f"no tensor given for input {arg.name}")
        t = tensors[arg.name]
        if (t.dim() != 3) if arg.cols == 0 else (t.dim() != 4 or t.shape[3] != arg.cols):
            want = "(batch, heads, rows)" if arg.cols == 0 else f"(batch, heads, rows, {arg.cols})"
            raise TileEvalError(f"{arg.name} must be {want}, got {tuple(t.shape)}")
        if arg.rows_at:   # a storage the batch shares: its rows are not the program's
            env[f"{arg.storage_rows}"] = t.shape[2]
        elif not arg.rows.isdigit() and env.setdefault(arg.rows, t.shape[2]) != t.shape[2]:
            raise TileEvalError(f"{arg.name} has {t.shape[2]} rows but an earlier tensor gave {arg.rows}")
        store[arg.name] = t.detach().to(F64).contiguous().clone()
    for name, kind in abi.inputs:
        value = inputs.get(name, env.get(name))
        if value is None and name == "scale" and kind == "float":
            value = 1.0 / math.sqrt(next((a.cols for a in ins if a.cols), 1))
        if value is None:
            raise TileEvalError(f"the program needs the runtime input '{name}'")
        if name in env and int(value) != env[name]:  # type: ignore[call-overload]
            raise TileEvalError(f"input {name} = {value} disagrees with the tensors ({env[name]})")
        env[name] = int(value) if kind == "int" else round_to(torch.tensor(float(value)), "fp32").item()
    batches = {store[a.name].shape[0] for a in ins if not a.rows_at}
    if len(batches) > 1:
        raise TileEvalError(f"the input tensors' batch sizes differ: {sorted(batches)}")
    if not batches:   # every tensor read through a row map: the batch the tensor Inputs are sized by
        found = batch_of({n: dims for n, _, dims in abi.tensor_inputs},
                         {n: tensors.get(n, inputs.get(n)) for n, _, _ in abi.tensor_inputs}, env)
        batches = {found if found is not None else 1}
    batch = batches.pop()
    heads = query_heads(ins, {a.name: store[a.name].shape[1] for a in ins}, env)
    grouped = [a for a in ins if "group" in a.head]
    kv = store[grouped[0].name].shape[1] if grouped else heads
    if kv == 0 or heads % kv:
        raise TileEvalError(f"{heads} query heads are not a multiple of {kv} KV heads")
    dims = {"batch": batch, "heads": heads, "group": heads // kv}
    for arg in abi.tensors:
        if arg.output:
            count = arg.head_count(heads, heads // kv, env)
            shape = (batch, count, _rows(arg, env), arg.cols) if arg.cols else (batch, count, _rows(arg, env))
            given = tensors.get(arg.name)
            if arg.rows_at:   # stored through a row map: the storage the caller gives, (1, heads, rows, cols)
                if given is None or given.dim() != 4 or given.shape[0] != 1:
                    raise TileEvalError(f"output {arg.name} is stored through a row map: give its (1, heads, rows, "
                                        f"cols) storage")
                shape = (1, count, given.shape[2], arg.cols)
                env[arg.storage_rows] = given.shape[2]
            if given is not None and tuple(given.shape) != shape:
                raise TileEvalError(f"output {arg.name} must be {shape}, got {tuple(given.shape)}")
            # NaN where no kernel writes; a reduce-store's target starts at zero, as the launch gives it
            store[arg.name] = torch.zeros(shape, dtype=F64) if arg.added else torch.full(shape, float("nan"), dtype=F64)
    fields: dict[str, object] = {f"p.{k}": v for k, v in {**env, **dims}.items()}
    for arg in abi.tensors:
        for which, stride in zip(("batch", "head", "row"), store[arg.name].stride()[:3]):
            fields[f"p.{arg.stride(which)}"] = stride
    sizes = dict(env, **launch_sizes(dims["batch"], dims["heads"], dims["heads"] // dims["group"]))
    for name, dtype, shape in abi.tensor_inputs:   # read by element through their pointers (`load`)
        given = tensors.get(name, inputs.get(name))   # type: ignore[arg-type]
        if not isinstance(given, torch.Tensor):
            raise TileEvalError(f"no tensor given for tensor Input {name} ({dtype}[{', '.join(shape)}])")
        try:
            want = tensor_shape(shape, sizes)
        except ExprError as exc:
            raise TileEvalError(f"cannot size tensor Input {name}: {exc}") from None
        if tuple(given.shape) != want:
            raise TileEvalError(f"tensor Input {name} must be {list(want)}, got {list(given.shape)}")
        fields[f"p.{tensor_pointer(name)}"] = given.contiguous()
    return fields, store


def _run_kernel(kernel: K.KernelOp, fields: dict[str, object], pointers: dict[str, Bound]) -> None:
    grid = [int(evaluate(g, fields)) for g in kernel.grid]  # type: ignore[arg-type]
    if min(grid) < 0:
        raise TileEvalError(f"kernel {kernel.name} has a negative grid {grid}", kernel.loc)
    dims = {"gridDim.x": grid[0], "gridDim.y": grid[1], "gridDim.z": grid[2], "blockDim.x": kernel.threads,
            "blockDim.y": 1, "blockDim.z": 1, "threadIdx.x": 0, "threadIdx.y": 0, "threadIdx.z": 0}
    for z in range(grid[2]):
        for y in range(grid[1]):
            for x in range(grid[0]):
                scalars = {**fields, **dims, "blockIdx.x": x, "blockIdx.y": y, "blockIdx.z": z}
                cta = (z * grid[1] + y) * grid[0] + x
                try:
                    Block(scalars, pointers, cta).run(kernel.body)
                except TileEvalError as exc:
                    d = exc.diagnostics[0]
                    where = Note(f"in CTA #{cta} = blockIdx ({x}, {y}, {z}) of kernel {kernel.name}")
                    raise TileEvalError(d.message.removeprefix("tile-eval: "), d.loc, *d.notes, where) from None


def evaluate_program(program: K.ProgramOp, abi: LaunchABI, tensors: Mapping[str, torch.Tensor],
                     inputs: Mapping[str, float | int]) -> dict[str, torch.Tensor]:
    """Run every kernel of `program` on `tensors` (batch, heads, rows, cols); returns each stored
    tensor as float64 (batch, heads, rows, cols), NaN where the kernels never wrote."""
    fields, store = _bind(abi, tensors, inputs)
    pointers = {f"p.{a.ptr}": Bound(a.name, a.dtype, store[a.name],
                                    torch.full(store[a.name].shape, -1, dtype=torch.int64) if a.output else None)
                for a in abi.tensors}
    params = {op.name: op for op in program.body if isinstance(op, K.ParamsOp)}
    for kernel in program.kernels():
        struct = params.get(kernel.params)
        if struct is None:
            raise TileEvalError(f"kernel {kernel.name} takes unknown parameter struct {kernel.params}", kernel.loc)
        unbound = [f for f, _ in struct.fields if f"p.{f}" not in fields and f"p.{f}" not in pointers]
        if unbound:
            raise TileEvalError(f"the launch ABI binds no value to {', '.join(unbound)}", kernel.loc)
        _run_kernel(kernel, fields, pointers)
    return {a.name: store[a.name] for a in abi.tensors if a.output}
