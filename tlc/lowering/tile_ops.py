"""`lower-tile-ops`: the TL graph → kernel IR, one rule per TL op (sm_80 family: mma.sync; sm_90a:
wgmma fed by the same cp.async copies, tile_wgmma.py).

Each statement lowers by its own rule, in program order, into the region it sits in:

    Allocate … in global    → a global tensor view (pointer + the program's head offset)
    Allocate … in shared    → a shared buffer           Allocate … in register → a cleared fragment
    Copy global → shared    → cp.async of the tile at the program's coordinate (zero-fill past the end)
    Copy shared → register  → the GEMM operand's ldmatrix source (a hint, LANGUAGE.md §5)
    Copy register → global  → convert, stage in shared memory, 16-byte stores of in-range rows
    GEMM                    → mma.sync over the operands the program names
    elementwise, mask, row reductions, scaled exp2, Reshape, loops → fragment ops, ForOp

Nothing else is generated: no barrier or wait (`insert-sync`), no second stage (`pipeline`),
no swizzle (`infer-layouts`). A construct with no rule is refused at its line.
"""
from __future__ import annotations

import dataclasses

from tlc.arch import ArchInfo
from tlc.diagnostics import Loc, fail
from tlc.frontend import ast as A
from tlc.ir.graph import Graph
from tlc.ir.ops import (AllocateOp, CopyOp, ElementwiseOp, FullOp, LoopOp, MaskOp, Op, ReshapeOp, RowReduceOp, ScalarOp,
                        ScaledExpOp, SoftmaxOp)
from tlc.ir.types import Value
from tlc.kir import ops as K
from tlc.kir import ops_sm90 as H
from tlc.kir.expr import BinOp, Const, E, Expr, Var, substitute
from tlc.lowering.abi import LaunchABI, derive_abi
from tlc.lowering.exprs import BUILTINS, ExprLowering
from tlc.lowering.storage import Buffer, Namer, Slot, last_uses
from tlc.lowering.tile_copies import CopyRules, kblock, padded
from tlc.lowering.tile_gemm import GemmRules
from tlc.lowering.tile_wgmma import WgmmaRules
from tlc.lowering.warps import plan_warps, plan_wgmma
from tlc.passes.tile_origin import origin

LOG2E = 1.4426950408889634
# Ops that give a shared buffer its layout (shape = rows, cols[, stages]).
SHARED_LAYOUTS = (K.SmemLayoutOp, K.SmemTransposeLayoutOp, H.GmmaSmemLayoutOp)

# TL elementwise function → kernel-IR expression in x0, x1 (LANGUAGE.md §5: division by zero is 0).
FN = {"add": "x0 + x1", "sub": "x0 - x1", "mul": "x0 * x1", "div": "select(x1 == 0.0, 0.0, x0 / x1)",
      "max": "max(x0, x1)", "min": "min(x0, x1)", "exp": f"exp2(x0 * {LOG2E!r})", "exp2": "exp2(x0)",
      "log": "log(x0)", "tanh": "tanh(x0)", "relu": "max(x0, 0.0)", "neg": "-x0", "abs": "abs(x0)",
      "sqrt": "sqrt(x0)", "square": "x0 * x0"}


