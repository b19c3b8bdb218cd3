"""TL expressions in the kernel: which names they read there and what their division means.

The TL graph and the kernel IR share one expression language (`tlc.expr`), so nothing is
translated node by node; one rewrite applies the lowering's decisions. Params become constants,
runtime Inputs read the launch struct (`p.seqlen_k`), the built-in indices (`block_idx`,
`head_idx`, `batch_idx`, `group`) and loop variables become the kernel's scalars, TL's `cdiv` is
the kernel's `ceil_div`. Division follows the language: an integer `/` rounds up in a loop bound
and down elsewhere (C++ would truncate), so the kernel's loop runs exactly the interpreter's trips;
an integer `%` floors (`floor_mod`) unless both operands are provably non-negative, where C++'s
`%` agrees: `head_idx % group` stays, `(n - 1) % 2` becomes `floor_mod(n - 1, 2)`.
"""
from __future__ import annotations

from functools import reduce
from typing import Mapping

from tlc.diagnostics import Loc, fail
from tlc.expr import BinOp, Call, Const, Expr, Index, Neg, Var, floor_divisions, fold_node, rewrite, subexprs, substitute
from tlc.ir.tensor_inputs import TensorInput, loads, tensor_pointer
from tlc.ir.row_maps import ROW
from tlc.frontend.names import BUILTINS  # the built-in indices: all >= 0 (group >= 1) in the kernel
from tlc.frontend.names import MASK_POSITIONS

_KERNEL_CALLS = {"cdiv": "ceil_div"}  # TL spelling → the kernel's
_NON_NEGATIVE_CALLS = ("floor_div", "ceil_div", "floor_mod", "min", "max")  # of non-negative arguments


