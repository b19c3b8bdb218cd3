"""CPU reference interpreter of the TL graph, following specs/LANGUAGE.md literally.

Tiles are float64 torch tensors carrying the global row/column index of every element,
a validity mask and which rows and columns exist: elements past a tensor's end are
*absent* (no score, no contribution to a sum), which is what the language means and what
the `mask` pass must reproduce explicitly. A row exists when the tensor row it comes from
does, whether or not any of its elements does: a query row whose keys in one trip are all
past the end gets no scores from that trip, and the trip adds nothing to its output row. A Softmax inside a loop is normalised over the loop's whole
domain (a first sweep gathers the statistics), so every pass that turns it into the
online form is checked against this meaning, not against itself.
"""
from __future__ import annotations

import itertools

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping

import torch

from tlc.expr import ExprError, eval_expr, free_names
from tlc.expr.evaluate_tensor import evaluate_tensor
from tlc.ir.graph import Graph
from tlc.ir.heads import split_form
from tlc.ir.row_maps import gather_rows, rows_read
from tlc.ir.tensor_inputs import batch_of, launch_sizes, stored_rows, tensor_shape
from tlc.ir.ops import (AllocateOp, CopyOp, ElementwiseOp, FullOp, GemmOp, LoopOp, MaskOp, Op, ReshapeOp,
                        RowReduceOp, ScalarOp, ScaledExpOp, SoftmaxOp)

NEG_INF = float("-inf")


class InterpError(Exception):
    """The program did something the language forbids at run time (shape clash, layout)."""

    def __init__(self, message: str, op: Op | None = None):
        where = f"{op.loc}: " if op is not None and op.loc.line > 0 else ""
        super().__init__(f"{where}{message}")
        self.op = op


@dataclass
class Tile:
    data: torch.Tensor            # float64, 1-D (row vector) or 2-D
    valid: torch.Tensor           # bool, same shape
    rows: torch.Tensor | None = None  # global row index per row
    cols: torch.Tensor | None = None  # global column index per column
    role: str = "none"
    row_ok: torch.Tensor | None = None  # bool per row: the row exists (None: where any element is valid)
    col_ok: torch.Tensor | None = None  # bool per column of a 2-D tile, the same

    def t(self) -> "Tile":
        return Tile(self.data.T, self.valid.T, self.cols, self.rows, self.role, self.col_ok, self.row_ok)


@dataclass
class GlobalRef:
    name: str
    slice: torch.Tensor | None  # (rows, cols) view into the output or input tensor
    deferred: Any = None        # the Allocate whose head offset reads a loop's variable: resolved at each copy
    # a tensor read through a row map: (the head's storage (rows, cols), the storage row of each row of `slice`,
    # a copy): a store writes both (tlc/ir/row_maps.py)
    scatter: Any = None


def _row_ok(t: Tile) -> torch.Tensor:
    """Which rows of `t` exist (a row vector's elements are its rows)."""
    if t.row_ok is not None:
        return t.row_ok
    return t.valid.any(dim=-1) if t.valid.dim() == 2 else t.valid


def _col_ok(t: Tile) -> torch.Tensor:
    """Which columns of a 2-D tile exist."""
    return t.col_ok if t.col_ok is not None else t.valid.any(dim=0)


