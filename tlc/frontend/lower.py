"""AST → TL graph: name resolution, SSA renaming and the semantic checks of LANGUAGE.md.

Each TL name has one current value per memory space; `Copy X from A to B` reads X's
value in A and defines a new one in B, a Compute reads the newest value of a name in
any space, and in-place forms (`get new S`) define new SSA versions. A name redefined
inside a loop that existed before it becomes a loop-carried value.
"""
from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field, replace
from typing import Any

from tlc.diagnostics import DiagnosticSink, Loc, Note
from tlc.frontend import ast as A
from tlc.frontend.lower_mask import lower_mask
from tlc.frontend.names import BUILTINS, MASK_POSITIONS, identifier_problem, unknown_operation
from tlc.frontend.params import SCHEDULE_PARAMS, bind_define, bind_schedule_define
from tlc.ir.graph import Graph
from tlc.ir.row_maps import ROW
from tlc.ir.tensor_inputs import DIM_NAMES, TensorInput, loads, scalar_names, stored_rows
from tlc.ir.tensor_inputs import DTYPES as TENSOR_DTYPES
from tlc.ir.ops import (ELEMENTWISE, AllocateOp, CopyOp, ElementwiseOp, GemmOp, LoopOp, Op, ReshapeOp, ScalarOp,
                        SoftmaxOp)
from tlc.ir.types import (MEMORY_DTYPES, MMA_ROLE, SCALAR, SPACES, TileType, Value, canonical_dtype,
                          dtype_spellings)
from tlc.expr import Index, subexprs
from tlc.frontend.lower_scopes import assigned_names, sketch_prelude, drop_dead_carried
from tlc.names import FreshNames

COORD_KEYS = {"L": 0, "C": 1}


@dataclass
class _Def:
    value: Value
    loc: Loc
    empty: bool = False  # a shared buffer nothing has been copied into yet


@dataclass
class _Scope:
    """Names visible in one region: name → space → definition, plus the newest space."""

    defs: dict[str, dict[str, _Def]] = field(default_factory=dict)
    newest: dict[str, str] = field(default_factory=dict)
    exports: dict[str, _Def] = field(default_factory=dict)  # softmax statistics


