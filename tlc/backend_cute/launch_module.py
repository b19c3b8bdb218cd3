"""A built program of several kernels (`Kernel NAME` lines) on torch tensors: one call runs its kernels in order, as
the `LaunchOp` each kernel's program holds states (`ModuleKernel.of_launch`).

`kernel(q, k, v, scale=…)` takes the program's inputs (the global tensors no kernel stores, in Allocate order)
and its runtime Inputs by keyword; each kernel gets the tensors and Inputs it names. A tensor one kernel stores and
a later one loads (a workspace) is allocated by the kernel that stores it and handed to the next, never returned;
the outputs come back in Allocate order, as a one-kernel program's do. A call whose geometry (tensor shapes,
strides, dtypes, devices, the Inputs' values, the tensor Inputs' geometry) ran before skips the program's checks
and each kernel's and launches the plans that call left, as `Kernel.__call__` does for one kernel.
"""
from __future__ import annotations

import dataclasses

from tlc.backend_cute.launch import Kernel, _geometry, _is_tensor, default_scale
from tlc.diagnostics import TlcError, fail
from tlc.ir.tensor_inputs import tensor_pointer
from tlc.recent import Recent

_STEPS_MEMO = 64   # call geometries whose launch steps a program keeps


class ModuleKernel:
    """The kernels of one program, in launch order, with the roles of its global tensors (tlc/ir/module.py)."""

    def __init__(self, kernels: list[tuple[str, Kernel]], roles: dict[str, str]) -> None:
        self.kernels, self.roles = kernels, roles
        first_use = {}
        for _, k in kernels:
            for arg in (*k.inputs, *k.outputs):
                first_use.setdefault(arg.name, arg)
        producer = {a.name: a for _, k in kernels for a in k.outputs}
        self.inputs = [first_use[n] for n, r in roles.items() if r == "input"]
        self.outputs = [producer[n] for n, r in roles.items() if r == "output"]
        self.workspaces = [producer[n] for n, r in roles.items() if r == "workspace"]
        # each kernel's Inputs by keyword (scalar and tensor), once: a call hands each kernel its own
        self._own = {name: {*k._input_names, *(t for t, _, _ in k.abi.tensor_inputs)} for name, k in kernels}
        self._keywords = set().union(*self._own.values()) if self._own else set()
        self._input_names = tuple(a.name for a in self.inputs)
        self._steps = Recent(_STEPS_MEMO)   # call geometry → each kernel's launch step, checked once

    @classmethod
    def of_launch(cls, kernels: list[tuple[str, Kernel]]) -> "ModuleKernel":
        """The program whose kernels' programs state its launch (a `LaunchOp`: kernels in order, tensor roles): the
        kernels given must be those, in that order, and every one must state the same launch."""
        from tlc.kir.ops import LaunchOp

        launches = [next((op for op in k.compiled.program.body if isinstance(op, LaunchOp)), None) for _, k in kernels]
        first = launches[0]
        if first is None or any(op != first for op in launches) or list(first.kernels) != [n for n, _ in kernels]:
            raise fail(f"the kernels {', '.join(n for n, _ in kernels)} do not state one launch of them in this order "
                       "(a LaunchOp in each program); rebuild the program")
        return cls(kernels, first.roles())

    def __call__(self, *tensors, out=None, **inputs):
        key = self._key(tensors, out, inputs)
        steps = None if key is None else self._steps.recent(key)
        if steps is not None:   # this geometry was checked and planned by an earlier call
            return self.run_steps(steps, tensors, out, **inputs)
        result, steps = self._checked_call(tensors, out, inputs)
        if key is not None and steps is not None:
            self._steps.keep(key, steps)
        return result

    def steps_for(self, tensors, out=None, **inputs):
        """The launch steps an earlier call with this geometry left (None if none): a caller that keeps its own
        calls to one geometry hands them back to `run_steps` and skips this program's key as well."""
        key = self._key(tensors, out, inputs)
        return None if key is None else self._steps.get(key)

    @staticmethod
    def _key(tensors, out, inputs: dict) -> tuple | None:
        """The call's geometry with its tensor Inputs' (by name), or None when it has none."""
        runtime = sorted((k, v) for k, v in inputs.items() if _is_tensor(v))
        scalars = {k: v for k, v in inputs.items() if v is not None and not _is_tensor(v)}
        key = _geometry((*tensors, *(v for _, v in runtime)), out, scalars)
        return None if key is None else (key, tuple(k for k, _ in runtime))

    def run_steps(self, steps, tensors, out=None, **inputs):
        """A call of `steps`' geometry (the caller vouches for it; pointers' alignment is checked per launch)."""
        env = dict(zip(self._input_names, tensors))
        for name, k, plan, ins, outs, takes_out, runtime_names in steps:
            runtime = {tensor_pointer(n): inputs[n] for n in runtime_names if n in inputs}
            try:
                made = k.run_plan(plan, [env[a] for a in ins], out if takes_out else None, runtime)
            except TlcError as exc:   # which kernel said it
                raise TlcError([dataclasses.replace(d, message=f"kernel '{name}': {d.message}")
                                for d in exc.diagnostics]) from None
            env.update(zip(outs, made if isinstance(made, tuple) else (made,)))
        result = tuple(env[a.name] for a in self.outputs)
        return result[0] if len(result) == 1 else result

    def _checked_call(self, tensors, out, inputs: dict):
        """The call with every check, and the launch steps it leaves (None where a kernel kept no plan)."""
        if len(tensors) != len(self.inputs):
            raise fail(f"this program takes {len(self.inputs)} tensor(s) ({', '.join(a.name for a in self.inputs)}), "
                       f"got {len(tensors)}")
        unknown = sorted(k for k, v in inputs.items() if v is not None and k not in self._keywords)
        if unknown:
            raise fail(f"this program has no Input '{unknown[0]}'; its Inputs are {', '.join(sorted(self._keywords))}")
        env = dict(zip((a.name for a in self.inputs), tensors))
        inputs = {k: v for k, v in inputs.items() if v is not None}
        # one value of each Input for every kernel: a row count from the program's input tensors, SDPA's scale
        for arg, t in zip(self.inputs, tensors):   # (a storage read through a row map holds other rows)
            if not arg.rows.isdigit() and not arg.rows_at and arg.rows not in inputs and hasattr(t, "shape") \
                    and len(t.shape) > 2:
                inputs[arg.rows] = int(t.shape[2])
        if "scale" not in inputs and any(("scale", "float") in k.abi.inputs for _, k in self.kernels):
            inputs["scale"] = default_scale(self.inputs)
        first = self.outputs[0].name if self.outputs else None
        steps: list | None = []
        for name, k in self.kernels:
            given = {n: v for n, v in inputs.items() if n in self._own[name]}
            place = None
            if out is not None and any(a.name == first for a in k.outputs):
                if k.outputs[0].name != first:
                    raise fail(f"out= gives the program's first output, {first}, but kernel '{name}' stores it after "
                               f"{k.outputs[0].name}; call without out=")
                place = out
            args = [env[a.name] for a in k.inputs]
            try:
                made = k(*args, out=place, **given)
            except TlcError as exc:   # which kernel said it
                raise TlcError([dataclasses.replace(d, message=f"kernel '{name}': {d.message}")
                                for d in exc.diagnostics]) from None
            env.update(zip((a.name for a in k.outputs), made if isinstance(made, tuple) else (made,)))
            found = k.plan_for(args, place, given) if steps is not None else None
            # derived Inputs (row counts, the default scale) follow from the geometry: the plan holds them
            steps = None if found is None else steps + [(name, k, found[0], tuple(a.name for a in k.inputs),
                                                         tuple(a.name for a in k.outputs), place is not None,
                                                         found[1])]
        result = tuple(env[a.name] for a in self.outputs)
        return (result[0] if len(result) == 1 else result), steps
