"""verify-final: the paper's rules, checked on the repaired program before target lowering.

Every global Copy reads (or stores to) a global Allocate; shared-memory intermediates
are allocated (repaired from the copy's tile when that is unique); every GEMM-to-GEMM
edge has its Reshape to MMA_A; loop bounds, coordinates and shapes use only defined
names; the program computes something and stores it. Only the missing shared Allocate is
repaired:

    %K.3 = copy(%K) {dst_space = shared, tile = (`BN`, `HeadDim`)}      (no Allocate K in shared)
    remark: 'K' is copied to shared memory but never allocated there; inserted …
    %K.4 = allocate() {name = K, space = shared, shape = (`BN`, `HeadDim`), dtype = bf16}
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tlc.diagnostics import Loc
from tlc.expr import Expr, free_names
from tlc.frontend.names import BUILTINS
from tlc.ir.graph import Graph
from tlc.ir.tensor_inputs import loads, scalar_names
from tlc.ir.ops import AllocateOp, CopyOp, ElementwiseOp, GemmOp, LoopOp, MaskOp, Op, SoftmaxOp
from tlc.ir.types import TileType, Value
from tlc.passes.base import Pass, PassContext
from tlc.ir.row_maps import ROW
from tlc.passes.infer_shapes import dims, shape_text
from tlc.names import fresh_value_name
from tlc.passes.insert_reshape import layout_sources, reshape_role


@dataclass(frozen=True)
class VerifyFinalPass(Pass):
    name: ClassVar[str] = "verify-final"

    def apply(self, ctx: PassContext, graph: Graph) -> None:
        start = len(ctx.sink.items)
        self.global_allocations(ctx, graph)
        self.shared_allocations(ctx, graph)
        self.reshapes(ctx, graph)
        self.names(ctx, graph, graph, set())
        self.computes_and_stores(ctx, graph)
        ctx.sink.items[start:] = sorted(ctx.sink.items[start:], key=lambda d: (d.loc.line, d.loc.col) if d.loc else (0, 0))

    # ------------------------------------------------------------ global tensors
    @staticmethod
    def global_allocations(ctx: PassContext, graph: Graph) -> None:
        for region, op in graph.walk():
            if not isinstance(op, CopyOp) or "global" not in (op.src_space, op.dst_space):
                continue
            tensor = op.operands[0] if op.src_space == "global" else op.operands[-1]
            alloc = global_allocation(region, tensor)
            if not isinstance(alloc, AllocateOp) or alloc.space != "global" or not alloc.shape:
                ctx.error(f"'{tensor.base}' is copied {'from' if op.src_space == 'global' else 'to'} global "
                          f"memory without a prior 'Allocate {tensor.base} in global (rows, cols)'; add one "
                          "that names its shape", op.loc)
                continue
            if op.tile and not op.coord and dims(op.tile) != dims(alloc.shape):
                ctx.error(f"copy of a {shape_text(op.tile)} tile of '{tensor.base}' {shape_text(alloc.shape)} has no "
                          "coordinate; write 'in coordinate [L = …]' to say which tile", op.loc)

    # ------------------------------------------------------------ shared intermediates
    @staticmethod
    def shared_allocations(ctx: PassContext, graph: Graph) -> None:
        allocated = {op.name for _, op in graph.walk() if isinstance(op, AllocateOp) and op.space == "shared"}
        for region, op in list(graph.walk()):
            if not isinstance(op, CopyOp) or op.dst_space != "shared":
                continue
            name = op.operands[0].base
            if name in allocated:
                continue
            shape = tuple(op.tile) if op.tile else op.operands[0].type.shape
            if not shape:
                ctx.error(f"'{name}' is copied to shared memory but never allocated there, and its tile shape "
                          f"is unknown; add 'Allocate {name} in shared (rows, cols)'", op.loc)
                continue
            dtype = op.operands[0].type.dtype
            v = Value(fresh_value_name(graph, name, bare=False), TileType("shared", shape, dtype), name)
            alloc = AllocateOp((v,), (), name=name, space="shared", shape=shape, dtype=dtype, loc=op.loc)
            graph.insert_before(_top_level(graph, op), alloc)
            allocated.add(name)
            ctx.remark(f"'{name}' is copied to shared memory but never allocated there; inserted "
                       f"'Allocate {name} in shared {shape_text(shape)}' from the copy's tile", op.loc)

    # ------------------------------------------------------------ GEMM-to-GEMM edges
    @staticmethod
    def reshapes(ctx: PassContext, graph: Graph) -> None:
        for region, op in graph.walk():
            if not isinstance(op, GemmOp):
                continue
            for src in layout_sources(region, op.operands[0]):
                if isinstance(src, GemmOp):
                    ctx.error(f"the accumulator of the GEMM at line {src.loc.line} reaches the A operand "
                              f"'{op.operands[0].base}' without a Reshape to MMA_A", op.loc)
                elif reshape_role(src) != "A":
                    ctx.error(f"the A operand '{op.operands[0].base}' comes from a Reshape to "
                              f"{src.dst_modes[0] if src.dst_modes else '?'}, not MMA_A", src.loc)

    # ------------------------------------------------------------ a program has a result
    @staticmethod
    def computes_and_stores(ctx: PassContext, graph: Graph) -> None:
        """No Compute, or nothing stored to global memory: the kernel would mean nothing.
        (A sketch may omit stores; sketches never reach the passes.)"""
        ops = list(graph.walk())
        if not ops:
            where = max(graph.param_locs.values(), key=lambda loc: loc.line, default=Loc(graph.file, 1, 1))
            ctx.error("the program computes nothing: it declares Params and Inputs but has no statement; add "
                      "the loads, the computation and a 'Copy X (rows, cols) in coordinate [L = block_idx] from "
                      "register to global' that stores its result", where)
            return
        if ops and not any(isinstance(op, (GemmOp, ElementwiseOp, SoftmaxOp, MaskOp)) for _, op in ops):
            ctx.error("the program computes nothing: it has no Compute statement; add the computation "
                      "between the loads and the store (e.g. 'Compute GEMM Q, K.T and get S')", ops[0][1].loc)
        loaded, stored = set(), set()
        for region, op in ops:
            if isinstance(op, CopyOp) and op.src_space == "global":
                loaded.add(id(global_allocation(region, op.operands[0])))
            if isinstance(op, CopyOp) and op.dst_space == "global":
                stored.add(id(global_allocation(region, op.operands[-1])))
        outputs = [op for _, op in ops if isinstance(op, AllocateOp) and op.space == "global"
                   and id(op) not in loaded | stored]
        if ops and not stored and not outputs:
            ctx.error("the program stores nothing to global memory, so the kernel has no result; add "
                      "'Copy X (rows, cols) in coordinate [L = block_idx] from register to global' at its end",
                      graph.ops()[-1].loc)
        for op in outputs:
            ctx.error(f"'{op.name}' is allocated in global memory but never stored, so the kernel has no "
                      f"result there; add 'Copy {op.name} (rows, cols) in coordinate [L = block_idx] from "
                      f"register to global' after its computation, or remove the Allocate", op.loc)

    # ------------------------------------------------------------ names in expressions
    def names(self, ctx: PassContext, graph: Graph, region: Graph, loop_vars: set[str]) -> None:
        params = {k for k, v in graph.params.items() if v is not None}
        known = params | set(graph.inputs) | set(BUILTINS) | loop_vars | set(graph.axes)
        # a global tensor's head offset may read any loop's variable: each copy evaluates it where it stands
        every_loop = {op.var for _, op in graph.walk() if isinstance(op, LoopOp)}
        for op in region.ops():
            for what, e in _exprs(op):
                allowed = known | every_loop if isinstance(op, AllocateOp) and op.space == "global" else known
                allowed = allowed | {ROW} if what == "a row map" else allowed
                for n in sorted(scalar_names(e) - allowed):
                    why = "has no value (bind it with -D or 'Param … = …')" if n in graph.params else "is not defined"
                    ctx.error(f"'{n}' in {what} {why}; use parameters, inputs, "
                              f"{', '.join(sorted(BUILTINS))} or an enclosing loop variable", op.loc)
                for x in loads(e):
                    t = graph.tensor_inputs.get(x.base.name)
                    if t is None or len(t.dims) != len(x.indices):
                        ctx.error(f"'{x}' in {what} reads no tensor Input; declare 'Input {x.base.name} : int32[…]' "
                                  "with one dimension per index", op.loc)
            if isinstance(op, LoopOp):
                if op.stop is None or op.start is None:
                    ctx.error(f"loop '{op.var}' has no bound; write 'for {op.var} = 0:N'", op.loc)
                if op.body is not None:
                    self.names(ctx, graph, op.body, loop_vars | {op.var})


def global_allocation(region: Graph, tensor: Value) -> AllocateOp | None:
    """The `Allocate … in global` a global tensor value comes from. A store defines a new value of the
    tensor (the frontend's SSA form), and a loop passes it on as a result or a carried argument, so a
    second store or a load after a store reaches the Allocate through them."""
    for _ in range(10_000):  # each step moves to an earlier definition; the bound only guards a cycle
        op = region.producer(tensor)
        if isinstance(op, CopyOp) and op.dst_space == "global":
            tensor = op.operands[-1]
        elif isinstance(op, LoopOp) and tensor in op.results[:len(op.operands)]:
            tensor = op.operands[op.results.index(tensor)]
        elif op is None and (owner := _owning_loop(region, tensor)) is not None:
            region, loop = owner
            tensor = loop.operands[loop.args.index(tensor) - 1]
        else:
            return op if isinstance(op, AllocateOp) else None
    return None


def _owning_loop(region: Graph, arg: Value) -> tuple[Graph, LoopOp] | None:
    """(enclosing region, loop) when `arg` is a carried argument of the loop whose body is `region`
    or encloses it (args[0] is the induction variable; args[1:] pair with the loop's operands)."""
    while region.parent is not None:
        for op in region.parent.ops():
            if isinstance(op, LoopOp) and op.body is region and arg in op.args[1:]:
                return region.parent, op
        region = region.parent
    return None


def _exprs(op: Op) -> list[tuple[str, Expr]]:
    out: list[tuple[str, Expr]] = []
    if isinstance(op, LoopOp):
        out += [("the loop bound", e) for e in (op.start, op.stop) if e is not None]
    if isinstance(op, CopyOp):
        out += [("a coordinate", e) for _, e in op.coord]
        out += [("a tile shape", e) for e in op.tile or ()]
    if isinstance(op, AllocateOp):
        out += [("a shape", e) for e in op.shape] + ([("an offset", op.offset)] if op.offset is not None else [])
        out += [("a row map", op.rows_at)] if op.rows_at is not None else []
    return out


def _top_level(graph: Graph, target: Op) -> Op:
    """The op of the program's top region that is, or contains, `target`."""
    for op in graph.ops():
        if op is target or (isinstance(op, LoopOp) and op.body is not None
                            and any(o is target for _, o in op.body.walk())):
            return op
    raise KeyError("op not in graph")