class ExprLowering:
    """Lower TL `Expr`s of one program. `scalars` maps TL names (loop variables, scalar values,
    built-ins) to the kernel-IR names they have in the kernel."""

    def __init__(self, params: Mapping[str, object], inputs: Mapping[str, str],
                 fields: Mapping[str, str], tensor_inputs: Mapping[str, TensorInput] | None = None) -> None:
        self.params = params
        self.inputs = inputs
        self.tensor_inputs = dict(tensor_inputs or {})
        # runtime Input name → parameter struct field; a tensor Input's is its pointer
        self.fields = {**fields, **{n: tensor_pointer(n) for n in self.tensor_inputs}}
        self.scalars: dict[str, str] = {b: b for b in BUILTINS}
        self._row_map = False   # lowering a row map, whose `row` is a tensor row (>= 0)
        self.float_names = {f"p.{f}" for n, f in self.fields.items()
                            if inputs.get(n) == "float" or n in self.tensor_inputs and self.tensor_inputs[n].kind == "float"}

    def bind(self, tl_name: str, kir_name: str, *, is_float: bool = False) -> None:
        self.scalars[tl_name] = kir_name
        if is_float:
            self.float_names.add(kir_name)

    def lower(self, e: Expr, loc: Loc | None, *, ceil: bool = False, positions: bool = False) -> Expr:
        """`e` as the kernel computes it; `ceil`: an integer `/` rounds up (loop bounds); `positions`: a mask
        predicate, whose `q_idx` and `kv_idx` the kernel's MaskOp binds per element (integers that may be
        negative, before a tile counted from the end)."""
        def rule(x: Expr) -> Expr:
            if isinstance(x, Var):
                if "." in x.name:   # a launch size the loads' dimensions read (p.batch): already the kernel's
                    return x
                return x if positions and x.name in MASK_POSITIONS else self._name(x.name, loc)
            if isinstance(x, Call) and x.fn == "load":
                return x
            if isinstance(x, Call):
                x = self._call(x, loc)
            elif isinstance(x, BinOp) and x.op == "/" and self._is_int(x.lhs) and self._is_int(x.rhs):
                x = Call("ceil_div" if ceil else "floor_div", (x.lhs, x.rhs))
            elif isinstance(x, BinOp) and x.op == "%":
                x = self._modulo(x, loc)
            return fold_node(x)

        return rewrite(self._loads(e, loc), rule)

    def lower_row_map(self, e: Expr, loc: Loc | None) -> Expr:
        """A row map (`rows at E`, tlc/ir/row_maps.py) as the kernel computes it, over the kernel variable `row`."""
        had = self.scalars.get(ROW)
        self.scalars[ROW] = ROW
        self._row_map = True
        try:
            return self.lower(e, loc)
        finally:
            self._row_map = False
            if had is None:
                del self.scalars[ROW]
            else:
                self.scalars[ROW] = had

    def _loads(self, e: Expr, loc: Loc | None) -> Expr:
        """Each `x[i, j]` of a tensor Input as `load(x, i * dim1 + j, 0 <= i < dim0 && 0 <= j < dim1)`: the
        element of the row-major tensor, 0 where an index is outside its dimension (LANGUAGE.md §2)."""
        if isinstance(e, Index):
            t = self.tensor_inputs.get(e.base.name)
            if t is None or len(t.dims) != len(e.indices):
                raise fail(f"tlc build: '{e}' reads no tensor Input of {len(e.indices)} dimension(s)", loc)
            # an element's indices and the tensor's dimensions floor their `/` wherever the read sits (the
            # stop of a loop rounds its own `/` up, not the position it reads)
            at = [floor_divisions(self._loads(i, loc)) for i in e.indices]
            dims = [floor_divisions(self._dim(d)) for d in t.dims]
            flat: Expr = at[0]
            for i, d in zip(at[1:], dims[1:]):
                flat = BinOp("+", BinOp("*", flat, d), i)
            inside = reduce(lambda a, b: BinOp("&&", a, b),
                            [BinOp("&&", BinOp(">=", i, Const(0)), BinOp("<", i, d)) for i, d in zip(at, dims)])
            return Call("load", (e.base, flat, inside))
        if not loads(e):
            return e
        if isinstance(e, Neg):
            return Neg(self._loads(e.arg, loc))
        if isinstance(e, BinOp):
            return BinOp(e.op, self._loads(e.lhs, loc), self._loads(e.rhs, loc))
        if isinstance(e, Call):
            return Call(e.fn, tuple(self._loads(a, loc) for a in e.args))
        return e

    @staticmethod
    def _dim(d: Expr) -> Expr:
        """A tensor Input's dimension with the launch sizes it may name as the kernel has them."""
        sizes = {"batch": Var("p.batch"), "heads": Var("p.heads"),
                 "kv_heads": Call("floor_div", (Var("p.heads"), Var("p.group")))}
        for name, value in sizes.items():
            d = substitute(d, name, value)
        return d

    def _modulo(self, e: BinOp, loc: Loc | None) -> Expr:
        """TL's `%` floors like Python's; C++'s truncates, which differs only for a negative operand."""
        if not (self._is_int(e.lhs) and self._is_int(e.rhs)):
            raise fail(f"tlc build: cannot lower '{e}': `%` in the kernel takes integer operands, and this one "
                       "has a float operand", loc)
        if self._non_negative(e.lhs) and self._non_negative(e.rhs):
            return e
        return Call("floor_mod", (e.lhs, e.rhs))

    def _call(self, e: Call, loc: Loc | None) -> Expr:
        fn = _KERNEL_CALLS.get(e.fn, e.fn)
        if fn in ("min", "max"):  # C++'s min and max take two arguments
            return reduce(lambda acc, arg: fold_node(Call(fn, (acc, arg))), e.args[1:], e.args[0])
        if fn not in ("ceil_div", "floor_div"):
            raise fail(f"tlc build: cannot lower the call '{e}': cdiv(a, b), min(a, b, …) and max(a, b, …) are "
                       "supported", loc)
        return Call(fn, e.args)

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
        for x in subexprs(e):
            if isinstance(x, Const) and isinstance(x.value, float):
                return False
            if isinstance(x, Var) and x.name in self.float_names:
                return False
        return True

    def _non_negative(self, e: Expr) -> bool:
        """A cheap proof that the lowered integer `e` is >= 0: constants, the built-in indices (when
        no TL name was bound to theirs), and `+ * %`, divisions, min and max of such. False means
        "not proven", not "negative"."""
        if isinstance(e, Const):
            return not isinstance(e.value, bool) and e.value >= 0
        if isinstance(e, Var):
            if e.name == ROW and self._row_map:   # a row map's row: a tensor row, from 0
                return True
            return e.name in BUILTINS and [k for k, v in self.scalars.items() if v == e.name] == [e.name]
        if isinstance(e, BinOp):
            return e.op in ("+", "*", "%") and self._non_negative(e.lhs) and self._non_negative(e.rhs)
        if isinstance(e, Call):
            return e.fn in _NON_NEGATIVE_CALLS and all(self._non_negative(a) for a in e.args)
        return False

    def int_value(self, e: Expr, loc: Loc | None, what: str) -> int:
        """A compile-time integer (tile extents, head dims)."""
        k = self.lower(e, loc)
        if not isinstance(k, Const) or isinstance(k.value, bool) or not float(k.value).is_integer():
            raise fail(f"tlc build: {what} '{e}' must be a compile-time integer (a Param or a number)", loc)
        return int(k.value)

