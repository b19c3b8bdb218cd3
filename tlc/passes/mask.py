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
A predicate mask (`Compute Mask S where …`) whose terms bound the keys each row sees
(tlc/expr/key_window.py) classifies each key tile of the query tile: empty (every score masked: the
loop's start and stop leave it out, under the same condition as the causal cut), full (no score
masked: the mask is skipped, `from_iteration` / `until_iteration`) or partial (masked per element).

    for n = 0:seqlen_k / BN                        loop(…) {start = `max(0, floor_div(max(block_idx * BM - Window, 0), BN))`,
      Compute Mask S where kv_idx > q_idx               stop = `min(seqlen_k / BN, cdiv(max(min(…), 0), BN))`}
        || kv_idx < q_idx - Window                  mask(%S) {kind = predicate, from_iteration = [n = …], until_iteration = [n = …]}
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from tlc.expr import BinOp, Call, Const, Expr, ExprError, Var, eval_expr, floor_divisions
from tlc.ir.graph import Graph
from tlc.ir.ops import CopyOp, ElementwiseOp, LoopOp, MaskOp, RowReduceOp, SoftmaxOp
from tlc.ir.types import Value
from tlc.passes.base import Pass, PassContext
from tlc.expr.key_window import KeyWindow, key_window, unread_terms
from tlc.passes.masked_trips import masked_trip_changes
from tlc.frontend.names import BUILTINS
from tlc.names import fresh_value_name
from tlc.passes.tile_origin import Origin, origin, row_origins, row_source
from tlc.passes.verify_final import global_allocation


@dataclass(frozen=True)
class MaskPass(Pass):
    name: ClassVar[str] = "mask"

    def apply(self, ctx: PassContext, graph: Graph) -> None:
        _refuse_masks_no_softmax_reads(ctx, graph)
        refused = _refuse_stores_elsewhere(ctx, graph)
        for region, op in list(graph.walk()):
            if isinstance(op, LoopOp) and op.body is not None:
                _LoopMasks(ctx, graph, region, op, refused).run()


def _add(a: Expr, b: Expr) -> Expr:
    return a if b == Const(0) else BinOp("+", a, b)


def _shift(alignment: str) -> Expr:
    """Columns a query row sees beyond its own index (LANGUAGE.md, Compute Mask)."""
    return BinOp("-", Var("seqlen_k"), Var("seqlen_q")) if alignment == "bottom_right" else Const(0)


def _bounded_by(e: Expr, fn: str, bound: Expr) -> bool:
    """`e` is `fn(…, bound)`, directly or through nested `fn`s: the bound is already applied."""
    while isinstance(e, Call) and e.fn == fn:
        if bound in e.args:
            return True
        e = e.args[0]
    return False


def _first_tile_reaching_past(key: Expr, tile: Expr) -> Expr:
    """The first key tile that reaches past key `key` (0 when key < 0): floor((key + 1) / tile), spelled
    floor_div(max(key, -1) + 1 - tile, tile) + 1 so that no int overflows, even for key = 2^31 − 1 (a bound
    read from a tensor Input may hold such a sentinel)."""
    shifted = BinOp("-", BinOp("+", Call("max", (key, Const(-1))), Const(1)), tile)
    return BinOp("+", Call("floor_div", (shifted, tile)), Const(1))


def _first_tile_wholly_past(key: Expr, tile: Expr) -> Expr:
    """The first key tile all of whose keys lie past key `key` (0 when key < 0): cdiv(key + 1, tile), spelled
    floor_div(max(key, -1), tile) + 1 so that no int overflows."""
    return BinOp("+", Call("floor_div", (Call("max", (key, Const(-1))), tile)), Const(1))


def _non_negative(e: Expr, params) -> bool:
    """A proof that `e` is >= 0 at run time: numbers, non-negative integer Params, the built-in indices, and
    sums, products, divisions, min and max of such (max of anything with such); False: not proven."""
    if isinstance(e, Const):
        return not isinstance(e.value, bool) and e.value >= 0
    if isinstance(e, Var):
        value = params.get(e.name)
        return e.name in BUILTINS or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)
    if isinstance(e, BinOp) and e.op in ("+", "*", "/"):
        return _non_negative(e.lhs, params) and _non_negative(e.rhs, params)
    if isinstance(e, Call) and e.fn == "max":
        return any(_non_negative(a, params) for a in e.args)
    if isinstance(e, Call) and e.fn in ("min", "cdiv", "floor_div"):
        return all(_non_negative(a, params) for a in e.args)
    return False