class TileOpLowering(CopyRules, WgmmaRules, GemmRules):
    """Lower one TL program (after the TL passes) to a `ProgramOp` for `arch`."""

    def __init__(self, graph: Graph, arch: ArchInfo, name: str) -> None:
        self.g, self.arch, self.name = graph, arch, name
        self.dtype = str(graph.params.get("dtype", "bf16"))
        self.warps = self._int_param("Warps", 4)
        self.names = Namer(reserved=(*BUILTINS, "p", "tidx", "smem_"))
        self.fields = {n: n for n in graph.inputs}
        self.x = ExprLowering(graph.params, graph.inputs, self.fields)
        self.abi: LaunchABI = derive_abi(graph, name, self.x.int_value)
        self.layouts: list[K.Op] = []
        self.decls: list[K.Op] = []
        self.memo: dict[tuple, str] = {}
        self.slots: dict[int, Slot] = {}
        self.buffers: dict[str, Buffer] = {}
        self.m_rows: int | None = None
        self.region = 0
        self.loops: list[tuple[str, set[str]]] = []   # enclosing loops: (kernel var, buffers written)
        self.row_ref: dict[int, str] = {}
        self.global_rows: dict[str, Expr] = {}
        self.register_allocs: dict[str, tuple[str, Loc | None]] = {}
        self._regions = 0
        self.hopper = arch.mma_path == "wgmma"
        self.col_unit = 64 if self.hopper else 32   # tile widths pad to this (tile_copies.padded)
        self.mma_decls: list[K.Op] = []            # sm_90a: the wgmma TiledMMAs, declared by the GEMM rule
        self.gmma_major: dict[str, str] = {}       # sm_90a: operand buffer → "k" | "mn" (its GMMA layout)
        # sm_90a: tiled copies whose tile rows are not whole passes, (name, why, loc): legal only if
        # warp-specialize replaces every copy through them with TMA (checked after it, passes.py)
        self.partial_copies: list[tuple[str, str, Loc | None]] = []

    # ------------------------------------------------------------------ driver
    def run(self) -> K.ProgramOp:
        if self.dtype not in ("bf16", "fp16"):
            raise fail(f"tlc build: dtype {self.dtype} has no {self.arch.mma_path} path (bf16 or fp16)")
        body: list[K.Op] = []
        if self.hopper:
            declared = self._int_param("Warps", 4) if "Warps" in self.g.params else None
            self.warp_plan = plan_wgmma(self.g, declared, self.x, self.names)
            self.warps = self.warp_plan.warps
        else:
            self.warp_plan = plan_warps(self.g, self.warps, self.x)
        self._lower_region(self.g, body)
        if self.m_rows is None:
            raise fail("tlc build: the program has no GEMM; the lowering needs one to fix the thread layout")
        # a loop whose trips grow with block_idx (causal): its longest tiles first, the hardware's launch order;
        # rows counted from the end put them first already
        rev = any(isinstance(op, LoopOp) and op.stop is not None and "block_idx" in str(op.stop)
                  for _, op in self.g.walk()) and not self._rows_from_end()
        lets = [K.LetOp(name="block_idx", type="i32", value=E("gridDim.x - 1 - blockIdx.x" if rev else "blockIdx.x")),
                K.LetOp(name="head_idx", type="i32", value=E("blockIdx.y")),
                K.LetOp(name="batch_idx", type="i32", value=E("blockIdx.z")),
                K.LetOp(name="group", type="i32", value=Var("p.group"))]
        mmas = self.mma_decls if self.hopper else self.warp_plan.decls(self.arch.mma_atoms[self.dtype])
        smem = self._smem_decls()
        rows = Var(f"p.{self.abi.grid_rows}") if not self.abi.grid_rows.isdigit() else Const(int(self.abi.grid_rows))
        grid = (E(f"ceil_div({rows}, {self.abi.grid_tile})"), Var("p.heads"), Var("p.batch"))
        kernel_op = H.Sm90KernelOp if self.hopper else K.KernelOp
        kernel = kernel_op(name=self.name, params=self.abi.params_op().name, threads=32 * self.warps, min_blocks=1,
                            grid=grid, smem_bytes=smem_extent(smem),
                            body=tuple(lets + mmas + smem + self.layouts + self.decls + body))
        program = K.ProgramOp(name=self.name, body=(self.abi.params_op(), kernel))
        program.verify()
        return program

    def _rows_from_end(self) -> bool:
        return any(isinstance(op, CopyOp) and op.from_end for _, op in self.g.walk())

    def _int_param(self, name: str, default: int) -> int:
        v = self.g.params.get(name, default)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise fail(f"tlc build: Param {name} must be a positive integer, not {v!r}")
        return v

    def _lower_region(self, region: Graph, out: list[K.Op], yields: tuple[Value, ...] = ()) -> None:
        ops = region.ops()
        self._last = last_uses(region, ops, yields)
        for i, op in enumerate(ops):
            self._index = i
            rule = getattr(self, f"_{type(op).__name__}", None)
            if rule is None or isinstance(op, SoftmaxOp):
                raise fail(f"tlc build: no kernel lowering for '{op.mnemonic}' here (run the TL passes first; "
                           "the lowering handles Allocate, Copy, GEMM, elementwise, Mask, the online "
                           "softmax's ops, Reshape and loops)", op.loc)
            rule(op, region, out)

    # ------------------------------------------------------------------ slots and storage
    def slot(self, v: Value, op: Op) -> Slot:
        s = self.slots.get(v.uid)
        if s is None:
            raise fail(f"tlc build: '{v.name}' has no storage in the kernel here (read before it is defined?)", op.loc)
        return s

    def _dies_here(self, v: Value) -> bool:
        s = self.slots.get(v.uid)
        return (s is not None and s.region == self.region and s.kind in ("frag", "row")
                and self._last.get(v.uid, -1) <= self._index)

    def _bind(self, v: Value, s: Slot) -> Slot:
        self.slots[v.uid] = s
        return s

    def _row_ref(self, rows: int) -> str:
        if rows not in self.row_ref:
            name = self.names.fresh(f"row_layout_{rows}")
            if self.hopper:  # any wgmma accumulator of the block's rows: the first GEMM's
                self.decls.append(self._c_fragment(name, self.warp_plan.row_mma, (rows, self.warp_plan.row_n)))
            else:
                self.decls.append(K.FragmentOp(name=name, mma="tiled_mma", role="C", dtype="fp32", shape=(rows, 16)))
            self.row_ref[rows] = name
        return self.row_ref[rows]

    def _c_fragment(self, name: str, mma: str, shape: tuple[int, int], loc: Loc | None = None) -> K.Op:
        """fp32 accumulator registers of TiledMMA `mma` (a wgmma one on sm_90a)."""
        if self.hopper:
            return H.WgmmaFragmentOp(name=name, mma=mma, role="C", shape=shape, loc=loc)
        return K.FragmentOp(name=name, mma=mma, role="C", dtype="fp32", shape=shape, loc=loc)

    def _fresh_like(self, s: Slot, base: str, out: list[K.Op], loc: Loc | None, init: float | None = None) -> Slot:
        name = self.names.fresh(base)
        if s.kind == "row":
            out.append(K.RowVectorOp(name=name, like=self._row_ref(s.rows), init=Const(0.0 if init is None else init),
                                     loc=loc))
        else:
            out.append(self._c_fragment(name, s.mma, (s.rows, s.cols), loc))
        return Slot(s.kind, name, s.rows, s.cols, region=self.region, logical_cols=s.logical_cols, mma=s.mma)

    def _target(self, v: Value, result: Value, out: list[K.Op], loc: Loc | None) -> Slot:
        """Storage for `result` computed from `v` by an in-place op: v's own if v dies here."""
        src = self.slots[v.uid]
        if self._dies_here(v):
            return self._bind(result, dataclasses.replace(src, region=self.region))
        dst = self._fresh_like(src, result.base, out, loc)
        out.append(K.MapOp(target=dst.name, srcs=(src.name,), fn=E("x0"), loc=loc))
        return self._bind(result, dst)

    def _tile(self, v: Value, op: Op) -> Slot:
        s = self.slot(v, op)
        if s.kind not in ("frag", "row"):
            what = {"smem": "a shared-memory tile", "global": "a global tensor", "afrag": "a GEMM A-operand fragment",
                    "scalar": "a scalar"}[s.kind]
            raise fail(f"tlc build: '{v.base}' is {what} here; this operation needs an fp32 register tile (an "
                       "accumulator) or a row vector", op.loc)
        return s

    # ------------------------------------------------------------------ Allocate
    def _AllocateOp(self, op: AllocateOp, region: Graph, out: list[K.Op]) -> None:
        if op.space == "global":
            t = next(t for t in self.abi.tensors if t.name == op.name)
            if t.cols % 8:
                raise fail(f"tlc build: global tensor '{op.name}' has {t.cols} columns; rows are copied in 16-byte "
                           "chunks, so the width must be a multiple of 8 (pad the tensor)", op.loc)
            head = self.x.lower(op.offset if op.offset is not None else A.Name("head_idx"), op.loc)
            offset = BinOp("+", BinOp("*", Var("batch_idx"), Var(f"p.{t.stride('batch')}")),
                           BinOp("*", head, Var(f"p.{t.stride('head')}")))
            name = self.names.fresh(f"m{op.name}")
            cols = padded(t.cols, self.col_unit)
            self.decls.append(K.GlobalTensorOp(name=name, dtype=t.dtype, ptr=Var(f"p.{t.ptr}"), offset=offset,
                                               rows=self.x.lower(op.shape[0], op.loc), cols=cols,
                                               row_stride=Var(f"p.{t.stride('row')}"), loc=op.loc))
            self.global_rows[name] = self.x.lower(op.shape[0], op.loc)
            self._bind(op.result, Slot("global", name, cols=cols, region=-1, logical_cols=t.cols))
            return
        rows, logical = self._shape2(op.shape, op.loc, f"'{op.name}'")
        cols = padded(logical, self.col_unit)
        if op.space == "shared":
            dtype = op.result.type.dtype or self.dtype
            if op.name in self.buffers:
                raise fail(f"tlc build: shared buffer '{op.name}' is allocated twice", op.loc)
            if logical % 8 or not kblock(cols):
                raise fail(f"tlc build: shared tile '{op.name}' has {logical} columns; the copies move 8 elements "
                           "(16 bytes) per thread, so the width must be a multiple of 8", op.loc)
            self.buffers[op.name] = Buffer(op.name, self.names.fresh(f"s{op.name}"), rows, cols, dtype, op.loc,
                                           logical_cols=logical)
            self._bind(op.result, Slot("smem", self.buffers[op.name].name, rows, cols, region=-1,
                                       buffer=self.buffers[op.name], uid=-1, logical_cols=logical))
            return
        name = self.names.fresh(f"r{op.name}")
        self.register_allocs[name] = (f"Allocate {op.name} in register", op.loc)
        mma = self.warp_plan.mma_of_register(op.name)
        out += [self._c_fragment(name, mma, (rows, cols), op.loc), K.ClearOp(target=name, loc=op.loc)]
        self._bind(op.result, Slot("frag", name, rows, cols, region=self.region, logical_cols=logical, mma=mma))

    def _shape2(self, shape, loc: Loc, what: str) -> tuple[int, int]:
        if len(shape) != 2:
            raise fail(f"tlc build: {what} must be a 2-D tile (rows, cols)", loc)
        return self.x.int_value(shape[0], loc, "a tile extent"), self.x.int_value(shape[1], loc, "a tile extent")

    # ------------------------------------------------------------------ fragment math
    def _ScalarOp(self, op: ScalarOp, region: Graph, out: list[K.Op]) -> None:
        value = self.x.lower(op.expr, op.loc)
        is_float = not self.x._is_int(value)
        name = self.names.fresh(op.result.base)
        out.append(K.LetOp(name=name, type="f32" if is_float else "i32", value=value, loc=op.loc))
        if is_float:
            self.x.float_names.add(name)
        self._bind(op.result, Slot("scalar", name, region=self.region, is_float=is_float))

    def _scalar_expr(self, v: Value, op: Op) -> Expr | None:
        s = self.slot(v, op)
        return Var(s.name) if s.kind == "scalar" else None

    def _ElementwiseOp(self, op: ElementwiseOp, region: Graph, out: list[K.Op]) -> None:
        fn = E(FN[op.fn])
        slots = [self.slot(v, op) for v in op.operands]
        tiles = [i for i, s in enumerate(slots) if s.kind != "scalar"]
        if not tiles:
            raise fail("tlc build: an elementwise op on scalars only; write it as an expression", op.loc)
        for i, s in enumerate(slots):
            if s.kind == "scalar":
                fn = substitute(fn, f"x{i}", Var(s.name))
        kinds = {slots[i].kind for i in tiles}
        if kinds - {"frag", "row"}:
            self._tile(op.operands[tiles[0]], op)
        if kinds == {"frag", "row"}:
            t = next(i for i in tiles if slots[i].kind == "frag")
            r = next(i for i in tiles if slots[i].kind == "row")
            if slots[t].rows != slots[r].rows:
                raise fail("tlc build: the row vector's length differs from the tile's rows", op.loc)
            fn = substitute(substitute(fn, f"x{t}", Var("x")), f"x{r}", Var("r"))
            dst = self._target(op.operands[t], op.result, out, op.loc)
            out.append(K.RowBroadcastOp(target=dst.name, vec=slots[r].name, fn=fn, loc=op.loc))
            return
        shapes = {(slots[i].rows, slots[i].cols) for i in tiles}
        if len({slots[i].mma for i in tiles}) > 1:
            raise fail("tlc build: elementwise operands are spread over the warps differently (one is split by "
                       "columns across warps); compute them with GEMMs of the same kind", op.loc)
        if len(shapes) > 1:
            raise fail(f"tlc build: elementwise operands have different shapes {sorted(shapes)}", op.loc)
        for k, i in enumerate(tiles):
            fn = substitute(fn, f"x{i}", Var(f"y{k}"))
        for k in range(len(tiles)):
            fn = substitute(fn, f"y{k}", Var(f"x{k}"))
        first = op.operands[tiles[0]]
        if self._dies_here(first):
            first_slot = slots[tiles[0]]
            dst = self._bind(op.result, dataclasses.replace(first_slot, region=self.region))
        else:
            dst = self._bind(op.result, self._fresh_like(slots[tiles[0]], op.result.base, out, op.loc))
        out.append(K.MapOp(target=dst.name, srcs=tuple(slots[i].name for i in tiles), fn=fn, loc=op.loc))

    def _MaskOp(self, op: MaskOp, region: Graph, out: list[K.Op]) -> None:
        s = self._tile(op.operands[0], op)
        rows_o, cols_o = origin(region, op.operands[0], 0), origin(region, op.operands[0], 1)
        if rows_o is None or cols_o is None:
            raise fail("tlc build: cannot tell which query rows and key columns this tile holds (mask a GEMM "
                       "result of tiles copied from global)", op.loc)
        row0, col0 = self.x.lower(rows_o.start, op.loc), self.x.lower(cols_o.start, op.loc)
        ident = self._identity(s.rows, s.cols)
        coord = self._partition(("C", ident, s.mma), f"tS{ident}", self.warp_plan.slice_of(s.mma), "partition_C",
                                Var(ident))
        dst = self._target(op.operands[0], op.result, out, op.loc)
        if op.kind == "bounds":
            mask = K.MaskOp(target=dst.name, coord=coord, row0=row0, col0=col0, sq=Const(0),
                            sk=self.x.lower(op.limit, op.loc), causal=False, alignment="top_left", bounds=True,
                            loc=op.loc)
        else:
            if rows_o.extent is None or cols_o.extent is None:
                raise fail("tlc build: a causal mask needs the lengths of both sequences", op.loc)
            mask = K.MaskOp(target=dst.name, coord=coord, row0=row0, col0=col0,
                            sq=self.x.lower(rows_o.extent, op.loc), sk=self.x.lower(cols_o.extent, op.loc),
                            causal=True, alignment=op.alignment, bounds=False, loc=op.loc)
        if not op.from_iteration:
            out.append(mask)
            return
        (var, first), = op.from_iteration
        cond = BinOp(">=", self.x.lower(A.Name(var), op.loc), self.x.lower(first, op.loc))
        out.append(K.IfOp(cond=cond, body=(mask,), loc=op.loc))

    def _RowReduceOp(self, op: RowReduceOp, region: Graph, out: list[K.Op]) -> None:
        s = self._tile(op.operands[0], op)
        if s.kind != "frag":
            raise fail("tlc build: a row reduction reads a tile", op.loc)
        if s.logical_cols != s.cols:
            raise fail(f"tlc build: a row reduction over a tile whose {s.logical_cols} columns are padded to {s.cols} "
                       "in the kernel is not supported; use a width that is a multiple of 32", op.loc)
        self.warp_plan.need_whole_rows(s.mma, "a row reduction", op.loc)
        dst = self._bind(op.result, self._fresh_like(Slot("row", "", s.rows), op.result.base, out, op.loc))
        out += [K.RowReduceOp(dst=dst.name, src=s.name, kind=op.fn, accumulate=False, loc=op.loc),
                K.AllReduceOp(target=dst.name, kind=op.fn, width=4, loc=op.loc)]

    def _ScaledExpOp(self, op: ScaledExpOp, region: Graph, out: list[K.Op]) -> None:
        x, m = (self._tile(v, op) for v in op.operands[:2])
        scale = self._scalar_expr(op.operands[2], op)
        if m.kind != "row" or scale is None:
            raise fail("tlc build: scaled_exp2 takes a tile, a row vector and a scalar", op.loc)
        if x.kind == "frag":
            dst = self._target(op.operands[0], op.result, out, op.loc)
            out.append(K.Exp2ScaleOp(target=dst.name, row_max=m.name, scale_log2=scale, loc=op.loc))
            return
        fn = substitute(E("exp2(x0 * s - select(x1 == -inf, 0.0, x1 * s))"), "s", scale)
        dst = self._bind(op.result, self._fresh_like(x, op.result.base, out, op.loc))
        out.append(K.MapOp(target=dst.name, srcs=(x.name, m.name), fn=fn, loc=op.loc))

    def _FullOp(self, op: FullOp, region: Graph, out: list[K.Op]) -> None:
        dims = [self.x.int_value(d, op.loc, "a tile extent") for d in op.shape]
        if len(dims) == 1:
            dst = self._fresh_like(Slot("row", "", dims[0]), op.result.base, out, op.loc, init=float(op.value))
        else:
            dst = self._fresh_like(Slot("frag", "", *dims), op.result.base, out, op.loc)
            out.append(K.MapOp(target=dst.name, srcs=(), fn=Const(float(op.value)), loc=op.loc))
        self._bind(op.result, dst)

    def _ReshapeOp(self, op: ReshapeOp, region: Graph, out: list[K.Op]) -> None:
        s = self._tile(op.operands[0], op)
        if s.kind != "frag" or (op.src_modes[:1], op.dst_modes[:1]) != (("MMA_C",), ("MMA_A",)):
            raise fail("tlc build: the lowering regroups an accumulator (MMA_C) as an A operand (MMA_A) "
                       f"only; this Reshape goes {op.src_modes[:1]} → {op.dst_modes[:1]}", op.loc)
        dtype = op.dtype or self.dtype
        if dtype not in ("bf16", "fp16"):
            raise fail(f"tlc build: an A operand is bf16 or fp16, not {dtype}", op.loc)
        self.warp_plan.need_whole_rows(s.mma, "a Reshape to an A operand", op.loc)
        conv, frag = self.names.fresh(f"r{op.result.base}"), self.names.fresh(f"tAr{op.result.base}")
        out += [K.ConvertOp(name=conv, src=s.name, dtype=dtype, loc=op.loc),
                K.RetileAccToAOp(name=frag, src=conv, mma=s.mma, loc=op.loc)]
        self._bind(op.result, Slot("afrag", frag, s.rows, s.cols, region=self.region, mma=s.mma))

    # ------------------------------------------------------------------ loops
    def _LoopOp(self, op: LoopOp, region: Graph, out: list[K.Op]) -> None:
        var = self.names.fresh(op.var)
        self.x.bind(op.var, var)
        start = self.x.lower(op.start if op.start is not None else A.Num(0), op.loc)
        stop = self.x.lower(op.stop, op.loc, ceil=True)
        carried = len(op.operands)
        if len(op.yields) > carried:
            raise fail("tlc build: values exported from a loop body (not carried) have no lowering; "
                       "run the TL passes (online-softmax carries the softmax statistics)", op.loc)
        homes: list[Slot] = []
        for v in op.operands:
            if self._dies_here(v):
                home = self.slots[v.uid]
            else:
                like = self._tile(v, op)
                home = self._fresh_like(like, v.base, out, op.loc)
                out.append(K.MapOp(target=home.name, srcs=(like.name,), fn=E("x0"), loc=op.loc))
            homes.append(home)
        outer = (self.region, self._last, self._index)
        self._regions += 1
        self.region = inner_region = self._regions
        for arg, home in zip(op.args[1:], homes):
            self._bind(arg, dataclasses.replace(home, region=inner_region))
        body: list[K.Op] = []
        self.loops.append((var, set()))
        self._lower_region(op.body, body, tuple(op.yields[:carried]))
        self.loops.pop()
        moves = [(self.slots[y.uid].name, h.name) for y, h in zip(op.yields, homes) if self.slots[y.uid].name != h.name]
        homes_set = {h.name for h in homes}
        if any(src in homes_set for src, _ in moves):
            temps = []
            for src, dst in moves:
                tmp = self._fresh_like(next(h for h in homes if h.name == dst), f"{dst}_next", body, op.loc)
                body.append(K.MapOp(target=tmp.name, srcs=(src,), fn=E("x0"), loc=op.loc))
                temps.append((tmp.name, dst))
            moves = temps
        body += [K.MapOp(target=dst, srcs=(src,), fn=E("x0"), loc=op.loc) for src, dst in moves]
        self.region, self._last, self._index = outer
        out.append(K.ForOp(var=var, start=start, stop=stop, step=1, body=tuple(body), loc=op.loc))
        for res, home in zip(op.results, homes):
            self._bind(res, dataclasses.replace(home, region=self.region))

    # ------------------------------------------------------------------ shared memory
    def _smem_decls(self) -> list[K.Op]:
        out: list[K.Op] = []
        offset = 0
        for buf in self.buffers.values():
            out += self._buffer_layout(buf)
        # GMMA's swizzle is by address: its tiles start 1024-byte aligned (sm_90a only).
        align = 1024 if self.gmma_major else 128
        for buf in self.buffers.values():
            at = 0 if buf.reuse else offset
            out.append(K.SharedBufferOp(name=buf.name, dtype=buf.dtype, layout=f"{buf.name}_layout", offset_bytes=at,
                                        reuse=buf.reuse, loc=buf.loc))
            if not buf.reuse:
                offset += -(-buf.bytes // align) * align
        return out

    def _buffer_layout(self, buf: Buffer) -> list[K.Op]:
        """`<buf>_layout`, (rows, cols) as copies write it: swizzled atoms (infer-layouts picks the swizzle), or
        on sm_90a for a wgmma operand GMMA's 128-byte K-major atoms as stored; an operand read MN-major (V
        of P·V) is stored the same way and seen transposed (`<buf>_layout_mn`), so every 64 columns of it
        are one contiguous swizzled box, as a TMA load writes them."""
        major = self.gmma_major.get(buf.name)
        if major in ("k", "mn"):
            out: list[K.Op] = [H.GmmaSmemLayoutOp(name=f"{buf.name}_layout", dtype=buf.dtype, swizzle=128,
                                                  shape=(buf.rows, buf.cols), k_major=True, loc=buf.loc)]
            if major == "mn":
                out.append(K.SmemTransposeLayoutOp(name=f"{buf.name}_layout_mn", of=f"{buf.name}_layout",
                                                   shape=(buf.cols, buf.rows), loc=buf.loc))
            return out
        return [K.SmemLayoutOp(name=f"{buf.name}_layout", swizzle=(0, 0, 0), atom=(8, kblock(buf.cols)),
                               shape=(buf.rows, buf.cols), loc=buf.loc)]


def smem_extent(ops: list[K.Op]) -> int:
    """Bytes of dynamic shared memory the buffers among `ops` span (layout shapes × element size)."""
    layouts = {op.name: op for op in ops if isinstance(op, SHARED_LAYOUTS)}
    end = 0
    for op in ops:
        if isinstance(op, K.SharedBufferOp):
            n = 1
            for d in layouts[op.layout].shape:
                n *= d
            end = max(end, op.offset_bytes + n * (4 if op.dtype == "fp32" else 2))
    return end


def lower_tile_ops(graph: Graph, arch: ArchInfo, name: str) -> K.ProgramOp:
    return TileOpLowering(graph, arch, name).run()