class Lowerer:
    def __init__(self, program: A.Program, defines: dict[str, str] | None, sketch: bool, sink: DiagnosticSink):
        self.program = program
        self.defines = dict(defines or {})
        self.sketch = sketch
        self.sink = sink
        self.graph = Graph(program.file)
        self.scopes: list[_Scope] = [_Scope()]
        self.regions: list[Graph] = [self.graph]
        self.names = FreshNames(sep=".")   # SSA versions of a TL name: S, S.1, S.2
        self.param_locs: dict[str, Loc] = {}
        self.bad_params: set[str] = set()  # already reported: stay quiet where they are used
        self.loop_vars: list[str] = []
        self.softmaxes: list[tuple[Graph, SoftmaxOp, str | None]] = []
        self.store_modes: dict[str, tuple[bool, Loc]] = {}   # global tensor → (stored by `and add`, first store)
        self.gathered: dict[str, Loc] = {}   # global tensors read through a row map (`with rows at`)

    # ------------------------------------------------------------ helpers
    def err(self, msg: str, loc: Loc, *notes: Note) -> None:
        self.sink.error(msg, loc, *notes)

    def fresh(self, base: str, ty: TileType) -> Value:
        return Value(self.names.fresh(base), ty, base)

    def emit(self, op: Op) -> Op:
        return self.regions[-1].add(op)

    def check_ident(self, name: str, loc: Loc) -> bool:
        problem = identifier_problem(name)
        if problem:
            self.err(problem, loc)
        return problem is None

    def lookup(self, name: str, space: str | None = None) -> _Def | None:
        for scope in reversed(self.scopes):
            if name in scope.defs:
                spaces = scope.defs[name]
                if space is None:
                    want = scope.newest.get(name)
                    if want in spaces:
                        return spaces[want]
                    continue  # the newest definition lives in an enclosing scope
                if space in spaces:
                    return spaces[space]
        return None

    def define(self, name: str, space: str, value: Value, loc: Loc, *, empty: bool = False) -> None:
        scope = self.scopes[-1]
        scope.defs.setdefault(name, {})[space] = _Def(value, loc, empty)
        scope.newest[name] = space

    def scalar_names(self) -> set[str]:
        return (set(self.graph.params) | set(self.graph.inputs) | set(BUILTINS) | set(self.loop_vars)
                | set(self.graph.axes))

    def known_tile_names(self) -> list[str]:
        names: set[str] = set()
        for scope in self.scopes:
            names |= set(scope.defs)
        return sorted(names)

    def check_expr(self, e: A.Expr, loc: Loc, what: str, *, loads_ok: bool = False, also=frozenset()) -> None:
        """Names `e` reads are declared scalars (or in `also`); an indexed read (`seqlens[batch_idx]`) only where
        `loads_ok`."""
        self.check_loads(e, loc, what, loads_ok)
        for n in sorted(scalar_names(e)):
            if n in self.scalar_names() or n in also:
                continue
            if n in self.graph.tensor_inputs:
                continue   # check_loads said it: a tensor Input read without an index
            if self.sketch:
                continue
            if self.lookup(n) is not None:
                self.err(f"'{n}' is a tile, but {what} needs an integer or scalar expression", loc)
                continue
            self.err(f"undefined name '{n}' in {what}{self.suggest(n, self.scalar_names())}; "
                     "declare it with 'Param' or 'Input'", loc)
        self.check_divisors(e, loc, what)

    def check_loads(self, e: A.Expr, loc: Loc, what: str, allowed: bool) -> bool:
        """Each indexed read names a tensor Input with one index per dimension, where reads are allowed;
        a tensor Input is never read whole. True when all is well."""
        ok = True
        for x in loads(e):
            name = x.base.name
            t = self.graph.tensor_inputs.get(name)
            if t is None and self.sketch:
                continue
            if t is None:
                what_it_is = "a tile" if self.lookup(name) is not None else (
                    "a scalar" if name in self.scalar_names() else "not declared")
                self.err(f"'{x}' indexes '{name}', which is {what_it_is}: a TL expression indexes only tensor "
                         f"Inputs ('Input {name} : int32[…]'); name a tile's position with 'in coordinate [L = …]'",
                         loc)
            elif len(x.indices) != len(t.dims):
                self.err(f"'{x}' gives {len(x.indices)} index(es), but '{name}' is {t.text()}: one index per "
                         "dimension", loc)
            elif any(self.float_part(i) is not None for i in x.indices):
                bad = next(self.float_part(i) for i in x.indices if self.float_part(i) is not None)
                self.err(f"'{x}' indexes with '{bad}', which is not an integer: an index is a whole position", loc)
            elif not allowed:
                self.err(f"{what} cannot read a tensor Input ('{x}'): indexed reads are allowed in loop bounds, "
                         "mask predicates and a global tensor's row extent", loc)
            else:
                continue
            ok = False
        for n in sorted(scalar_names(e) & set(self.graph.tensor_inputs)):
            self.err(f"'{n}' is a tensor Input ({self.graph.tensor_inputs[n].text()}): read one element, "
                     f"'{n}[…]'", loc)
            ok = False
        return ok

    def check_divisors(self, e: A.Expr, loc: Loc, what: str) -> None:
        for x in subexprs(e):  # calls and operators were checked by the parser, at their column
            divisor = x.rhs if isinstance(x, A.BinOp) and x.op in "/%" else (
                x.args[1] if isinstance(x, A.Call) and x.fn == "cdiv" and len(x.args) == 2 else None)
            if divisor is not None and self.constant(divisor) == 0:
                self.err(f"division by zero in {what}: '{divisor}' is 0 here; divide by a nonzero tile size", loc)

    def constant(self, e: A.Expr) -> int | float | None:
        """The value of `e` if it is known at compile time (numbers and valued Params), else None."""
        env = {k: v for k, v in self.graph.params.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if not A.expr_names(e) <= env.keys():
            return None
        try:
            return A.eval_expr(e, env, ceil_div=True)
        except (A.ExprError, ArithmeticError):
            return None

    @staticmethod
    def suggest(name: str, candidates) -> str:
        close = difflib.get_close_matches(name, list(candidates), n=1)
        return f" (did you mean '{close[0]}'?)" if close else ""

    def dtype(self, name: str | None, loc: Loc) -> str | None:
        if name is None:
            return None
        if canonical_dtype(name):
            return canonical_dtype(name)
        if name in self.graph.params and canonical_dtype(self.graph.params[name]):
            return canonical_dtype(self.graph.params[name])
        if name not in self.bad_params:  # a bad 'Param dtype' is reported once, at its line
            self.err(f"unknown element type '{name}'; the element types are {dtype_spellings()}", loc)
        return None

    def program_dtype(self) -> str | None:
        return canonical_dtype(self.graph.params.get("dtype"))

    def space(self, name: str, loc: Loc) -> str | None:
        low = name.lower()
        if low in SPACES:
            return low
        if low in ("registers", "reg", "rmem"):
            hint = " (did you mean 'register'?)"
        elif low in ("smem", "shmem", "sram"):
            hint = " (did you mean 'shared'?)"
        elif low in ("gmem", "hbm", "dram"):
            hint = " (did you mean 'global'?)"
        else:
            hint = self.suggest(low, SPACES)
        self.err(f"unknown memory space '{name}'{hint}; the spaces are global, shared and register", loc)
        return None

    # ------------------------------------------------------------ program
    def run(self) -> Graph:
        for stmt in self.program.body:
            if isinstance(stmt, A.ParamStmt):
                self.param(stmt)
        for name in self.defines:
            if name not in self.graph.params and name in SCHEDULE_PARAMS:
                self.schedule_define(name)
            elif name not in self.graph.params:
                self.err(f"-D {name}: the program has no 'Param {name}'; known: "
                         f"{', '.join(sorted(self.graph.params)) or 'none'}", Loc(self.program.file, 0, 0))
        for name, value in self.graph.params.items():
            if value is None and not self.sketch:
                self.err(f"parameter '{name}' has no value; write 'Param {name} = …' or pass -D {name}=…",
                         self.param_locs[name])
        self.grid_axes()
        self.all_loop_vars = _loop_vars(self.program.body)
        if self.sketch:
            self.block(sketch_prelude(self.program.body))
        self.block(self.program.body)
        self.check_grid_axes()
        self.refuse_loads_of_stored()
        self.finish_softmax()
        drop_dead_carried(self.graph)
        return self.graph

    def grid_axes(self) -> None:
        """A kernel's own grid axes (`Kernel partial over [split_idx = Splits]`): names its expressions may read,
        each ranging over 0 … extent − 1, the extent an expression over Params and int Inputs."""
        for name, extent in self.program.axes:
            loc = self.program.axes_loc or Loc(self.program.file, 0, 0)
            problem = identifier_problem(name)
            taken = name in self.graph.params or name in BUILTINS or name in MASK_POSITIONS or name in self.graph.axes \
                or name in KERNEL_RESERVED or any(name in s.names for s in self.program.body if isinstance(s, A.InputStmt))
            if problem or taken or name.endswith("_"):
                self.err(problem or f"grid axis '{name}' is already a name of the program or of the kernel's code "
                         "(names ending in '_' are the generated code's own); choose another", loc)
                continue
            self.graph.axes[name] = extent

    def check_grid_axes(self) -> None:
        """Each grid axis's extent reads Params and int Inputs only (checked once the Inputs are declared)."""
        loc = self.program.axes_loc or Loc(self.program.file, 0, 0)
        for name, extent in self.graph.axes.items():
            other = sorted(set(scalar_names(extent)) - set(self.graph.params) - set(self.graph.inputs))
            if other:
                self.err(f"the extent of grid axis '{name}' reads '{other[0]}'; an extent is an expression over "
                         "Params and int Inputs", loc)

    def param(self, s: A.ParamStmt) -> None:
        if not self.check_ident(s.name, s.loc):
            return
        if s.name in self.graph.params:
            self.err(f"parameter '{s.name}' is defined twice", s.loc,
                     Note("first defined here", self.param_locs[s.name]))
            return
        if s.name in BUILTINS or s.name in MASK_POSITIONS:
            self.err(f"'{s.name}' is a built-in {'runtime index' if s.name in BUILTINS else 'mask position'}; "
                     "choose another parameter name", s.loc)
            return
        value = self.define_value(s) if s.name in self.defines else s.value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            value = value.lower() == "true"
        value = canonical_dtype(value) or value  # later layers key on bf16/fp16/fp32 only
        if s.name == "dtype" and value is not None and value not in MEMORY_DTYPES:
            self.bad_params.add(s.name)
            what = ("fp32 is the accumulators' type, not a tile's in memory" if value == "fp32"
                    else f"'{value}' is not an element type")
            self.err(f"Param dtype = {value}: {what}; write one of {dtype_spellings(MEMORY_DTYPES)}", s.loc)
        self.graph.params[s.name] = value
        self.param_locs[s.name] = self.graph.param_locs[s.name] = s.loc

    def schedule_define(self, name: str) -> None:
        """`-D Stages=3` and the other schedule knobs bind without a Param (located at the file)."""
        loc = Loc(self.program.file, 0, 0)
        value, problem = bind_schedule_define(name, self.defines[name])
        if problem:
            self.err(problem, loc)
            return
        self.graph.params[name] = value
        self.param_locs[name] = self.graph.param_locs[name] = loc

    def define_value(self, s: A.ParamStmt) -> Any:
        """The value `-D NAME=…` binds, checked against what the Param was declared as."""
        value, problem = bind_define(s.name, s.value, self.defines[s.name])
        if problem:
            self.err(problem, s.loc)
            self.bad_params.add(s.name)
            return s.value
        return value

    def guarded_off(self, s: A.Stmt) -> bool:
        if s.when is None:
            return False
        if s.when not in self.graph.params:
            self.err(f"'when {s.when}': no boolean 'Param {s.when}' is defined", s.loc)
            return True
        v = self.graph.params[s.when]
        if v is None and self.sketch:
            return False
        if not isinstance(v, bool):
            self.err(f"'when {s.when}' needs a true/false parameter, but {s.when} = {v}", s.loc)
            return True
        return not v

    def block(self, stmts) -> None:
        for s in stmts:
            if isinstance(s, A.ParamStmt) or self.guarded_off(s):
                continue
            handler = getattr(self, "stmt_" + type(s).__name__)
            handler(s)

    # ------------------------------------------------------------ statements
    def stmt_KernelStmt(self, s: A.KernelStmt) -> None:
        self.err(f"'Kernel {s.name}': this program has several kernels, lowered one by one "
                 "(tlc.api.compile_module, tlc/frontend/kernels.py); this entry point takes a one-kernel program", s.loc)

    def stmt_InputStmt(self, s: A.InputStmt) -> None:
        tensor = s.dims is not None
        if tensor and s.kind not in TENSOR_DTYPES:
            self.err(f"a tensor Input's element type must be {' or '.join(TENSOR_DTYPES)}, not '{s.kind}'", s.loc)
            return
        if not tensor and s.kind not in ("int", "float"):
            hint = f" (a tensor: '{s.kind}[…]' with its dimensions)" if s.kind in TENSOR_DTYPES else ""
            self.err(f"input type must be int or float, not '{s.kind}'{hint}", s.loc)
        if tensor and not self.input_dims_ok(s.dims or (), s.loc):
            return
        for n in s.names:
            if not self.check_ident(n, s.loc):
                continue
            if (n in self.graph.inputs or n in self.graph.tensor_inputs or n in self.graph.params or n in BUILTINS
                    or n in MASK_POSITIONS or n in DIM_NAMES):
                self.err(f"'{n}' is already declared" if n not in DIM_NAMES else
                         f"'{n}' is {DIM_NAMES[n]} in a tensor Input's dimensions; rename the Input", s.loc)
                continue
            if tensor:
                self.graph.tensor_inputs[n] = TensorInput(s.kind, tuple(s.dims or ()))
            else:
                self.graph.inputs[n] = s.kind

    def float_part(self, e: A.Expr) -> str | None:
        """A part of `e` whose value is not an integer (a float number, Param or Input, an fp32 element), or None."""
        for x in subexprs(e):
            if isinstance(x, A.Const) and isinstance(x.value, float):
                return str(x)
            if isinstance(x, A.Var) and (self.graph.inputs.get(x.name) == "float"
                                         or isinstance(self.graph.params.get(x.name), float)):
                return x.name
            if isinstance(x, Index) and x.base.name in self.graph.tensor_inputs \
                    and self.graph.tensor_inputs[x.base.name].kind == "float":
                return str(x)
        return None

    def input_dims_ok(self, dims: tuple[A.Expr, ...], loc: Loc) -> bool:
        """A dimension is a number, a numeric Param, an int Input or a launch size (batch, heads, kv_heads)."""
        ok = True
        for d in dims:
            bad = self.float_part(d)
            value = self.constant(d)
            if bad is not None or (value is not None and value < 0):
                self.err(f"a tensor Input's dimension is a whole number of elements, not '{d}'"
                         + (f" ('{bad}' is not an integer)" if bad is not None else ""), loc)
                ok = False
                continue
            for n in sorted(A.expr_names(d)):
                value = self.graph.params.get(n)
                if n in DIM_NAMES or self.graph.inputs.get(n) == "int" or (
                        isinstance(value, int) and not isinstance(value, bool)) or self.sketch:
                    continue   # a sketch leaves numeric Params open (LANGUAGE.md §2)
                self.err(f"'{n}' cannot size a tensor Input: a dimension is a number, a Param, an int Input or "
                         f"one of {', '.join(DIM_NAMES)}{self.suggest(n, [*DIM_NAMES, *self.graph.inputs])}", loc)
                ok = False
            self.check_divisors(d, loc, "a tensor Input's dimension")
        return ok

    def stmt_AllocateStmt(self, s: A.AllocateStmt) -> None:
        space = self.space(s.space, s.space_loc)
        if not self.check_ident(s.name, s.name_loc) or space is None:
            return
        for scope in self.scopes:
            prev = scope.defs.get(s.name, {}).get(space)
            if prev is not None and self.producer_is_alloc(prev.value):
                self.err(f"'{s.name}' is already allocated in {space}", s.name_loc,
                         Note("first allocated here", prev.loc))
                return
        for axis, d in enumerate(s.shape):
            extent = space == "global" and axis == 0   # the rows the program sees: min(kv_lengths[b], seqlen_k)
            self.check_expr(d, s.loc, f"the shape of '{s.name}'", loads_ok=extent)
            held = stored_rows(d) if extent else d
            if isinstance(held, str):
                self.err(f"'{s.name}': {held}", s.loc)
        if s.offset is not None:   # it may read a loop's variable: each copy evaluates it where it stands
            later = set(scalar_names(s.offset)) & self.all_loop_vars - self.scalar_names()
            self.check_expr(s.offset, s.loc, f"the offset of '{s.name}'", also=later)
            if space != "global":
                self.err("'with offset' selects a head of a global tensor; remove it from a "
                         f"{space} allocation", s.loc)
        if s.rows_at is not None:
            self.check_rows_at(s, space)
        dtype = self.dtype(s.dtype, s.loc) or (self.program_dtype() if space != "register" else "fp32")
        ty = TileType(space, tuple(s.shape), dtype)
        v = self.fresh(s.name, ty)
        self.emit(AllocateOp((v,), (), name=s.name, space=space, shape=tuple(s.shape), dtype=dtype,
                             offset=s.offset, rows_at=s.rows_at, loc=s.loc))
        self.define(s.name, space, v, s.name_loc, empty=space == "shared")

    def check_rows_at(self, s: A.AllocateStmt, space: str) -> None:
        """`with rows at E` (tlc/ir/row_maps.py): a global (rows, cols) tensor's storage row of its row `row`, an
        integer expression over `row`, batch_idx, Params, Inputs and tensor Input elements."""
        if space != "global" or len(s.shape) != 2:
            self.err(f"'rows at' gathers the rows of a global (rows, cols) tensor; '{s.name}' is "
                     f"{'a vector' if space == 'global' else f'in {space} memory'}: remove it", s.loc)
            return
        if ROW in self.scalar_names() or ROW in self.all_loop_vars:
            self.err(f"'{ROW}' names the tensor's own row in 'rows at'; rename the Param, Input or loop variable "
                     f"'{ROW}'", s.loc)
            return
        self.check_expr(s.rows_at, s.loc, f"the row map of '{s.name}'", loads_ok=True, also={ROW})
        if ROW not in scalar_names(s.rows_at):
            self.err(f"the row map of '{s.name}' does not read '{ROW}' (the tensor's row): every row would come from "
                     f"one storage row; write e.g. 'rows at block_table[batch_idx, {ROW} / Page] * Page + {ROW} % Page'",
                     s.loc)
        bad = self.float_part(s.rows_at)
        if bad is not None:
            self.err(f"the row map of '{s.name}' is a row number, a whole number; '{bad}' is not an integer", s.loc)
        self.gathered[s.name] = s.loc

    def check_store_mode(self, s: A.CopyStmt, target: Value, src: str) -> None:
        """A reduce-store (`and add`) adds a register tile into an fp32 tensor of (rows, cols); a tensor is
        stored one way only (a plain store after an add would overwrite the sum, or race with it)."""
        if s.add and (src != "register" or target.type.dtype != "fp32" or len(target.type.shape or ()) != 2):
            self.err(f"'and add' adds a register tile into an fp32 global tensor of (rows, cols); '{s.name}' is "
                     f"{target.type.dtype}{'' if len(target.type.shape or ()) == 2 else ' (a vector)'} and the tile "
                     f"comes from {src} (write 'Allocate {s.name} in global (rows, cols) as fp32' and add a "
                     "register tile)", s.loc)
        first = self.store_modes.setdefault(s.name, (s.add, s.loc))
        if first[0] != s.add:
            how = "adds into" if first[0] else "stores"
            self.err(f"'{s.name}' is stored {'with' if s.add else 'without'} 'and add' here but line "
                     f"{first[1].line} {how} it; store a tensor one way", s.loc, Note("first store here", first[1]))

    def check_offset_in_scope(self, s: A.CopyStmt, tensor: Value) -> None:
        """A head offset that reads a loop's variable is evaluated at each copy: the loop must enclose it."""
        alloc = self.regions[-1].producer(tensor) or self.graph.producer(tensor)
        offset = getattr(alloc, "offset", None)
        if offset is None:
            return
        missing = sorted(set(scalar_names(offset)) - self.scalar_names())
        if missing:
            self.err(f"'{s.name}' is at head `{offset}`, which reads '{missing[0]}', not defined here: copy it inside "
                     f"the loop over '{missing[0]}'", s.loc)

    def refuse_loads_of_stored(self) -> None:
        """A kernel reads no global tensor it writes: its blocks run in no order, so a load would see what other
        blocks have or have not stored (or added) yet. A later kernel of the program reads it instead."""
        copies = [op for _, op in self.graph.walk() if isinstance(op, CopyOp) and "global" in (op.src_space, op.dst_space)]
        stored = {op.operands[1].base: op for op in copies if op.dst_space == "global"}
        for op in copies:
            if op.src_space == "global" and op.operands[0].base in stored:
                name = op.operands[0].base
                self.err(f"'{name}' is loaded by the kernel that stores it: its blocks run in no order, so this load "
                         f"would read what other blocks have or have not written; read it in a later kernel "
                         f"('Kernel NAME' lines)", op.loc, Note("stored here", stored[name].loc))

    def producer_is_alloc(self, v: Value) -> bool:
        op = self.regions[-1].producer(v)
        return isinstance(op, AllocateOp)

    def stmt_CopyStmt(self, s: A.CopyStmt) -> None:
        src, dst = self.space(s.src, s.src_loc), self.space(s.dst, s.dst_loc)
        if src is None or dst is None or not self.check_ident(s.name, s.name_loc):
            return
        if src == dst:
            self.err(f"copy from {src} to {dst} does nothing; the spaces must differ", s.loc)
            return
        source = self.lookup(s.name, src)
        if source is None:
            if self.sketch and src == "global":
                ty = TileType("global", None, self.program_dtype())
                v = self.fresh(s.name, ty)
                self.emit(AllocateOp((v,), (), name=s.name, space="global", shape=(), dtype=ty.dtype, loc=s.loc))
                self.define(s.name, "global", v, s.name_loc)
                source = self.lookup(s.name, src)
            else:
                elsewhere = self.lookup(s.name)
                hint = (f"it is in {elsewhere.value.type.space} memory (defined at line {elsewhere.loc.line})"
                        if elsewhere else "it is not defined")
                fix = (f"add 'Allocate {s.name} in global (…)' before it" if src == "global"
                       else f"copy it to {src} first")
                self.err(f"'{s.name}' has no value in {src} memory to copy from: {hint}; {fix}", s.name_loc)
                return
        assert source is not None
        if source.empty:
            self.report_empty(s.name, source, s.name_loc)
        if src == "global":
            self.check_offset_in_scope(s, source.value)
        for key, e in s.coord:
            if key not in COORD_KEYS:
                self.err(f"unknown coordinate '{key}'; use L (tile index along rows) or C (along columns)", s.loc)
            self.check_expr(e, s.loc, "a coordinate")
        for key in s.from_end:
            e = dict(s.coord)[key]
            if key != "L" or str(e) != "block_idx":
                self.err(f"'{key} = {e} from end' is not supported: only the block's row tile is counted from the "
                         "end ('[L = block_idx from end]')", s.loc)
            elif "global" not in (src, dst):
                self.err("'from end' counts tiles of a global tensor; this copy reads and writes no global tensor",
                         s.loc)
        if s.tile is not None:
            for d in s.tile:
                self.check_expr(d, s.loc, f"the tile shape of '{s.name}'")
        if s.coord and s.tile is None:
            self.err(f"a coordinate needs a tile shape: write 'Copy {s.name} (rows, cols) in coordinate […]'", s.loc)
        operands: tuple[Value, ...] = (source.value,)
        dtype = source.value.type.dtype
        if dst == "global":
            target = self.lookup(s.name, "global")
            if target is None:
                self.err(f"'{s.name}' is stored to global memory but never allocated there; add "
                         f"'Allocate {s.name} in global (…)'", s.name_loc)
                return
            operands = (source.value, target.value)
            dtype = target.value.type.dtype
            self.check_store_mode(s, target.value, src)
            self.check_offset_in_scope(s, target.value)
        elif src == "global" or dst == "shared":
            dtype = source.value.type.dtype
        ty = TileType(dst, tuple(s.tile) if s.tile is not None else None, dtype)
        v = self.fresh(s.name, ty)
        if s.add and dst != "global":
            self.err(f"'and add' adds a tile into a global tensor; this copy writes {dst} memory (write "
                     f"'Copy {s.name} (…) in coordinate […] from register to global and add')", s.loc)
            return
        self.emit(CopyOp((v,), operands, src_space=src, dst_space=dst, tile=s.tile, coord=s.coord,
                         from_end="L" in s.from_end, add=s.add and dst == "global", loc=s.loc))
        self.define(s.name, dst, v, s.name_loc)

    def operand(self, name: str, loc: Loc, what: str) -> Value | None:
        d = self.lookup(name)
        if d is None:
            self.err(f"undefined tile '{name}' used as {what}{self.suggest(name, self.known_tile_names())}; "
                     "define it first (Allocate, Copy or Compute … and get)", loc)
            return None
        if d.empty:
            self.report_empty(name, d, loc)
        return d.value

    def report_empty(self, name: str, d: _Def, loc: Loc) -> None:
        """A shared buffer read before any Copy fills it holds nothing (the interpreter rejects it).
        Reported once; lowering goes on with the buffer so later lines are still checked."""
        d.empty = False
        self.err(f"'{name}' is read from shared memory before anything is copied into it; add "
                 f"'Copy {name} (rows, cols) in coordinate […] from global to shared' before this line",
                 loc, Note(f"'{name}' is allocated in shared memory here, empty", d.loc))

    def gemm_operand(self, op: A.Operand, role: str) -> Value | None:
        v = self.operand(op.name, op.loc, f"the {role} operand of a GEMM")
        if v is not None and v.type.space == "global":
            self.err(f"GEMM operand '{op.name}' is in global memory; copy it to shared first "
                     f"('Copy {op.name} (…) in coordinate […] from global to shared')", op.loc)
            return None
        return v

    def stmt_GemmStmt(self, s: A.GemmStmt) -> None:
        if not self.check_ident(s.out, s.out_loc):
            return
        a = self.gemm_operand(s.a, "A")
        b = self.gemm_operand(s.b, "B")
        operands: list[Value] = []
        if s.accumulate:
            acc = self.lookup(s.out, "register")  # an accumulator is a register tile
            if acc is None:
                self.err(f"'accumulate {s.out}' needs an existing accumulator; add 'Allocate {s.out} in register "
                         "(rows, cols)' before it (registers start at zero)", s.out_loc)
                return
            operands_acc = acc.value
        if a is None or b is None:
            return
        operands = [a, b] + ([operands_acc] if s.accumulate else [])
        v = self.fresh(s.out, TileType("register", None, "fp32"))
        self.emit(GemmOp((v,), tuple(operands), trans_a=s.a.transposed, trans_b=s.b.transposed,
                         accumulate=s.accumulate, loc=s.loc))
        self.define(s.out, "register", v, s.out_loc)

    def result_name(self, out: str | None, new: bool, default: str, loc: Loc) -> str | None:
        name = out or default
        if not self.check_ident(name, loc):
            return None
        if new and self.lookup(name) is None:
            self.err(f"'get new {name}' replaces '{name}', which is not defined; write 'get {name}'", loc)
            return None
        return name

    def stmt_ComputeStmt(self, s: A.ComputeStmt) -> None:
        spec = ELEMENTWISE.get(s.op.lower())
        if spec is None:  # `Compute Sofmax S and get P` parses as an elementwise op
            self.err(unknown_operation(s.op) or f"'{s.op}' is not an elementwise operation; see its own form "
                     "in LANGUAGE.md §5", s.op_loc)
            return
        fn, arity = spec
        if len(s.args) != arity:
            self.err(f"'{s.op}' takes {arity} argument{'s' if arity > 1 else ''}, got {len(s.args)}", s.loc)
            return
        operands: list[Value] = []
        for arg in s.args:
            v = self.arg(arg)
            if v is None:
                return
            operands.append(v)
        if all(v.type.space == "scalar" for v in operands):
            self.err(f"'{s.op}' needs at least one tile argument", s.loc)
            return
        name = self.result_name(s.out, s.new, s.out, s.loc)
        if name is None:
            return
        tile = next(v for v in operands if v.type.space != "scalar")
        v = self.fresh(name, TileType("register", None, tile.type.dtype))
        self.emit(ElementwiseOp((v,), tuple(operands), fn=fn, loc=s.loc))
        self.define(name, "register", v, s.loc)

    def arg(self, arg: A.Arg) -> Value | None:
        e = arg.expr
        if isinstance(e, A.Name) and e.name not in self.scalar_names():
            v = self.operand(e.name, arg.loc, "an argument")
            if v is not None and v.type.space == "global":
                from tlc.passes.verify import LOWERED_OPERANDS

                self.err(f"'{e.name}' is in global memory: as TL it needs a copy to shared or registers first, "
                         f"but {LOWERED_OPERANDS}", arg.loc)
                return None
            return v
        self.check_expr(e, arg.loc, "a Compute argument")
        v = self.fresh(e.name if isinstance(e, A.Name) else "c", SCALAR)
        self.emit(ScalarOp((v,), (), expr=e, loc=arg.loc))
        return v

    def stmt_SoftmaxStmt(self, s: A.SoftmaxStmt) -> None:
        x = self.operand(s.x, s.x_loc, "the Softmax input")
        name = self.result_name(s.out, s.new, s.x, s.loc)
        if x is None or name is None:
            return
        mname, lname = s.max_name or f"{s.x}_max", s.sum_name or f"{s.x}_sum"
        for n in (mname, lname):
            if not self.check_ident(n, s.loc):
                return
        p = self.fresh(name, TileType("register", None, "fp32"))
        m = self.fresh(mname, TileType("register", None, "fp32"))
        l = self.fresh(lname, TileType("register", None, "fp32"))
        op = self.emit(SoftmaxOp((p, m, l), (x,), normalized=True, loc=s.loc))
        assert isinstance(op, SoftmaxOp)
        self.softmaxes.append((self.regions[-1], op, s.sum_name))
        self.define(name, "register", p, s.loc)
        for n, v in ((mname, m), (lname, l)):
            self.define(n, "register", v, s.loc)
            self.scopes[-1].exports[n] = _Def(v, s.loc)

    def stmt_MaskStmt(self, s: A.MaskStmt) -> None:
        lower_mask(self, s)

    def stmt_ReshapeStmt(self, s: A.ReshapeStmt) -> None:
        ok = True
        for modes in (s.src_modes, s.dst_modes):
            if modes[0] not in MMA_ROLE:
                self.err(f"a Reshape layout starts with MMA_A, MMA_B or MMA_C, not '{modes[0]}'", s.loc)
                ok = False
        x = self.operand(s.x, s.x_loc, "the Reshape input")
        if x is None or not ok:
            return
        dtype = self.dtype(s.dtype, s.loc) if s.dtype else self.program_dtype()
        v = self.fresh(s.x, TileType("register", None, dtype, MMA_ROLE[s.dst_modes[0]]))
        self.emit(ReshapeOp((v,), (x,), src_modes=s.src_modes, dst_modes=s.dst_modes, dtype=dtype, loc=s.loc))
        self.define(s.x, "register", v, s.x_loc)

    # ------------------------------------------------------------ loops
    def stmt_ForStmt(self, s: A.ForStmt) -> None:
        if not self.check_ident(s.var, s.loc):
            return
        if s.var in self.scalar_names() or s.var in MASK_POSITIONS:
            self.err(f"loop variable '{s.var}' shadows a parameter, input or enclosing loop variable", s.loc)
            return
        self.check_expr(s.start, s.loc, "the loop start", loads_ok=True)
        self.check_expr(s.stop, s.loc, "the loop bound", loads_ok=True)
        for what, e in (("start", s.start), ("bound", s.stop)):
            bad = self.float_part(e)
            if bad is not None:
                self.err(f"the loop {what} '{e}' reads '{bad}', which is not an integer: a loop counts whole tiles; "
                         "convert it with a Param or an int Input", s.loc)
        self.check_trips(s)
        assigned = assigned_names(s.body)
        carried: list[tuple[str, str, _Def]] = []
        for name, spaces in assigned.items():
            for space in sorted(spaces):
                d = self.lookup(name, space)
                if d is not None:
                    carried.append((name, space, d))
        iv = Value(s.var, TileType("scalar", (), "int"), s.var)
        body = Graph(self.graph.file, parent=self.regions[-1])
        scope = _Scope()
        args = [iv]
        for name, space, d in carried:
            arg = self.fresh(name, d.value.type)
            args.append(arg)
            scope.defs.setdefault(name, {})[space] = _Def(arg, d.loc, d.empty)  # empty on the first trip
        for name in {n for n, _, _ in carried}:
            outer = self.lookup(name)
            if outer is not None:
                scope.newest[name] = outer.value.type.space if outer.value.type.space in SPACES else "register"
        self.scopes.append(scope)
        self.regions.append(body)
        self.loop_vars.append(s.var)
        try:
            self.block(s.body)
        finally:
            self.loop_vars.pop()
            self.regions.pop()
            self.scopes.pop()
        yields = [scope.defs[name][space].value for name, space, _ in carried]
        results = [self.fresh(name, y.type) for (name, _, _), y in zip(carried, yields)]
        exports = list(scope.exports.items())
        ex_results = [self.fresh(n, d.value.type) for n, d in exports]
        loop = LoopOp(tuple(results + ex_results), tuple(d.value for _, _, d in carried), var=s.var,
                      start=s.start, stop=s.stop, body=body, args=tuple(args),
                      yields=tuple(yields + [d.value for _, d in exports]), loc=s.loc)
        self.emit(loop)
        newest = {}
        for (name, space, _), r in zip(carried, results):
            self.define(name, space, r, s.loc)
            newest[name] = scope.newest.get(name, space)
        for name, want in newest.items():
            if want in self.scopes[-1].defs.get(name, {}):
                self.scopes[-1].newest[name] = want
        for (n, _), r in zip(exports, ex_results):
            self.define(n, "register", r, s.loc)
            self.scopes[-1].exports[n] = _Def(r, s.loc)
        if len(self.scopes) == 1:
            self.scopes[0].exports.clear()

    def check_trips(self, s: A.ForStmt) -> None:
        """A loop whose bounds are known now must run at least once (as the interpreter requires)."""
        start, stop = self.constant(s.start), self.constant(s.stop)
        if start is None or stop is None:
            return
        if math.ceil(stop) - int(start) <= 0:  # the interpreter's rule: a bound's division rounds up

            def shown(e: A.Expr, v: int | float) -> str:
                return str(e) if isinstance(e, A.Num) else f"{e} = {v}"

            self.err(f"loop '{s.var}' never runs: its bound ({shown(s.stop, stop)}) is not above its start "
                     f"({shown(s.start, start)}); it runs {s.var} = start … bound − 1, so make the bound "
                     "larger than the start, or remove the loop", s.loc)

    # ------------------------------------------------------------ softmax normalisation
    def finish_softmax(self) -> None:
        """A softmax whose named sum divides something after its loop is unnormalised."""
        divisors = {op.operands[1].base for _, op in self.graph.walk()
                    if isinstance(op, ElementwiseOp) and op.fn == "div" and len(op.operands) == 2}
        for region, op, sum_name in self.softmaxes:
            if sum_name is not None and sum_name in divisors:
                region.replace(op, replace(op, normalized=False))


KERNEL_RESERVED = ("p", "tidx", "smem_")   # names the kernel's code takes for itself (tlc.lowering.tile_ops)


def _loop_vars(stmts) -> set[str]:
    out: set[str] = set()
    for s in stmts:
        if isinstance(s, A.ForStmt):
            out |= {s.var} | _loop_vars(s.body)
    return out


def lower_program(program: A.Program, defines: dict[str, str] | None = None, sketch: bool = False) -> Graph:
    sink = DiagnosticSink()
    graph = Lowerer(program, defines, sketch, sink).run()
    sink.raise_if_errors()
    return graph
