"""The launch ABI a TL program implies: one parameter struct, read off the program.

Every `Allocate X in global (rows, cols) with offset h` becomes a tensor argument (pointer and
batch/head/row strides, SDPA layout (batch, heads, rows, cols)); every `Input` a scalar field;
the grid is (tiles of the rows copied at `[L = block_idx]`, heads, batch). The launcher binds
torch tensors by this description, so the struct and the host agree by construction.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Mapping

from tlc.diagnostics import Loc, fail
from tlc.frontend import ast as A
from tlc.ir.graph import Graph
from tlc.ir.ops import AllocateOp, CopyOp
from tlc.ir.tensor_inputs import stored_rows, tensor_pointer
from tlc.expr import ExprError, evaluate, free_names, parse_expr, substitute
from tlc.ir.heads import last_head, split_form
from tlc.kir.expr import check_ident
from tlc.kir.ops import ParamsOp

DIM_FIELDS = (("batch", "i32"), ("heads", "i32"), ("group", "i32"))


@dataclass(frozen=True)
class TensorArg:
    """One global tensor: `rows` is a runtime Input name or a number, `head` the offset choosing its head as the
    kernel computes it (the kernel IR's expression: `floor_div(head_idx, group)` for TL's `head_idx / group`,
    Params as numbers, Inputs as `p.<name>`); `cols` 0: a row vector (batch, heads, rows)."""

    name: str
    dtype: str
    rows: str
    cols: int
    head: str
    output: bool
    added: bool = False   # stored by `and add` (a reduce-store): the launch zeroes it first
    head_last: str = ""   # the offset at the last value of each grid axis and loop variable it reads (tlc/ir/heads.py)
    # `with rows at E` (tlc/ir/row_maps.py): E's text; the tensor is a (1, heads, storage rows, cols) storage the
    # batch shares, its rows counted in `storage_rows`
    rows_at: str = ""

    @property
    def storage_rows(self) -> str:
        return f"{self.name}_storage_rows"

    @property
    def ptr(self) -> str:
        return f"{self.name}_ptr"

    def stride(self, which: str) -> str:
        return f"{self.name}_{which}_stride"

    def head_count(self, heads: int, group: int, env: dict | None = None) -> int:
        """How many heads the tensor has for a launch of `heads` query heads in groups of `group`: one past the
        head the last query head reads (`head_idx`: heads, `head_idx / group`: heads / group, `0`: 1,
        `head_idx * Splits + split_idx`: heads · Splits). An output's heads; an input's come from its tensor and
        are checked against this. `env`: the launch's Inputs, where the offset reads one."""
        try:
            return int(head_offset(self.head_last or self.head, dict(env or {}, head_idx=max(heads - 1, 0),
                                                                       group=max(group, 1)))) + 1
        except ExprError as exc:
            raise fail(f"cannot evaluate {self.name}'s head offset '{self.head}': {exc}") from None


@lru_cache(maxsize=256)
def _parsed(text: str):
    return parse_expr(text)


def head_offset(text: str, env: Mapping) -> int:
    """A tensor's head offset (`TensorArg.head`, the kernel's expression) at `env`'s values: the launch's Inputs by
    name (as `p.<name>` too, as the kernel reads them), head_idx, group and any grid axis or loop variable."""
    values = dict(env)
    values.update({f"p.{k}": v for k, v in env.items() if "." not in k})
    return evaluate(_parsed(text), values)


