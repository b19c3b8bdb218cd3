"""Kernel-IR base: the `Op` dataclass every kernel-IR op derives from, shared constants, `walk`.

The emitter has exactly one handler per class here. Every op carries the `loc` of the TL
statement it came from, so `#line` directives and late errors point at the user's `.tl` line.
Names that become C++ identifiers are checked by `verify()`; scalar math is an `Expr`. Each op
class declares its effects (`tlc.kir.effects`); `op.effects()` reads the declaration.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from typing import ClassVar, Iterator

from tlc.diagnostics import Loc, fail
from tlc.kir.effects import EffectDecl, Effects
from tlc.kir.expr import Expr, check_ident, free_names, substitute

DTYPES = ("bf16", "fp16", "fp32")
SCALAR_TYPES = ("i32", "i64", "f32", "bool")
PARAM_TYPES = ("ptr<bf16>", "ptr<fp16>", "ptr<f32>", "ptr<i32>", "i32", "i64", "f32")
# MMA and copy atoms the backend can spell, with CuTe names (validated, then printed verbatim).
MMA_ATOMS = ("SM80_16x8x16_F32BF16BF16F32_TN", "SM80_16x8x16_F32F16F16F32_TN", "SM80_16x8x8_F32F16F16F32_TN")
COPY_ATOMS = ("SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>", "SM80_CP_ASYNC_CACHEALWAYS<cute::uint128_t>",
              "SM75_U32x4_LDSM_N", "SM75_U16x8_LDSM_T", "UniversalCopy<cute::uint128_t>",
              "UniversalCopy<uint32_t>", "AutoVectorizingCopyWithAssumedAlignment<128>")
PARTITIONS = ("partition_S", "partition_D", "partition_A", "partition_B", "partition_C", "retile_S", "retile_D")


@dataclass(frozen=True, kw_only=True)
class Op:
    """Base: `loc` is the TL statement the op came from (None for synthesized boilerplate)."""

    loc: Loc | None = None
    # Field names holding C++ names this op defines; checked as identifiers by verify().
    defines: ClassVar[tuple[str, ...]] = ()
    regions: ClassVar[tuple[str, ...]] = ()
    # What the op itself reads, writes and does (not its regions' ops). Every op class declares it (a
    # subclass inherits its base's); None here, so an op class that forgets is refused, never effect-free.
    declared_effects: ClassVar[EffectDecl | None] = None

    def verify(self) -> None:
        for name in self.defines:
            check_ident(getattr(self, name), f"{type(self).__name__}.{name}")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in self.regions:
                for op in value:
                    if not isinstance(op, Op):
                        raise fail(f"kernel IR: {type(self).__name__}.{f.name} holds a non-op {op!r}", self.loc)
                    op.verify()
        self.check()

    def check(self) -> None:
        """Op-specific invariants; raise `fail(...)` on violation."""

    def effects(self) -> Effects:
        """What this op reads, writes and does, from its class's declaration; its regions' ops are
        not included (`nested_effects`)."""
        if self.declared_effects is None:
            raise TypeError(f"kernel IR: {type(self).__name__} declares no effects (declared_effects)")
        return self.declared_effects.of(self)

    def defined_names(self) -> list[str]:
        return [getattr(self, n) for n in self.defines]

    def used_names(self) -> set[str]:
        """Names this op itself reads: its expressions' free names and its name-valued fields (not the
        names it defines, not its regions)."""
        out: set[str] = set()
        for f in fields(self):
            if f.name in self.regions or f.name in self.defines or f.name == "loc":
                continue
            value = getattr(self, f.name)
            for item in value if isinstance(value, tuple) else (value,):
                if isinstance(item, Expr):
                    out |= free_names(item)
                elif isinstance(item, str):
                    out.add(item)
        return out

    def _need(self, cond: bool, msg: str) -> None:
        if not cond:
            raise fail(f"kernel IR: {type(self).__name__} {msg}", self.loc)


def _ints(value: tuple, n: int | None = None) -> bool:
    return isinstance(value, tuple) and all(isinstance(v, int) and v > 0 for v in value) and (
        n is None or len(value) == n)


def walk(op: Op) -> Iterator[Op]:
    """Pre-order over `op` and its regions."""
    yield op
    for region in op.regions:
        for child in getattr(op, region):
            yield from walk(child)


def names_used(ops) -> set[str]:
    """The names `ops` and their regions read."""
    return {n for top in ops for op in walk(top) for n in op.used_names()}


def names_defined(ops) -> set[str]:
    """The names `ops` and their regions define."""
    return {n for top in ops for op in walk(top) for n in op.defined_names()}


def nested_effects(op: Op) -> Effects:
    """What `op` and every op in its regions read, write and do: what running it does."""
    out = op.effects()
    for region in op.regions:
        for child in getattr(op, region):
            out |= nested_effects(child)
    return out


def rewrite_ops(ops, fn) -> tuple[Op, ...]:
    """`ops` with each op replaced by `fn(op)` (None drops it), pre-order: a kept op's regions are
    rewritten the same way."""
    out = []
    for op in ops:
        op = fn(op)
        if op is None:
            continue
        if op.regions:
            op = replace(op, **{r: rewrite_ops(getattr(op, r), fn) for r in op.regions})
        out.append(op)
    return tuple(out)


def substitute_op(op: Op, name: str, value: Expr) -> Op:
    """`op` with `name` replaced by `value` in every expression, regions included."""
    changes = {}
    for f in fields(op):
        v = getattr(op, f.name)
        if isinstance(v, Expr):
            changes[f.name] = substitute(v, name, value)
        elif f.name in op.regions:
            changes[f.name] = tuple(substitute_op(c, name, value) for c in v)
        elif isinstance(v, tuple) and v and all(isinstance(x, Expr) for x in v):
            changes[f.name] = tuple(substitute(x, name, value) for x in v)
    return replace(op, **changes)


def substitute_names(op: Op, values: dict[str, Expr]) -> Op:
    """`op` with each name of `values` replaced by its expression, one after the other (`substitute_op`)."""
    for name, value in values.items():
        op = substitute_op(op, name, value)
    return op


_SNAKE = re.compile(r"(?<!^)(?=[A-Z])")


def op_label(cls: type[Op]) -> str:
    return _SNAKE.sub("_", cls.__name__[:-2]).lower()
