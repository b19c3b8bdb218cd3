"""`mask`: make masking explicit (runs after online-softmax, on the scores the exp2 reads).

Causal: the KV loop stops at the diagonal and the mask is only applied from the first
tile that crosses it. Bounds: the loads of the KV loop (and the query tile) zero-fill past
the tensor's end, and the scores get an explicit `col >= seqlen_k → -inf` mask, applied only
from the first partial tile on.

    before                                        after
    loop(…) {stop = `seqlen_k / BN`} [            loop(…) {stop = `min(seqlen_k / BN, cdiv(min((block_idx + 1) * BM,
      %K.3 = copy(%K) {coord = [L = `n`],                     seqlen_q), BN))`} [
                       oob = absent}                %K.3 = copy(%K) {…, oob = zero}
      %S.2 = mask(%S) {kind = causal}               %S.2 = mask(%S) {kind = causal, from_iteration = [n = `(block_idx * BM + 1) / BN`]}
      %m.4 = row_reduce(%S.2) {fn = max}            %S.3 = mask(%S.2) {kind = bounds, limit = `seqlen_k`, from_iteration = [n = `seqlen_k / BN`]}
                                                    %m.4 = row_reduce(%S.3) {fn = max}

A query tile counted from the end (`[L = block_idx from end]`, tile_origin.Origin.start) starts at
`seqlen_q - (block_idx + 1) * BM` and ends at `seqlen_q - block_idx * BM`: the diagonal trip and the
loop bound come from those. `from_iteration` divisions round down (only loop bounds round up). A trip cut off by the
diagonal has every score masked, so it adds nothing once the softmax is online; with a
domain softmax still in the loop the cut is left out (its statistics need a trip per row).
A predicate mask (`Compute Mask S where …`) is left as written, in every trip: nothing here bounds
the tiles it masks, and a causal mask beside it is cut and placed as above.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from tlc.expr import BinOp, Call, Const, Expr, ExprError, Var, eval_expr
from tlc.ir.graph import Graph
from tlc.ir.ops import CopyOp, LoopOp, MaskOp, RowReduceOp, SoftmaxOp
from tlc.ir.types import Value
from tlc.passes.base import Pass, PassContext
from tlc.passes.masked_trips import masked_trip_changes
from tlc.names import fresh_value_name
from tlc.passes.tile_origin import Origin, origin, row_source
from tlc.passes.verify_final import global_allocation


@dataclass(frozen=True)
class MaskPass(Pass):
    name: ClassVar[str] = "mask"

    def apply(self, ctx: PassContext, graph: Graph) -> None:
        refused = _refuse_stores_elsewhere(ctx, graph)
        for region, op in list(graph.walk()):
            if isinstance(op, LoopOp) and op.body is not None:
                _LoopMasks(ctx, graph, region, op, refused).run()


def _add(a: Expr, b: Expr) -> Expr:
    return a if b == Const(0) else BinOp("+", a, b)


def _shift(alignment: str) -> Expr:
    """Columns a query row sees beyond its own index (LANGUAGE.md, Compute Mask)."""
    return BinOp("-", Var("seqlen_k"), Var("seqlen_q")) if alignment == "bottom_right" else Const(0)


def _cdiv(a: Expr, b: Expr) -> Expr:
    """Tiles needed to cover `a` positions: rounds up (a floor here drops the diagonal tile)."""
    return Call("cdiv", (a, b))


def scores_of(body: Graph) -> list[Value]:
    """The tiles a softmax normalises: its input, or what the online form's row max reads."""
    out: list[Value] = []
    for op in body.ops():
        x = None
        if isinstance(op, SoftmaxOp) or isinstance(op, RowReduceOp) and op.fn == "max":
            x = op.operands[0]
        if x is not None and all(x is not y for y in out):
            out.append(x)
    return out


def _same(root: Graph, a: Expr | None, b: Expr | None) -> bool:
    """Equal as written, or equal values once the Params are bound (`128` and `BM = 128`)."""
    if str(a) == str(b):
        return True
    if a is None or b is None:
        return False
    env = {k: v for k, v in root.params.items() if isinstance(v, int) and not isinstance(v, bool)}
    try:
        return eval_expr(a, env) == eval_expr(b, env)
    except ExprError:
        return False


def _refuse_stores_elsewhere(ctx: PassContext, root: Graph) -> set[int]:
    """A store writes the rows of the load its rows come from, or is refused. A kernel zero-fills what it
    loads, so rows a load leaves absent (past the tensor's end, or before its start when counted from the
    end) exist in the kernel; they are invisible only when the store writes those same positions, where
    the absent ones fall outside the stored tensor. Returns the loads (ids) whose stores were refused."""
    refused: set[int] = set()
    for region, op in root.walk():
        if not (isinstance(op, CopyOp) and op.dst_space == "global" and op.tile):
            continue
        rows = row_source(root, op.operands[0])
        if rows is None:
            continue
        alloc = global_allocation(region, op.operands[1])
        extent = alloc.shape[0] if alloc is not None and alloc.shape else None
        coord = dict(op.coord).get("L", Const(0))
        if (_same(root, coord, rows.coord) and _same(root, op.tile[0], rows.tile) and op.from_end == rows.from_end
                and _same(root, extent, rows.extent)):
            continue

        def place(c, t, e, end) -> str:
            return f"[L = {c}{' from end' if end else ''}] of {t}-row tiles over {e} rows"
        ctx.error(f"'{op.operands[1].base}' is stored at {place(coord, op.tile[0], extent, op.from_end)}, but its "
                  f"rows come from '{rows.copy.operands[0].base}' loaded at "
                  f"{place(rows.coord, rows.tile, rows.extent, rows.from_end)}: rows that load leaves absent would "
                  "be stored; store at the coordinate, tile height and length the rows are loaded with", op.loc)
        refused.add(id(rows.copy))
    return refused