@dataclass(frozen=True)
class LaunchABI:
    name: str
    tensors: tuple[TensorArg, ...]
    inputs: tuple[tuple[str, str], ...]     # (Input name, "int" | "float")
    grid_rows: str                          # rows tiled by block_idx: an Input name or a number
    grid_tile: int
    # tensor Inputs (tlc/ir/tensor_inputs.py): (name, element type, dimensions as TL expressions), read by
    # element through a pointer; the launcher checks a tensor's dtype and shape against them
    tensor_inputs: tuple[tuple[str, str, tuple[str, ...]], ...] = ()

    def fields(self) -> tuple[tuple[str, str], ...]:
        out: list[tuple[str, str]] = []
        for t in self.tensors:
            out.append((t.ptr, f"ptr<{'f32' if t.dtype == 'fp32' else t.dtype}>"))
            out += [(t.stride(w), "i64") for w in ("batch", "head", "row")]
            out += [(t.storage_rows, "i32")] if t.rows_at else []
        out += list(DIM_FIELDS)
        out += [(n, "i32" if kind == "int" else "f32") for n, kind in self.inputs]
        out += [(tensor_pointer(n), "ptr<i32>" if dtype == "int32" else "ptr<f32>") for n, dtype, _ in self.tensor_inputs]
        return tuple(out)

    def params_op(self) -> ParamsOp:
        return ParamsOp(name=f"{self.name}_params", fields=self.fields())

    def to_json(self) -> dict:
        # `added` only where set: the records of programs without reduce-stores stay as they were
        out = {"tensors": [{k: v for k, v in asdict(t).items() if k not in ("added", "head_last", "rows_at") or v}
                           for t in self.tensors], "inputs": [list(i) for i in self.inputs],
               "grid_rows": self.grid_rows, "grid_tile": self.grid_tile}
        if self.tensor_inputs:   # absent without any: the records of programs without them stay as they were
            out["tensor_inputs"] = [[n, d, list(dims)] for n, d, dims in self.tensor_inputs]
        return out

    @staticmethod
    def from_json(name: str, data: dict) -> "LaunchABI":
        return LaunchABI(name, tuple(TensorArg(**t) for t in data["tensors"]),
                         tuple((n, k) for n, k in data["inputs"]), data["grid_rows"], int(data["grid_tile"]),
                         tuple((str(n), str(d), tuple(str(x) for x in dims))
                               for n, d, dims in data.get("tensor_inputs", ())))


def _stored(graph: Graph) -> set[str]:
    out = set()
    for _, op in graph.walk():
        if isinstance(op, CopyOp) and op.dst_space == "global" and len(op.operands) == 2:
            out.add(op.operands[1].base)
    return out


def _rows_text(e: A.Expr, graph: Graph, loc: Loc) -> str:
    """The rows the tensor holds (an extent `min(kv_lengths[batch_idx], seqlen_k)` holds seqlen_k)."""
    held = stored_rows(e)
    if isinstance(held, str):
        raise fail(f"tlc build: {held}", loc)
    e = held
    if isinstance(e, A.Name) and graph.inputs.get(e.name) == "int":
        return e.name
    if isinstance(e, A.Num) and isinstance(e.value, int):
        return str(e.value)
    if isinstance(e, A.Name) and isinstance(graph.params.get(e.name), int):
        return str(graph.params[e.name])
    raise fail(f"tlc build: the rows of a global tensor must be an `Input … : int` (a sequence length) or a "
               f"number, not '{e}'", loc)


def query_heads(tensors, heads_of: dict[str, int], env: dict | None = None) -> int:
    """The launch's query heads from its input tensors: those of a tensor at `head_idx`, else those of a tensor at
    `head_idx * N + v` (tlc/ir/heads.py) — its heads / N, which must divide; 1 when no input says."""
    full = [a for a in tensors if a.head == "head_idx"]
    if full:
        return heads_of[full[0].name]
    for a in tensors:
        if a.head_last:
            per = a.head_count(1, 1, env)   # N: the heads one query head's instances reach
            if per <= 0 or heads_of[a.name] % per:
                raise fail(f"{a.name} has {heads_of[a.name]} heads, not a multiple of the {per} its offset {a.head} "
                           "gives each query head")
            return heads_of[a.name] // per
    return 1


