"""A built program of several kernels (`Kernel NAME` lines) on torch tensors: one call runs its kernels in order.

`kernel(q, k, v, scale=…)` takes the program's inputs (the global tensors no kernel stores, in Allocate order)
and its runtime Inputs by keyword; each kernel gets the tensors and Inputs it names. A tensor one kernel stores and
a later one loads (a workspace) is allocated by the kernel that stores it and handed to the next, never returned;
the outputs come back in Allocate order, as a one-kernel program's do.
"""
from __future__ import annotations

import dataclasses

from tlc.backend_cute.launch import Kernel, default_scale
from tlc.diagnostics import TlcError, fail


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

    def __call__(self, *tensors, out=None, **inputs):
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
        for name, k in self.kernels:
            given = {n: v for n, v in inputs.items() if n in self._own[name]}
            place = None
            if out is not None and any(a.name == first for a in k.outputs):
                if k.outputs[0].name != first:
                    raise fail(f"out= gives the program's first output, {first}, but kernel '{name}' stores it after "
                               f"{k.outputs[0].name}; call without out=")
                place = out
            try:
                made = k(*(env[a.name] for a in k.inputs), out=place, **given)
            except TlcError as exc:   # which kernel said it
                raise TlcError([dataclasses.replace(d, message=f"kernel '{name}': {d.message}")
                                for d in exc.diagnostics]) from None
            env.update(zip((a.name for a in k.outputs), made if isinstance(made, tuple) else (made,)))
        result = tuple(env[a.name] for a in self.outputs)
        return result[0] if len(result) == 1 else result