class _LoopMasks:
    def __init__(self, ctx: PassContext, root: Graph, region: Graph, loop: LoopOp, refused: set[int]):
        self.ctx, self.root, self.region, self.loop, self.refused = ctx, root, region, loop, refused
        assert loop.body is not None
        self.body = loop.body
        self.var = Var(loop.var)

    def run(self) -> None:
        for x in scores_of(self.body):
            rows, cols = origin(self.body, x, 0), origin(self.body, x, 1)
            if cols is None or cols.extent is None:
                continue  # no known key length: nothing can be past it
            walking = cols.coord == self.var
            self.bounds(x, rows, cols, walking)
            if walking:  # otherwise the causal mask stays as written: every trip
                for mask in self.causal_masks(x):
                    self.causal(mask, rows, cols)

    def causal_masks(self, x: Value) -> list[MaskOp]:
        """Causal masks whose output is the scores themselves (through other masks only)."""
        found = []
        op = self.body.producer(x)
        while isinstance(op, MaskOp) and any(op is o for o in self.body.ops()):
            if op.kind == "causal" and not op.from_iteration:
                found.append(op)
            op = self.body.producer(op.operands[0])
        return found

    # ------------------------------------------------------------ bounds
    def bounds(self, x: Value, rows: Origin | None, cols: Origin, walking: bool = True) -> None:
        """Mask scores past the key length: from the trip whose tile crosses it when the tile walks
        with the loop, in every trip when it does not (a tile at a fixed coordinate)."""
        limit = cols.extent
        assert limit is not None
        switched = self.zero_fill(rows, limit, cols.coord)
        prod = self.body.producer(x)
        if isinstance(prod, MaskOp) and prod.kind == "bounds":
            return
        users = [u for u in self.body.ops() if any(v is x for v in u.operands)]
        loc = users[0].loc  # scores always have a reader: the softmax or its row max
        out = Value(fresh_value_name(self.root, x.base), x.type, x.base)
        first = ((self.loop.var, BinOp("/", limit, cols.tile)),) if walking else ()
        mask = MaskOp((out,), (x,), kind="bounds", limit=limit, from_iteration=first, loc=loc)
        self.body.insert_before(users[0], mask)  # right where the exp2 / row max reads the scores
        self.body.replace_all_uses(x, out, skip=mask)
        when = f"from trip {self.loop.var} = {limit} / {cols.tile} on" if walking else "in every trip"
        self.ctx.remark(f"bounds: {', '.join(switched) or 'the loads'} zero-fill past the end; scores at "
                        f"columns >= {limit} are masked explicitly, {when}", loc)

    def zero_fill(self, rows: Origin | None, limit: Expr, coord: Expr | None = None) -> list[str]:
        """Loads walking with the loop over a tensor of length `limit`, and the query tile."""
        switched = []
        for op in self.body.ops():
            if isinstance(op, CopyOp) and op.src_space == "global" and op.oob == "absent":
                axes = (origin(self.body, op.result, axis) for axis in (0, 1))
                walk = self.var if coord is None else coord
                if any(o is not None and o.coord == walk and o.extent == limit for o in axes):
                    self.body.replace(op, replace(op, oob="zero"))
                    switched.append(op.operands[0].base)
        if rows is not None and rows.copy.oob == "absent":
            home = next((r for r, o in self.root.walk() if o is rows.copy), None)
            if home is not None and id(rows.copy) not in self.refused:
                home.replace(rows.copy, replace(rows.copy, oob="zero"))
                switched.append(rows.copy.operands[0].base)
        return switched

    # ------------------------------------------------------------ causal
    def causal(self, mask: MaskOp, rows: Origin | None, cols: Origin) -> None:
        if rows is None:
            self.ctx.remark("causal mask left as is: the scores' rows do not come from a tiled load", mask.loc)
            return
        shift = _shift(mask.alignment)
        first = BinOp("/", _add(_add(rows.start, shift), Const(1)), cols.tile)
        placed = replace(mask, from_iteration=((self.loop.var, first),))
        self.body.replace(mask, placed)
        msg = f"causal ({mask.alignment}): masked only from trip {self.loop.var} = {first}"
        if any(isinstance(o, SoftmaxOp) for o in self.body.ops()):
            self.ctx.remark(msg + "; loop bound kept (run online-softmax first to cut it)", mask.loc)
            return
        why = masked_trip_changes(self.loop, lambda m: m is placed)
        if why:
            self.ctx.remark(msg + f"; loop bound kept: {why}", mask.loc)
            return
        cut = _cdiv(_add(rows.end, shift), cols.tile)
        assert self.loop.stop is not None
        new_loop = replace(self.loop, stop=Call("min", (self.loop.stop, cut)))
        self.region.replace(self.loop, new_loop)
        self.loop = new_loop
        self.ctx.remark(msg + f"; loop '{self.loop.var}' stops at the diagonal, {cut}", mask.loc)