def derive_abi(graph: Graph, name: str, int_value) -> LaunchABI:
    """The ABI of `graph` (after the TL passes); `int_value(expr, loc, what)` evaluates Params."""
    stored = _stored(graph)
    numbers = {k: v for k, v in graph.params.items() if isinstance(v, int) and not isinstance(v, bool)}
    added = {op.operands[1].base for _, op in graph.walk() if isinstance(op, CopyOp) and op.add}
    loads = [op for _, op in graph.walk() if isinstance(op, CopyOp) and op.src_space == "global"]
    registers = ({op.operands[0].base for op in loads if op.dst_space == "register"}
                 - {op.operands[0].base for op in loads if op.dst_space != "register"})
    tensors: list[TensorArg] = []
    for op in graph.ops():
        if not (isinstance(op, AllocateOp) and op.space == "global"):
            continue
        check_ident(op.name, "tensor name")
        if len(op.shape) not in (1, 2):
            raise fail(f"tlc build: a global tensor is (rows, cols), or (rows) for a row vector; '{op.name}' has "
                       f"{len(op.shape)} dimensions", op.loc)
        dtype = op.result.type.dtype or str(graph.params.get("dtype", "bf16"))
        in_registers = op.name in registers and op.name not in stored   # read only by register loads
        if len(op.shape) == 1:   # a row vector per (batch, head): fp32 (the log-sum-exp of each row)
            if dtype != "fp32" or not (op.name in stored or in_registers):
                raise fail(f"tlc build: global vector '{op.name}' ({dtype}) must be fp32, stored as a row vector "
                           "(`Allocate LSE in global (seqlen_q) as fp32`) or loaded into registers as one", op.loc)
        elif dtype not in ("bf16", "fp16") and not (dtype == "fp32" and (op.name in stored or in_registers)):
            raise fail(f"tlc build: global tensor '{op.name}' is {dtype}; tlc's kernels read bf16 or fp16 tensors "
                       "through shared memory (fp32 only as an output the program stores, or loaded straight into "
                       "registers in a kernel without GEMMs)", op.loc)
        if op.name in stored and op.name not in added:
            _one_writer_per_head(graph, op)
        cols = 0 if len(op.shape) == 1 else int_value(op.shape[1], op.loc, f"the columns of '{op.name}'")
        head_last = ""
        if op.offset is not None and free_names(op.offset) - {"head_idx", "group"} - set(graph.params) - set(graph.inputs):
            last = last_head(graph, op.offset)
            if isinstance(last, str):
                raise fail(f"tlc build: '{op.name}': {last}", op.loc)
            head_last = kernel_expr(graph, _with_params(last, numbers), op.loc)
        head = kernel_expr(graph, op.offset, op.loc) if op.offset is not None else "head_idx"
        tensors.append(TensorArg(op.name, dtype, _rows_text(op.shape[0], graph, op.loc), cols, head,
                                 op.name in stored, op.name in added, head_last,
                                 "" if op.rows_at is None else str(op.rows_at)))
    per_kv_head = kernel_expr(graph, A.BinOp("/", A.Name("head_idx"), A.Name("group")), None)
    for t in tensors:   # where an added output's heads come from: one per query head, per KV head or one
        if not t.added:
            continue
        alloc = next(op for op in graph.ops() if isinstance(op, AllocateOp) and op.name == t.name)
        if t.head not in ("head_idx", per_kv_head, "0"):
            raise fail(f"tlc build: '{t.name}' is added into at head `{alloc.offset}`; a reduce-store's target takes "
                       "`with offset head_idx` (a head per query head), `head_idx / group` (per KV head) or `0` (one "
                       "head)", alloc.loc)
        if t.head == per_kv_head and not any("group" in x.head for x in tensors if not x.output):
            raise fail(f"tlc build: '{t.name}' is added into at head `head_idx / group`, but no input tensor is read at "
                       "a `group` offset, so the launch cannot tell the group size; read the K/V heads there too, or "
                       "add into `with offset head_idx`", alloc.loc)
    if not any(t.output for t in tensors):
        raise fail("tlc build: the program stores no global tensor (add `Copy O (…) in coordinate [L = block_idx] "
                   "from register to global`)")
    inputs = tuple((n, k) for n, k in graph.inputs.items())
    numbers = {k: v for k, v in graph.params.items() if isinstance(v, int) and not isinstance(v, bool)}
    runtime = tuple((check_ident(n, "tensor Input name"), t.dtype, tuple(str(_with_params(d, numbers)) for d in t.dims))
                    for n, t in graph.tensor_inputs.items())
    names = [f for f, _ in LaunchABI(name, tuple(tensors), inputs, "1", 1, runtime).fields()]
    dup = sorted({f for f in names if names.count(f) > 1})
    if dup:
        raise fail(f"tlc build: the launch struct would have two fields named '{dup[0]}'; rename the tensor or "
                   "Input (names batch, heads and group are reserved)")
    grid_rows, grid_tile = _grid(graph, int_value)
    return LaunchABI(name, tuple(tensors), inputs, grid_rows, grid_tile, runtime)


