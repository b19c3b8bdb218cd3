"""TL expressions → kernel-IR expressions: the one bridge between the two levels.

Params become constants, runtime Inputs read the launch struct (`p.seqlen_k`), the built-in
indices (`block_idx`, `head_idx`, `batch_idx`, `group`) and loop variables become the kernel's
scalars. Division follows the language: it rounds up in a loop bound and down elsewhere, so the
kernel's loop runs exactly the trips the interpreter runs.
"""
from __future__ import annotations

from typing import Mapping

from tlc.diagnostics import Loc, fail
from tlc.frontend import ast as A
from tlc.kir.expr import BinOp, Call, Const, Expr, Neg, Var

BUILTINS = ("block_idx", "head_idx", "batch_idx", "group")


class ExprLowering:
    """Translate TL `Expr`s in one program. `scalars` maps TL names (loop variables, scalar
    values, built-ins) to the kernel-IR names they have in the kernel."""

    def __init__(self, params: Mapping[str, object], inputs: Mapping[str, str],
                 fields: Mapping[str, str]) -> None:
        self.params = params
        self.inputs = inputs
        self.fields = fields          # runtime Input name → parameter struct field
        self.scalars: dict[str, str] = {b: b for b in BUILTINS}
        self.float_names = {f"p.{f}" for n, f in fields.items() if inputs.get(n) == "float"}

    def bind(self, tl_name: str, kir_name: str, *, is_float: bool = False) -> None:
        self.scalars[tl_name] = kir_name
        if is_float:
            self.float_names.add(kir_name)

    def lower(self, e: A.Expr, loc: Loc | None, *, ceil: bool = False) -> Expr:
        """`e` as a kernel-IR expression; `ceil`: `/` rounds up (loop bounds)."""
        if isinstance(e, A.Num):
            return Const(e.value)
        if isinstance(e, A.Name):
            return self._name(e.id, loc)
        if isinstance(e, A.Neg):
            inner = self.lower(e.operand, loc, ceil=ceil)
            return Const(-inner.value) if isinstance(inner, Const) and not isinstance(inner.value, bool) else Neg(inner)
        if isinstance(e, A.Call):
            args = tuple(self.lower(a, loc, ceil=ceil) for a in e.args)
            if e.fn == "cdiv" and len(args) == 2:
                return _fold(Call("ceil_div", args))
            if e.fn in ("min", "max") and len(args) == 2:
                return _fold(Call(e.fn, args))
            raise fail(f"tlc build: cannot lower the call '{e}': cdiv(a, b), min(a, b) and max(a, b) are "
                       "supported", loc)
        if isinstance(e, A.BinOp):
            lhs, rhs = self.lower(e.lhs, loc, ceil=ceil), self.lower(e.rhs, loc, ceil=ceil)
            if e.op == "/" and self._is_int(lhs) and self._is_int(rhs):
                return _fold(Call("ceil_div" if ceil else "floor_div", (lhs, rhs)))
            return _fold(BinOp(e.op, lhs, rhs))
        raise fail(f"tlc build: cannot lower the expression '{e}'", loc)

    def _name(self, name: str, loc: Loc | None) -> Expr:
        if name in self.scalars:
            return Var(self.scalars[name])
        if name in self.params:
            value = self.params[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise fail(f"tlc build: Param '{name}' = {value!r} is not a number and cannot be used in "
                           "an expression", loc)
            return Const(value)
        if name in self.fields:
            return Var(f"p.{self.fields[name]}")
        raise fail(f"tlc build: '{name}' has no value in the kernel (not a Param, an Input, a loop variable "
                   f"or one of {', '.join(BUILTINS)})", loc)

    def _is_int(self, e: Expr) -> bool:
        """Integer-valued: no float constant, float Input or float scalar inside."""
        if isinstance(e, Const):
            return not isinstance(e.value, float)
        if isinstance(e, Var):
            return e.name not in self.float_names
        if isinstance(e, Neg):
            return self._is_int(e.arg)
        if isinstance(e, BinOp):
            return self._is_int(e.lhs) and self._is_int(e.rhs)
        if isinstance(e, Call):
            return all(self._is_int(a) for a in e.args)
        return True

    def int_value(self, e: A.Expr, loc: Loc | None, what: str) -> int:
        """A compile-time integer (tile extents, head dims)."""
        k = self.lower(e, loc)
        if not isinstance(k, Const) or isinstance(k.value, bool) or not float(k.value).is_integer():
            raise fail(f"tlc build: {what} '{e}' must be a compile-time integer (a Param or a number)", loc)
        return int(k.value)


def _fold(e: Expr) -> Expr:
    """Fold constant arithmetic so static extents stay static in the C++."""
    if isinstance(e, BinOp) and isinstance(e.lhs, Const) and isinstance(e.rhs, Const):
        a, b = e.lhs.value, e.rhs.value
        if e.op in "+-*":
            return Const({"+": a + b, "-": a - b, "*": a * b}[e.op])
        if e.op == "%" and b:
            return Const(a % b)
    if isinstance(e, Call) and all(isinstance(a, Const) for a in e.args):
        a, b = (x.value for x in e.args)
        if e.fn == "ceil_div" and b:
            return Const(-(-a // b))
        if e.fn == "floor_div" and b:
            return Const(a // b)
        if e.fn in ("min", "max"):
            return Const(min(a, b) if e.fn == "min" else max(a, b))
    return e
