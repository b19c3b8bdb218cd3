"""Name resolution check for kernel-IR programs: every name an op uses is defined before it.

Catches a lowering bug at the op's `.tl` location instead of as a C++ error from NVRTC.
C++ names follow block scoping (a name defined inside `ForOp`/`IfOp` ends with it); async
tokens and commit groups live in their own flat namespace (they never reach the C++): the fields
holding them are the ones an op's effects declare as tokens (`tlc.kir.effects`).
"""
from __future__ import annotations

from dataclasses import fields

from tlc.diagnostics import fail
from tlc.kir.base import Op
from tlc.kir.expr import Expr, free_names
from tlc.kir.ops import KernelOp, ParamsOp, ProgramOp, TraceBufferOp

# Fields holding enum words or atom spellings, not names.
_NOT_NAMES = {"kind", "method", "role", "dtype", "alignment", "atom", "type", "loc", "fields", "label"}
# Elementwise-function parameters bound by the op itself (MapOp x0.., RowBroadcastOp x, r).
_FN_LOCALS = {"x", "r"} | {f"x{i}" for i in range(16)}
_BUILTINS = {"threadIdx.x", "threadIdx.y", "threadIdx.z", "blockIdx.x", "blockIdx.y", "blockIdx.z",
             "gridDim.x", "gridDim.y", "gridDim.z", "blockDim.x"}


def _uses(op: Op) -> set[str]:
    """The C++ names `op` itself reads."""
    names: set[str] = set()
    skip = _NOT_NAMES | set(op.defines) | set(op.regions) | op.declared_effects.token_fields()
    for f in fields(op):
        if f.name in skip:
            continue
        value = getattr(op, f.name)
        values = value if isinstance(value, tuple) else (value,)
        for v in values:
            if isinstance(v, Expr):
                found = free_names(v) - set(getattr(op, "binds", {}).get(f.name, ()))   # a MaskOp's q_idx, kv_idx
                names |= found - _FN_LOCALS if f.name == "fn" else found
            elif isinstance(v, str) and v:
                names.add(v)
    return names


def check_scopes(program: ProgramOp) -> None:
    structs = {op.name: {n for n, _ in op.fields} for op in program.body if isinstance(op, ParamsOp)}
    file_scope = {op.name for op in program.body if isinstance(op, TraceBufferOp)}
    for kernel in program.kernels():
        if kernel.params not in structs:
            raise fail(f"kernel IR: kernel {kernel.name} uses undefined parameter struct {kernel.params}", kernel.loc)
        _check_block(kernel.body, [set(file_scope)], structs[kernel.params], set())


def _check_block(ops: tuple[Op, ...], scopes: list[set[str]], params: set[str], tokens: set[str]) -> None:
    scopes.append(set())
    for op in ops:
        effects = op.effects()
        if missing := effects.tokens_used - tokens:
            raise fail(f"kernel IR: {type(op).__name__} refers to undefined token/group {sorted(missing)[0]}", op.loc)
        for name in sorted(_uses(op)):
            if name in _BUILTINS or any(name in s for s in scopes):
                continue
            if name.startswith("p.") and name[2:] in params:
                continue
            raise fail(f"kernel IR: {type(op).__name__} uses `{name}` before it is defined", op.loc)
        tokens |= effects.tokens_defined
        defined = [n for n in op.defined_names() if n not in effects.tokens_defined]
        if op.regions:
            inner = [s for s in scopes] + [set(defined)]
            for region in op.regions:
                _check_block(getattr(op, region), inner, params, tokens)
            if not isinstance(op, KernelOp):
                continue
        scopes[-1].update(defined)
    scopes.pop()