def _one_writer_per_head(graph: Graph, op: AllocateOp) -> None:
    """A tensor stored (not added into) is written by one program instance per head: at `head_idx` in a kernel
    without grid axes of its own, at `head_idx * N + axis` in a kernel with one (tlc/ir/heads.py)."""
    offset = "head_idx" if op.offset is None else str(op.offset)
    if not graph.axes:
        if offset != "head_idx":
            raise fail(f"tlc build: output '{op.name}' is written at head `{offset}`, so the blocks of several "
                       "query heads would write the same rows at once; an output takes `with offset head_idx` "
                       "(or sums what they write: an fp32 tensor stored `and add`)", op.loc)
        return
    form = split_form(graph, op.offset) if op.offset is not None else "it has no offset"
    if isinstance(form, str) or form[1] not in graph.axes or len(graph.axes) > 1:
        raise fail(f"tlc build: '{op.name}' is stored by every instance of the kernel's grid axes "
                   f"({', '.join(graph.axes)}) at head `{offset}`, so several would write the same rows; in a kernel "
                   "with one grid axis a stored tensor takes `with offset head_idx * N + axis` (N the axis's extent), "
                   "or sums what they write (an fp32 tensor stored `and add`)", op.loc)


def kernel_expr(graph: Graph, e: A.Expr, loc: Loc | None) -> str:
    """A head offset as the kernel computes it (tlc.lowering.exprs: Params as numbers, Inputs as `p.<name>`, TL's
    integer `/` as floor_div): the text the launcher evaluates, so it checks the heads the kernel reads."""
    from tlc.frontend.names import BUILTINS
    from tlc.lowering.exprs import ExprLowering

    lowering = ExprLowering(graph.params, graph.inputs, {n: n for n in graph.inputs})
    for name in free_names(e) - set(graph.params) - set(graph.inputs) - set(BUILTINS):
        lowering.bind(name, name)   # a grid axis or loop variable: the launcher gives its last value
    return str(lowering.lower(e, loc))


def _with_params(e: A.Expr, numbers: dict[str, int]) -> A.Expr:
    """A tensor Input's dimension with the Params' values in: the launcher knows only runtime names."""
    for name, value in numbers.items():
        e = substitute(e, name, A.Num(value))
    return e


def _grid(graph: Graph, int_value) -> tuple[str, int]:
    """block_idx ranges over the tiles of the tensors copied at `[L = block_idx]` (LANGUAGE.md §6)."""
    found: list[tuple[str, int, CopyOp]] = []
    for region, op in graph.walk():
        if not isinstance(op, CopyOp) or "global" not in (op.src_space, op.dst_space) or op.tile is None:
            continue
        coord = dict(op.coord).get("L")
        if isinstance(coord, A.Name) and coord.name == "block_idx":
            tensor = op.operands[0] if op.src_space == "global" else op.operands[1]
            alloc = graph.root().producer(tensor) if graph.root().producer(tensor) else None
            if isinstance(alloc, AllocateOp):
                found.append((_rows_text(alloc.shape[0], graph, alloc.loc),
                              int_value(op.tile[0], op.loc, "the tile rows"), op))
    if not found:
        return "1", 1
    rows, tile, first = found[0]
    for r, t, op in found[1:]:
        if (r, t) != (rows, tile):
            raise fail(f"tlc build: block_idx tiles {rows} by {tile} rows at line {first.loc.line} but {r} by {t} "
                       "here; one grid cannot cover both", op.loc)
    return rows, tile