def _at_least_0(e: Expr) -> Expr:
    """A key position clamped to the first key: a bound before it counts tiles from 0."""
    return Call("max", (e, Const(0)))


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


def _refuse_masks_no_softmax_reads(ctx: PassContext, root: Graph) -> None:
    """A mask gives scores no weight by setting them to −∞ before a softmax (or its row max) reads them. One no
    softmax reads, through elementwise ops and other masks (`Compute Mask P` on the probabilities), would send
    −∞ into the next GEMM, and the positions past a tensor's end, which the kernel loads as zeros where the
    program has none, would turn into −∞ · 0 = NaN there: refused at its line."""
    for region, op in root.walk():
        if not isinstance(op, MaskOp):
            continue
        reads = [u for _, u in region.users_from(op.result, lambda u: isinstance(u, (MaskOp, ElementwiseOp)))]
        if any(isinstance(u, SoftmaxOp) or isinstance(u, RowReduceOp) and u.fn == "max" for u in reads):
            continue
        ctx.error(f"'{op.operands[0].base}' is masked, but no softmax reads it: a mask sets scores to −∞ so "
                  "that the softmax gives them no weight; mask the scores before 'Compute Softmax' (to drop "
                  "probabilities, multiply them by 0)", op.loc)


def _place(c, t, e, end) -> str:
    return f"[L = {c}{' from end' if end else ''}] of {t}-row tiles over {e} rows"


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
        alloc = global_allocation(region, op.operands[1])
        if rows is None and alloc is not None and len(alloc.shape) == 1:
            ctx.error(f"cannot tell which rows the row vector '{op.operands[0].base}' holds (no single load its rows "
                      f"come from), so where '{op.operands[1].base}' is stored cannot be checked; compute it from "
                      "the softmax of scores whose rows come from one load", op.loc)
            continue
        if rows is None:
            found = row_origins(root, op.operands[0])
            if found:   # loads of different rows meet (`Add X, Z` of tiles loaded at two coordinates)
                a, b = found[0], next(o for o in found if o.copy is not found[0].copy)
                ctx.error(f"the rows of '{op.operands[0].base}' come from loads of different rows: "
                          f"'{a.copy.operands[0].base}' at {_place(a.coord, a.tile, a.extent, a.from_end)} and "
                          f"'{b.copy.operands[0].base}' at {_place(b.coord, b.tile, b.extent, b.from_end)}, so where "
                          f"'{op.operands[1].base}' is stored cannot be checked; combine tiles loaded at the same "
                          "coordinate, tile height and length", op.loc)
                refused.add(id(a.copy))
            continue
        extent = alloc.shape[0] if alloc is not None and alloc.shape else None
        coord = dict(op.coord).get("L", Const(0))
        if (_same(root, coord, rows.coord) and _same(root, op.tile[0], rows.tile) and op.from_end == rows.from_end
                and _same(root, extent, rows.extent)):
            continue
        ctx.error(f"'{op.operands[1].base}' is stored at {_place(coord, op.tile[0], extent, op.from_end)}, but its "
                  f"rows come from '{rows.copy.operands[0].base}' loaded at "
                  f"{_place(rows.coord, rows.tile, rows.extent, rows.from_end)}: rows that load leaves absent would "
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
            if walking and not cols.from_end:  # otherwise the masks stay as written: every trip
                for mask in self.masks_of(x, "causal"):
                    self.causal(mask, rows, cols)
                for mask in self.masks_of(x, "predicate"):
                    self.predicate(mask, rows, cols)

    def masks_of(self, x: Value, kind: str) -> list[MaskOp]:
        """Masks of `kind` not placed yet whose output is the scores themselves (through other masks only)."""
        found = []
        op = self.body.producer(x)
        while isinstance(op, MaskOp) and any(op is o for o in self.body.ops()):
            if op.kind == kind and not op.from_iteration and not op.until_iteration:
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
        if walking and not cols.from_end:
            self.start_at_the_first_tile(mask)

    def start_at_the_first_tile(self, absent: MaskOp) -> None:
        """A trip before tile 0 holds keys at negative positions: absent in the program, but read from before the
        tensor by a kernel's loads. When the loop's start is not provably >= 0 it becomes max(start, 0), exact when
        a trip whose every score is absent (as masked) leaves the carried values as they were; else refused."""
        start = self.loop.start if self.loop.start is not None else Const(0)
        if _non_negative(start, self.root.params):
            return
        why = masked_trip_changes(self.loop, lambda m: m is absent) if not any(
            isinstance(o, SoftmaxOp) for o in self.body.ops()) else "its softmax is not online"
        if why:
            self.ctx.error(f"loop '{self.loop.var}' may start before the first key tile ('{start}' is not provably "
                           f">= 0), where every key is absent, but {why}: start it at max({start}, 0)", self.loop.loc)
            return
        new_loop = replace(self.loop, start=Call("max", (start, Const(0))))
        self.region.replace(self.loop, new_loop)
        self.loop = new_loop
        self.ctx.remark(f"loop '{self.loop.var}' starts at max({start}, 0): the trips before the first key tile "
                        "hold no key", self.loop.loc)

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

    # ------------------------------------------------------------ predicate
    def predicate(self, mask: MaskOp, rows: Origin | None, cols: Origin) -> None:
        """Classify the key tiles of the query tile by the keys the predicate leaves its rows
        (tlc/expr/key_window.py): the mask applies only in partial trips, and the loop runs only from
        the first to the last trip that is not empty."""
        assert mask.predicate is not None
        floats = {n for n, k in self.root.inputs.items() if k != "int"} | {
            n for n, v in self.root.params.items() if isinstance(v, float)} | {
            n for n, t in self.root.tensor_inputs.items() if t.kind == "float"}
        window = key_window(mask.predicate, floats)
        if rows is None or window is None:
            why = "the scores' rows do not come from a tiled load" if rows is None else \
                "no term bounds the keys a row sees (" + "; ".join(unread_terms(mask.predicate, floats)) + ")"
            self.ctx.remark(f"predicate mask in every trip: {why}", mask.loc)
            return
        var, tile = self.loop.var, cols.tile
        q0, q_last = rows.start, BinOp("-", rows.end, Const(1))
        placed, classes = mask, []
        if window.exact:   # full tiles: every row sees the whole key tile
            late = window.last_key(q0)
            early = window.first_key(q_last)
            placed = replace(mask, from_iteration=() if late is None else ((var, _first_tile_reaching_past(late, tile)),),
                             until_iteration=() if early is None else (
                                 (var, Call("cdiv", (_at_least_0(early), tile))),))
            self.body.replace(mask, placed)
            classes.append(f"partial where {placed.trips()}, full otherwise")
        else:
            classes.append("partial in every trip it runs (not every term bounds the keys: "
                           + "; ".join(window.left_out) + ")")
        cut = self.cut_by_window(placed, window, q0, q_last, tile)
        self.ctx.remark(f"predicate mask on key tiles of {var}: " + "; ".join(classes + [cut]), mask.loc)

    def cut_by_window(self, mask: MaskOp, window: KeyWindow, q0: Expr, q_last: Expr, tile: Expr) -> str:
        """Start the loop at the first key tile a row of the query tile may see and stop it after the last,
        when a trip with every score masked leaves the carried values as they were."""
        if any(isinstance(o, SoftmaxOp) for o in self.body.ops()):
            return "empty trips kept (run online-softmax first to cut them)"
        why = masked_trip_changes(self.loop, lambda m: m is mask)
        if why:
            return f"empty trips kept: {why}"
        first, last = window.first_key(q0), window.last_key(q_last)
        start, stop = self.loop.start or Const(0), self.loop.stop
        assert stop is not None
        said = []
        if first is not None:
            skip = Call("floor_div", (_at_least_0(first), tile))
            if not _bounded_by(start, "max", skip):   # a second run of the pass finds it there
                start = Call("max", (start, skip))
            said.append(f"starts at {skip}")
        if last is not None:
            end = floor_divisions(_first_tile_wholly_past(last, tile))
            if not _bounded_by(stop, "min", end):
                stop = Call("min", (stop, end))
            said.append(f"stops at {end}")
        new_loop = replace(self.loop, start=start, stop=stop)
        self.region.replace(self.loop, new_loop)
        self.loop = new_loop
        return f"empty trips cut: loop '{self.loop.var}' " + " and ".join(said)

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
        cut = floor_divisions(_cdiv(_add(rows.end, shift), cols.tile))
        assert self.loop.stop is not None
        new_loop = replace(self.loop, stop=Call("min", (self.loop.stop, cut)))
        self.region.replace(self.loop, new_loop)
        self.loop = new_loop
        self.ctx.remark(msg + f"; loop '{self.loop.var}' stops at the diagonal, {cut}", mask.loc)