class Interpreter:
    def __init__(self, graph: Graph, tensors: Mapping[str, torch.Tensor], scalars: Mapping[str, Any],
                 *, check_layouts: bool = False):
        self.graph = graph
        self.tensors = tensors
        self.check_layouts = check_layouts
        self.base_env: dict[str, Any] = {k: v for k, v in graph.params.items() if isinstance(v, (int, float))}
        self.base_env.update(scalars)

    # ------------------------------------------------------------ driver
    def run(self) -> None:
        laid_out = [t for name, t in self.tensors.items() if name not in self.graph.tensor_inputs]
        # the query heads: the tensors at `head_idx`; the KV heads: those at a `group` offset (a tensor at another
        # head, `head_idx * Splits + split_idx`, says neither)
        offsets = {op.name: ("head_idx" if op.offset is None else str(op.offset))
                   for _, op in self.graph.walk() if isinstance(op, AllocateOp) and op.space == "global"}
        plain = {op.name for _, op in self.graph.walk() if isinstance(op, AllocateOp) and op.space == "global"
                 and (op.offset is None or free_names(op.offset) <= {"head_idx", "group"})}
        gathered = {op.name for _, op in self.graph.walk() if isinstance(op, AllocateOp) and op.rows_at is not None}
        by_query = [t.shape[1] for n, t in self.tensors.items() if offsets.get(n) == "head_idx"]
        by_group = [t.shape[1] for n, t in self.tensors.items() if "group" in offsets.get(n, "")]
        heads = [t.shape[1] for n, t in self.tensors.items() if n in plain] or [t.shape[1] for t in laid_out]
        # a gathered tensor's storage is the batch's together (batch extent 1): the batch is the others'
        batch = next((t.shape[0] for n, t in self.tensors.items() if n not in self.graph.tensor_inputs
                      and n not in gathered), None)
        if batch is None:   # every tensor read through a row map: the batch the tensor Inputs are sized by
            given = {n: self.tensors.get(n, self.base_env.get(n)) for n in self.graph.tensor_inputs}
            batch = batch_of({n: t.dims for n, t in self.graph.tensor_inputs.items()}, given, self.base_env)
            batch = laid_out[0].shape[0] if batch is None else batch
        by_split = [t.shape[1] // int(self.eval(form[0], self.base_env, None))
                    for _, op in self.graph.walk() if isinstance(op, AllocateOp) and op.space == "global"
                    and op.offset is not None and op.name in self.tensors
                    and not isinstance(form := split_form(self.graph, op.offset), str)
                    for t in (self.tensors[op.name],)]
        # the query heads: a tensor at head_idx's, else one at `head_idx * N + v`'s / N (as the launch takes them)
        num_heads = max(by_query) if by_query else by_split[0] if by_split else max(heads)
        num_kv = min(by_group) if by_group else min(heads)
        if num_kv == 0 or num_heads % num_kv:
            raise InterpError(f"{num_heads} query heads are not a multiple of {num_kv} KV heads")
        env = dict(self.base_env, group=num_heads // num_kv, num_heads=num_heads)
        env.update(self.tensor_inputs(dict(env, **launch_sizes(batch, num_heads, num_kv))))
        blocks = self.grid_blocks(env)
        axes = [(name, int(self.eval(extent, env, None))) for name, extent in self.graph.axes.items()]
        for b in range(batch):
            for h in range(num_heads):
                for blk in range(blocks):
                    for point in itertools.product(*(range(n) for _, n in axes)):
                        self.region(self.graph, {}, dict(env, batch_idx=b, head_idx=h, block_idx=blk,
                                                         **dict(zip((a for a, _ in axes), point))))

    def tensor_inputs(self, env: dict[str, Any]) -> dict[str, torch.Tensor]:
        """The program's tensor Inputs, each checked against its declared element type and dimensions."""
        out = {}
        for name, t in self.graph.tensor_inputs.items():
            given = self.tensors.get(name, self.base_env.get(name))   # with the tensors, or the scalar Inputs
            if given is None:
                raise InterpError(f"tensor Input '{name}' ({t.text()}) was not given")
            try:
                want = tensor_shape(t.dims, env)
            except ExprError as exc:
                raise InterpError(f"cannot size tensor Input '{name}' ({t.text()}): {exc}") from None
            if tuple(given.shape) != want:
                raise InterpError(f"tensor Input '{name}' is {t.text()} = {list(want)}, but the tensor given has shape "
                                  f"{list(given.shape)}")
            if given.is_floating_point() != (t.kind == "float"):
                raise InterpError(f"tensor Input '{name}' holds {t.dtype}, but the tensor given holds {given.dtype}")
            out[name] = given
        return out

    def grid_blocks(self, env: dict[str, Any]) -> int:
        """block_idx covers the tiles of every tensor copied at [L = block_idx]."""
        n = 1
        for _, op in self.graph.walk():
            if isinstance(op, CopyOp) and op.tile and any(k == "L" and str(e) == "block_idx" for k, e in op.coord):
                g = op.operands[-1] if op.dst_space == "global" else op.operands[0]
                alloc = next(a for _, a in self.graph.walk() if isinstance(a, AllocateOp) and a.name == g.base
                             and a.space == "global")
                rows = (self.tensors[g.base].shape[2] if alloc.rows_at is None   # a gathered tensor: its own rows
                        else int(self.eval(stored_rows(alloc.shape[0]), env, op)))
                n = max(n, -(-rows // int(self.eval(op.tile[0], env, op))))
        return n

    def eval(self, e, env, op: Op | None, *, ceil: bool = False):
        try:
            return eval_expr(e, env, ceil_div=ceil)
        except ExprError as exc:
            raise InterpError(str(exc), op) from None

    def region(self, g: Graph, vals: dict[Any, Any], env: dict[str, Any]) -> None:
        for op in g.ops():
            self.execute(op, vals, env)

    def get(self, vals: dict[int, Any], v) -> Any:
        if v.uid not in vals:
            raise InterpError(f"{v} has no value (read before it is defined)")
        return vals[v.uid]

    # ------------------------------------------------------------ ops
    def execute(self, op: Op, vals: dict[int, Any], env: dict[str, Any]) -> None:
        handler = getattr(self, "op_" + type(op).__name__, None)
        if handler is None:
            raise InterpError(f"the interpreter has no meaning for '{op.mnemonic}'", op)
        out = handler(op, [self.get(vals, v) for v in op.operands], vals, env)
        if out is not None:
            outs = out if isinstance(out, tuple) else (out,)
            for r, o in zip(op.results, outs):
                vals[r.uid] = o

    def op_AllocateOp(self, op: AllocateOp, args, vals, env):
        if op.space == "global":
            if op.name not in self.tensors:
                raise InterpError(f"no tensor named '{op.name}' was given", op)
            if op.offset is not None and free_names(op.offset) - set(env):   # a loop's variable: at each copy
                return GlobalRef(op.name, None, deferred=op)
            t = self.tensors[op.name]
            h = int(self.eval(op.offset, env, op)) if op.offset is not None else int(env["head_idx"])
            if not 0 <= h < t.shape[1]:
                raise InterpError(f"offset {op.offset} selects head {h} of '{op.name}', which has {t.shape[1]}", op)
            if op.rows_at is not None:
                if t.shape[0] != 1:
                    raise InterpError(f"'{op.name}' is read through a row map: its storage, which the batch shares, is "
                                      f"(1, heads, rows, cols), not {tuple(t.shape)}", op)
                view, at = self.gathered(op, t[0, h], env)
                return GlobalRef(op.name, view, scatter=(t[0, h], at))
            view = t[int(env["batch_idx"]), h]
            seen = None
            for axis, d in enumerate(op.shape):
                held = stored_rows(d) if axis == 0 else d
                if isinstance(held, str):
                    raise InterpError(held, op)
                want = self.eval(held, env, op)
                if want != view.shape[axis]:
                    raise InterpError(f"'{op.name}' dimension {axis} is {view.shape[axis]}, but the program "
                                      f"declares {held} = {want}", op)
                if held is not d:   # min(E, R): the program sees the first E of the R rows; the rest are absent
                    seen = max(0, int(self.eval(d, env, op)))
            return GlobalRef(op.name, view if seen is None else view[:seen])
        if op.space == "shared":
            return None
        shape = tuple(int(self.eval(d, env, op)) for d in op.shape)
        z = torch.zeros(shape, dtype=torch.float64)
        return Tile(z, torch.ones(shape, dtype=torch.bool))

    def gathered(self, op: AllocateOp, storage: torch.Tensor, env) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows a row map gathers from one head's storage (tlc/ir/row_maps.py), seen to the program's extent,
        and the storage row of each."""
        held = stored_rows(op.shape[0])
        if isinstance(held, str):
            raise InterpError(held, op)
        cols = int(self.eval(op.shape[1], env, op))
        if storage.shape[-1] != cols:
            raise InterpError(f"'{op.name}' dimension 1 is {storage.shape[-1]}, but the program declares "
                              f"{op.shape[1]} = {cols}", op)
        rows = int(self.eval(held, env, op))
        seen = max(0, min(rows, int(self.eval(op.shape[0], env, op))))
        try:
            at = rows_read(op.rows_at, rows, env)
        except (ExprError, ValueError) as exc:
            raise InterpError(str(exc), op) from None
        return gather_rows(storage, at[:seen]), at[:seen]

    def op_CopyOp(self, op: CopyOp, args, vals, env):
        src = args[0]
        if op.src_space == "global":
            return self.load(op, self.resolved(src, env), env)
        if op.dst_space == "global":
            return self.store(op, src, self.resolved(args[1], env), env)
        if src is None:
            raise InterpError("copy reads a shared buffer that holds no tile", op)
        return src

    def resolved(self, ref, env) -> "GlobalRef":
        """A global tensor at the head its offset selects here (an offset reading a loop's variable, at this copy)."""
        if isinstance(ref, GlobalRef) and ref.deferred is not None:
            return self.op_AllocateOp(ref.deferred, [], {}, env)
        return ref

    def _index(self, op: CopyOp, env, extent: tuple[int, int]):
        tile = [int(self.eval(d, env, op)) for d in op.tile] if op.tile else list(extent)
        coord = {k: int(self.eval(e, env, op)) for k, e in op.coord}
        first = coord.get("L", 0) * tile[0]
        if op.from_end:
            first = extent[0] - (coord.get("L", 0) + 1) * tile[0]
        rows = first + torch.arange(tile[0])
        cols = coord.get("C", 0) * tile[1] + torch.arange(tile[1])
        return rows, cols

    def load(self, op: CopyOp, ref: GlobalRef, env) -> Tile:
        t = ref.slice
        if t.dim() == 1:
            return self.load_rows(op, ref, env)
        rows, cols = self._index(op, env, tuple(t.shape))
        r_ok, c_ok = (rows >= 0) & (rows < t.shape[0]), cols < t.shape[1]
        inside = r_ok[:, None] & c_ok[None, :]
        data = torch.full((len(rows), len(cols)), float("nan"), dtype=torch.float64)
        data[r_ok.nonzero()[:, 0][:, None], c_ok.nonzero()[:, 0][None, :]] = t[rows[r_ok]][:, cols[c_ok]].to(torch.float64)
        if op.oob == "zero":
            return Tile(torch.where(inside, data, torch.zeros_like(data)), torch.ones_like(inside), rows, cols)
        return Tile(data, inside, rows, cols, row_ok=r_ok, col_ok=c_ok)

    def load_rows(self, op: CopyOp, ref: GlobalRef, env) -> Tile:
        """A tile of a global vector, a row vector: rows past the vector's end (or before its start) absent."""
        t = ref.slice
        height = int(self.eval(op.tile[0], env, op)) if op.tile else t.shape[0]
        at = int(self.eval(dict(op.coord).get("L", 0), env, op)) if op.coord else 0
        first = t.shape[0] - (at + 1) * height if op.from_end else at * height
        rows = first + torch.arange(height)
        inside = (rows >= 0) & (rows < t.shape[0])
        data = torch.full((height,), float("nan"), dtype=torch.float64)
        data[inside] = t[rows[inside]].to(torch.float64)
        if op.oob == "zero":
            return Tile(torch.where(inside, data, torch.zeros_like(data)), torch.ones_like(inside), rows)
        return Tile(data, inside, rows)

    def store(self, op: CopyOp, tile: Tile, ref: GlobalRef, env) -> GlobalRef:
        t = ref.slice
        if t.dim() == 1:
            return self.store_rows(op, tile, ref, env)
        rows, cols = self._index(op, env, tuple(t.shape))
        if tile.data.shape != (len(rows), len(cols)):
            raise InterpError(f"stores a {tuple(tile.data.shape)} tile into a {(len(rows), len(cols))} window", op)
        keep = ((rows >= 0) & (rows < t.shape[0]))[:, None] & (cols < t.shape[1])[None, :] & tile.valid
        for i in range(len(rows)):
            if not 0 <= rows[i] < t.shape[0]:
                continue
            sel = keep[i]
            if op.add:   # a reduce-store: the tile's elements are added in (the target starts at zero)
                t[rows[i], cols[sel]] += tile.data[i, sel].to(t.dtype)
            else:
                t[rows[i], cols[sel]] = tile.data[i, sel].to(t.dtype)
            if ref.scatter is not None:   # through a row map: into the storage row (none outside the storage)
                storage, at = ref.scatter
                if 0 <= int(at[rows[i]]) < storage.shape[0]:
                    storage[int(at[rows[i]]), cols[sel]] = t[rows[i], cols[sel]]
        return ref

    def store_rows(self, op: CopyOp, tile: Tile, ref: GlobalRef, env) -> GlobalRef:
        """A row vector into a global vector (rows only): each present row at its position, those past the
        vector's end (or absent) not written."""
        t = ref.slice
        if tile.data.dim() != 1:
            raise InterpError(f"stores a {tuple(tile.data.shape)} tile into a global vector; store a row vector", op)
        height = int(self.eval(op.tile[0], env, op)) if op.tile else t.shape[0]
        first = int(self.eval(dict(op.coord).get("L", 0), env, op)) * height if op.coord else 0
        if op.from_end:
            first = t.shape[0] - (int(self.eval(dict(op.coord).get("L", 0), env, op)) + 1) * height
        if tile.data.shape[0] != height:
            raise InterpError(f"stores a row vector of {tile.data.shape[0]} rows into a {height}-row window", op)
        valid = tile.valid if tile.valid.dim() == 1 else tile.valid.all(dim=-1)
        for i in range(height):
            row = first + i
            if 0 <= row < t.shape[0] and bool(valid[i]):
                t[row] = tile.data[i].to(t.dtype)
        return ref

    def op_ScalarOp(self, op: ScalarOp, args, vals, env):
        return self.eval(op.expr, env, op)

    def op_GemmOp(self, op: GemmOp, args, vals, env):
        a, b = args[0], args[1]
        if not isinstance(a, Tile) or not isinstance(b, Tile):
            raise InterpError("GEMM operands must be tiles", op)
        if self.check_layouts:
            self._check_roles(op, a, b)
        a = a.t() if op.trans_a else a
        b = b.t() if op.trans_b else b
        if a.data.dim() != 2 or b.data.dim() != 2 or a.data.shape[1] != b.data.shape[0]:
            raise InterpError(f"GEMM inner dimensions differ: {tuple(a.data.shape)} · {tuple(b.data.shape)}", op)
        ad = torch.where(a.valid, a.data, torch.zeros_like(a.data))
        bd = torch.where(b.valid, b.data, torch.zeros_like(b.data))
        prod = ad @ bd  # absent terms contribute nothing; a sum of none is 0
        rows_ok, cols_ok = _row_ok(a), _col_ok(b)
        out = Tile(prod, rows_ok[:, None] & cols_ok[None, :], a.rows, b.cols, "acc", rows_ok, cols_ok)
        if op.accumulate:
            acc = args[2]
            if acc.data.shape != prod.shape:
                raise InterpError(f"accumulates a {tuple(prod.shape)} product into a {tuple(acc.data.shape)} tile", op)
            out = Tile(acc.data + prod, acc.valid & out.valid, a.rows if a.rows is not None else acc.rows,
                       b.cols if b.cols is not None else acc.cols, "acc", _row_ok(acc) & rows_ok,
                       _col_ok(acc) & cols_ok)
        return out

    def _check_roles(self, op: GemmOp, a: Tile, b: Tile) -> None:
        if a.role == "acc":
            raise InterpError("layout: an accumulator reaches the A operand of a GEMM without a Reshape "
                              "to MMA_A", op)
        if a.role == "B":
            raise InterpError("layout: the A operand of a GEMM is in the MMA_B layout", op)
        if b.role in ("acc", "A"):
            raise InterpError(f"layout: the B operand of a GEMM is in the {b.role} layout", op)

    def op_ElementwiseOp(self, op: ElementwiseOp, args, vals, env):
        tiles = [a for a in args if isinstance(a, Tile)]
        ref = max(tiles, key=lambda t: t.data.dim())
        datas, valids = [], []
        for a in args:
            if isinstance(a, Tile):
                d, v = a.data, a.valid
                if d.dim() == 1 and ref.data.dim() == 2:
                    d, v = d[:, None], v[:, None]
                datas.append(d)
                valids.append(v)
            else:
                datas.append(torch.tensor(float(a), dtype=torch.float64))
        try:
            data = _apply(op.fn, datas)
            valid = valids[0]
            for v in valids[1:]:
                valid = valid & v
            valid = valid.expand(data.shape)
            rows_ok = _row_ok(tiles[0])
            for t in tiles[1:]:
                rows_ok = rows_ok & _row_ok(t)
        except RuntimeError as exc:
            raise InterpError(f"'{op.fn}' on tiles of different shapes: {exc}", op) from None
        cols_ok = None
        if ref.data.dim() == 2:
            cols_ok = _col_ok(ref)
            for t in tiles:
                if t is not ref and t.data.dim() == 2:
                    cols_ok = cols_ok & _col_ok(t)
        return Tile(data, valid, ref.rows, ref.cols if ref.data.dim() == 2 else None, ref.role, rows_ok, cols_ok)

    def op_MaskOp(self, op: MaskOp, args, vals, env):
        x: Tile = args[0]
        trips = op.trips()
        if trips is not None and not self.eval(trips, env, op):
            return x  # a tile the mask pass proved has nothing to mask
        if x.cols is None or (op.kind != "bounds" and x.rows is None):
            raise InterpError("mask needs a tile whose rows and columns come from sequence positions", op)
        if op.kind == "causal":
            shift = 0 if op.alignment == "top_left" else int(env["seqlen_k"]) - int(env["seqlen_q"])
            masked = x.cols[None, :] > x.rows[:, None] + shift
        elif op.kind == "predicate":
            masked = self.predicate(op, x, env)
        else:
            masked = (x.cols >= int(self.eval(op.limit, env, op)))[None, :].expand(x.data.shape)
        return replace(x, data=torch.where(masked, torch.full_like(x.data, NEG_INF), x.data))

    def predicate(self, op: MaskOp, x: Tile, env) -> torch.Tensor:
        """Where a predicate mask's condition holds, per element: q_idx is each row's global query row,
        kv_idx each column's global key column (an absent element's too; it stays absent)."""
        assert op.predicate is not None and x.rows is not None and x.cols is not None
        try:
            masked = evaluate_tensor(op.predicate, dict(env, q_idx=x.rows[:, None], kv_idx=x.cols[None, :]))
        except ExprError as exc:
            raise InterpError(str(exc), op) from None
        if masked.dtype != torch.bool:
            raise InterpError(f"the mask predicate '{op.predicate}' is a number, not a condition", op)
        return masked.expand(x.data.shape)

    def op_ReshapeOp(self, op: ReshapeOp, args, vals, env):
        x: Tile = args[0]
        role = {"MMA_A": "A", "MMA_B": "B", "MMA_C": "acc"}[op.dst_modes[0]]
        return replace(x, role=role)

    def op_SoftmaxOp(self, op: SoftmaxOp, args, vals, env):
        stats = vals.get(("stats", id(op)))
        x: Tile = args[0]
        if stats is None:
            stats = _softmax_stats([x])
        m, l = stats
        p = _exp_sub(x, m)
        if op.normalized:
            p = replace(p, data=_safe_div(p.data, l.data[:, None]))
        return p, m, l

    def op_FullOp(self, op: FullOp, args, vals, env):
        shape = tuple(int(self.eval(d, env, op)) for d in op.shape)
        return Tile(torch.full(shape, float(op.value), dtype=torch.float64), torch.ones(shape, dtype=torch.bool))

    def op_RowReduceOp(self, op: RowReduceOp, args, vals, env):
        x: Tile = args[0]
        if op.fn == "max":
            data = torch.where(x.valid, x.data, torch.full_like(x.data, NEG_INF)).amax(dim=1)
        else:
            data = torch.where(x.valid, x.data, torch.zeros_like(x.data)).sum(dim=1)
        return Tile(data, _row_ok(x), x.rows, None)  # a row without elements: max −inf, sum 0

    def op_ScaledExpOp(self, op: ScaledExpOp, args, vals, env):
        x, m, s = args
        scale = float(s)
        md = m.data[:, None] if (x.data.dim() == 2 and m.data.dim() == 1) else m.data
        mv = m.valid[:, None] if (x.data.dim() == 2 and m.valid.dim() == 1) else m.valid
        msafe = torch.where(torch.isneginf(md), torch.zeros_like(md), md)
        data = torch.exp2(x.data * scale - msafe * scale)
        rows_ok = _row_ok(x) & _row_ok(m)
        cols_ok = _col_ok(x) if x.data.dim() == 2 else None
        return Tile(data, (x.valid & mv).expand(data.shape), x.rows, x.cols, x.role, rows_ok, cols_ok)

    def op_LoopOp(self, op: LoopOp, args, vals, env):
        start = int(self.eval(op.start, env, op))
        stop = int(math.ceil(self.eval(op.stop, env, op, ceil=True)))
        body = op.body
        assert body is not None
        softmaxes = [o for o in body.ops() if isinstance(o, SoftmaxOp)]
        inner = dict(vals)
        if softmaxes:
            self._domain_stats(op, softmaxes, args, inner, env, start, stop)
        carried = list(args)
        last: list[Any] = list(carried)
        for n in range(start, stop):
            local = dict(inner)
            local[op.args[0].uid] = n
            for a, v in zip(op.args[1:], carried):
                local[a.uid] = v
            self.region(body, local, dict(env, **{op.var: n}))
            last = [self.get(local, y) for y in op.yields]
            carried = last[: len(carried)]
        if stop <= start:  # no trip: each exported statistic is its softmax's over an empty domain
            stats = {r.uid: inner[("stats", id(sm))][i] for sm in softmaxes for i, r in enumerate(sm.results[1:])}
            last += [stats[y.uid] for y in op.yields[len(carried):]]
        return tuple(last)

    def _domain_stats(self, op: LoopOp, softmaxes, args, inner, env, start, stop) -> None:
        """First sweep: the scores every Softmax sees over the whole loop domain."""
        loop_carried = {a.uid for a in op.args[1:]}
        for sm in softmaxes:
            if op.body.depends_on(sm.operands[0], loop_carried):
                raise InterpError("the scores of a Softmax may not depend on loop-carried values", sm)
        seen: dict[int, list[Tile]] = {id(sm): [] for sm in softmaxes}
        targets = {sm.operands[0].uid for sm in softmaxes}
        # A loop with no trip still has rows: its scores' shape comes from one trip at `start` whose scores
        # are all absent, so every row has m = -inf and l = 0 (LANGUAGE.md §7), and O / l is 0.
        empty = stop <= start
        for n in range(start, stop if not empty else start + 1):
            local = dict(inner)
            local[op.args[0].uid] = n
            for a, v in zip(op.args[1:], args):
                local[a.uid] = v
            for o in op.body.ops():
                if all(t in local for t in targets):
                    break
                self.execute(o, local, dict(env, **{op.var: n}))
            for sm in softmaxes:
                x = self.get(local, sm.operands[0])
                seen[id(sm)].append(replace(x, valid=torch.zeros_like(x.valid), row_ok=_row_ok(x), col_ok=_col_ok(x))
                                    if empty else x)
        for sm in softmaxes:
            inner[("stats", id(sm))] = _softmax_stats(seen[id(sm)])


def _softmax_stats(tiles: list[Tile]) -> tuple[Tile, Tile]:
    """Row max and sum over every trip's scores; a row that exists but has no score in the
    whole domain has m = −inf and l = 0."""
    data = torch.cat([torch.where(t.valid, t.data, torch.full_like(t.data, NEG_INF)) for t in tiles], dim=1)
    rows_ok = _row_ok(tiles[0])
    for t in tiles[1:]:
        rows_ok = rows_ok | _row_ok(t)
    m = data.amax(dim=1)
    msafe = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    l = torch.exp(data - msafe[:, None]).sum(dim=1)
    rows = tiles[0].rows
    return Tile(m, rows_ok, rows), Tile(l, rows_ok, rows)


def _exp_sub(x: Tile, m: Tile) -> Tile:
    msafe = torch.where(torch.isneginf(m.data), torch.zeros_like(m.data), m.data)
    return Tile(torch.exp(x.data - msafe[:, None]), x.valid & m.valid[:, None], x.rows, x.cols, x.role,
                _row_ok(x) & _row_ok(m), _col_ok(x))


def _safe_div(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    b = b.expand(a.shape) if b.dim() == a.dim() else b
    zero = b == 0
    return torch.where(zero, torch.zeros_like(a), a / torch.where(zero, torch.ones_like(b), b))


def _apply(fn: str, d: list[torch.Tensor]) -> torch.Tensor:
    if fn == "add":
        return d[0] + d[1]
    if fn == "sub":
        return d[0] - d[1]
    if fn == "mul":
        return d[0] * d[1]
    if fn == "div":
        a, b = torch.broadcast_tensors(d[0], d[1])
        return _safe_div(a, b)
    if fn == "max":
        return torch.maximum(d[0], d[1])
    if fn == "min":
        return torch.minimum(d[0], d[1])
    one = {"exp": torch.exp, "exp2": torch.exp2, "log": torch.log, "tanh": torch.tanh, "relu": torch.relu,
           "neg": torch.neg, "abs": torch.abs, "sqrt": torch.sqrt, "square": torch.square}
    return one[fn](d[0])


def run_program(graph: Graph, tensors: Mapping[str, torch.Tensor], scalars: Mapping[str, Any] | None = None,
                *, check_layouts: bool = False) -> dict[str, torch.Tensor]:
    """Run `graph` on float tensors laid out (batch, heads, rows, cols); returns every
    tensor (stored outputs updated). Outputs must be passed in (poisoned, e.g. NaN)."""
    out = {k: v.clone() for k, v in tensors.items()}
    Interpreter(graph, out, dict(scalars or {}), check_layouts=check_layouts).run()
    return out
