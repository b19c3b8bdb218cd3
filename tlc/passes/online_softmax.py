"""`online-softmax`: a Softmax over a loop's whole domain → FlashAttention's online form,
explicit in the IR (runs after insert-reshape, before mask).

    before                                   after
    loop(%O) ^(%n, %O.2) [                   %m.0 = full() {value = -inf}; %l.0 = full() {value = 0.0}
      %S.1 = mul(%S, %scale)                 loop(%O, %m.0, %l.0) ^(%n, %O.2, %m.2, %l.2) [
      %P, %m, %l = softmax(%S.1)               %c = scalar() {expr = `scale * 1.4426950408889634`}
      %O.3 = gemm(%P.1, %V, %O.2)              %m.3 = row_reduce(%S) {fn = max}
      yield %O.3, %m, %l                       %m = max(%m.2, %m.3); %alpha = scaled_exp2(%m.2, %m, %c)
    ]                                          %P = scaled_exp2(%S, %m, %c); %l = add(mul(%l.2, %alpha), row_sum(%P))
    %O.5 = div(%O.4, %l.1)                     %O.3 = gemm(%P.1, %V, mul(%O.2, %alpha))  ...

The scale is folded into exp2 only through masks, only when positive (a softmax scale: a
runtime float input or a positive constant), since max(s·S) = s·max(S) needs s > 0, and only
when the program never reads the row max it named (folded, m would be the unscaled max).
Outside a loop the softmax becomes the plain per-tile form.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar

from tlc.expr import BinOp, Const, Var
from tlc.ir.graph import Graph
from tlc.ir.ops import (CopyOp, ElementwiseOp, FullOp, GemmOp, LoopOp, MaskOp, Op, ReshapeOp, RowReduceOp,
                        ScalarOp, ScaledExpOp, SoftmaxOp)
from tlc.ir.types import SCALAR, TileType, Value
from tlc.passes.base import Pass, PassContext
from tlc.passes.tile_origin import all_users, extent, fresh_name

LOG2E = math.log2(math.e)


@dataclass(frozen=True)
class OnlineSoftmaxPass(Pass):
    name: ClassVar[str] = "online-softmax"

    def apply(self, ctx: PassContext, graph: Graph) -> None:
        for region, op in list(graph.walk()):
            if isinstance(op, SoftmaxOp):
                _Rewrite(ctx, graph, region, op).run()


def _find(region: Graph, result: Value) -> Op:
    return next(op for op in region.ops() if any(r is result for r in op.results))


def _enclosing_loop(region: Graph) -> LoopOp | None:
    parent = region.parent
    if parent is None:
        return None
    return next(op for op in parent.ops() if isinstance(op, LoopOp) and op.body is region)


class _Rewrite:
    def __init__(self, ctx: PassContext, root: Graph, region: Graph, sm: SoftmaxOp):
        self.ctx, self.root, self.region, self.sm = ctx, root, region, sm
        self.taken: set[str] = set()

    def value(self, base: str, ty: TileType) -> Value:
        return Value(fresh_name(self.root, base, self.taken), ty, base)

    def add(self, op: Op) -> Value:
        self.region.insert_before(self.sm, op)
        return op.result

    def run(self) -> None:
        c = self.fold_scale()
        self.sm = _find(self.region, self.sm.results[0])  # folding may have rewired it
        x = self.sm.operands[0]
        loop = _enclosing_loop(self.region)
        rows = extent(self.region, x, 0) or self.accumulator_rows()
        self.vec = TileType("register", None if rows is None else (rows,), "fp32")
        if loop is None:
            self.per_tile(x, c)
        elif rows is None:
            self.ctx.error("cannot tell how many rows the softmax's scores have (the running max holds one "
                           "value per row); give its input a tile shape, e.g. 'Copy Q (BM, D) …'", self.sm.loc)
        else:
            self.online(loop, x, c)

    def accumulator_rows(self):
        """Rows of the first accumulator P reaches (`Allocate O in register (BM, D)`)."""
        frontier = [self.sm.results[0]]
        while frontier:
            for u in self.region.users(frontier.pop()):
                if isinstance(u, GemmOp) and u.accumulate:
                    return extent(self.region, u.operands[2], 0)
                if isinstance(u, (ReshapeOp, ElementwiseOp, CopyOp, MaskOp)):
                    frontier.append(u.result)
        return None

    # ------------------------------------------------------------ scale folding
    def max_is_read(self) -> bool:
        """Whether the program reads the softmax's row max (`with max m`) anywhere, in the loop or
        after it: folding the scale would make that m the unscaled max."""
        m = self.sm.results[1]
        for u in all_users(self.root, m):
            if not isinstance(u, LoopOp):
                return True
            if any(all_users(self.root, r) for y, r in zip(u.yields, u.results) if y is m):
                return True
        return False

    def fold_scale(self) -> Value:
        """`mul(S, s)` → masks → softmax becomes masks(S) → softmax with exp2 scale s·log2 e."""
        if self.max_is_read():  # m must stay the max of the scaled scores the program names
            return self.add(ScalarOp((self.value("log2e", SCALAR),), (), expr=Const(LOG2E), loc=self.sm.loc))
        consumer: Op = self.sm
        v = self.sm.operands[0]
        while True:
            op = self.region.producer(v)
            if op is None or all_users(self.root, v) != [consumer] or not any(o is op for o in self.region.ops()):
                break
            if isinstance(op, MaskOp):
                consumer, v = op, op.operands[0]
                continue
            scalar, tile = self.positive_scalar(op)
            if scalar is None or tile is None:
                break
            self.region.replace_all_uses(v, tile)
            self.region.erase(op)
            folded = ScalarOp((self.value(f"{scalar.result.base}_log2e", SCALAR),), (),
                              expr=BinOp("*", scalar.expr, Const(LOG2E)), loc=scalar.loc)
            home = next(r for r, o in self.root.walk() if o is scalar)
            if all_users(self.root, scalar.result):
                home.insert_after(scalar, folded)
            else:
                home.replace(scalar, folded)
            self.ctx.remark(f"folded the multiply by '{scalar.expr}' into the softmax's exp2 as "
                            f"{scalar.expr} · log2(e)", op.loc)
            return folded.result
        return self.add(ScalarOp((self.value("log2e", SCALAR),), (), expr=Const(LOG2E), loc=self.sm.loc))

    def positive_scalar(self, op: Op) -> tuple[ScalarOp | None, Value | None]:
        """(the scalar, the tile) of `mul(tile, s)` when s is known positive: a positive
        constant or Param, or a float runtime Input (a softmax scale, positive by contract)."""
        if not (isinstance(op, ElementwiseOp) and op.fn == "mul"):
            return None, None
        for i, s in enumerate(op.operands):
            prod, e = self.region.producer(s), None
            if isinstance(prod, ScalarOp):
                e = prod.expr
            value = self.root.params.get(e.name) if isinstance(e, Var) else e.value if isinstance(e, Const) else None
            positive = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
            if positive or isinstance(e, Var) and self.root.inputs.get(e.name) == "float":
                return prod, op.operands[1 - i]
        return None, None

    # ------------------------------------------------------------ rewrites
    def per_tile(self, x: Value, c: Value) -> None:
        p, m, l = self.sm.results
        m.type = l.type = self.vec
        loc = self.sm.loc
        self.add(RowReduceOp((m,), (x,), fn="max", loc=loc))
        e = p if not self.sm.normalized else self.value(p.base, p.type)
        self.add(ScaledExpOp((e,), (x, m, c), loc=loc))
        self.add(RowReduceOp((l,), (e,), fn="sum", loc=loc))
        if self.sm.normalized:
            self.add(ElementwiseOp((p,), (e, l), fn="div", loc=loc))
        self.region.erase(self.sm)

    def online(self, loop: LoopOp, x: Value, c: Value) -> None:
        p, m, l = self.sm.results
        loc, parent = self.sm.loc, self.region.parent
        assert parent is not None
        for stat in (m, l):
            inside = [o for o in all_users(self.root, stat) if o is not loop and any(o is b for b in self.region.ops())]
            if inside:
                self.ctx.error(f"'{stat.base}' is used inside the loop, where only the running value exists; "
                               "use it after the loop", inside[0].loc)
                return
        m0 = parent.insert_before(loop, FullOp((self.value(m.base, self.vec),), (), value=-math.inf,
                                               shape=self.vec.shape or (), loc=loc)).result
        l0 = parent.insert_before(loop, FullOp((self.value(l.base, self.vec),), (), value=0.0,
                                               shape=self.vec.shape or (), loc=loc)).result
        m_old, l_old = self.value(m.base, self.vec), self.value(l.base, self.vec)
        m.type = l.type = self.vec
        m_tile = self.add(RowReduceOp((self.value(m.base, self.vec),), (x,), fn="max", loc=loc))
        self.add(ElementwiseOp((m,), (m_old, m_tile), fn="max", loc=loc))
        alpha = self.add(ScaledExpOp((self.value("alpha", self.vec),), (m_old, m, c), loc=loc))
        self.add(ScaledExpOp((p,), (x, m, c), loc=loc))
        row_sum = self.add(RowReduceOp((self.value(l.base, self.vec),), (p,), fn="sum", loc=loc))
        l_scaled = self.add(ElementwiseOp((self.value(l.base, self.vec),), (l_old, alpha), fn="mul", loc=loc))
        self.add(ElementwiseOp((l,), (l_scaled, row_sum), fn="add", loc=loc))
        self.region.erase(self.sm)
        rescaled = self.rescale_accumulators(loop, p, alpha)
        loop = self.carry_stats(loop, parent, (m0, l0), (m_old, l_old))
        l_res = loop.results[len(loop.operands) - 1]
        names = ", ".join(f"'{loop.results[i].base}'" for i in rescaled)
        self.ctx.remark(f"online softmax: running max '{m.base}' and sum '{l.base}' carried through loop "
                        f"'{loop.var}', {names or 'no accumulator'} rescaled each trip", loc)
        if self.sm.normalized:
            for i in rescaled:
                res = loop.results[i]
                out = self.value(res.base, res.type)
                div = parent.insert_after(loop, ElementwiseOp((out,), (res, l_res), fn="div", loc=loc))
                self.root.replace_all_uses(res, out, skip=div)
                self.ctx.remark(f"added the final division '{res.base}' / '{l.base}' after the loop: the "
                                "softmax normalises over the whole loop", loc)

    def rescale_accumulators(self, loop: LoopOp, p: Value, alpha: Value) -> list[int]:
        """Every accumulator P reaches (through Reshape, casts, GEMM chains) is multiplied by
        alpha before the trip's GEMM adds to it. Returns the carried indices rescaled."""
        carried = {a.uid: i for i, a in enumerate(loop.args[1:])}
        done: list[int] = []
        frontier, seen = [p], set()
        while frontier:
            v = frontier.pop()
            if v.uid in seen:
                continue
            seen.add(v.uid)
            if any(y is v for y in loop.yields):
                self.ctx.error("the softmax result leaves the loop unaccumulated; the online form can only "
                               "rescale GEMM accumulators", self.sm.loc)
            for u in self.region.users(v):
                if isinstance(u, RowReduceOp):
                    continue
                if isinstance(u, (ReshapeOp, ElementwiseOp, CopyOp, MaskOp)):
                    frontier.append(u.result)
                elif isinstance(u, GemmOp) and u.accumulate and v is not u.operands[2]:
                    self.rescale_chain(u, carried, alpha, done)
                else:
                    self.ctx.error(f"the softmax result reaches a '{u.mnemonic}' the online form cannot "
                                   "rescale; accumulate it with 'Compute GEMM P, V and accumulate O'", u.loc)
        return done

    def rescale_chain(self, gemm: GemmOp, carried: dict[int, int], alpha: Value, done: list[int]) -> None:
        """Follow `gemm`'s accumulator back through accumulating GEMMs to the loop-carried
        value and rescale it once, before the first GEMM that adds to it this trip."""
        acc = gemm.operands[2]
        while acc.uid not in carried:
            prev = self.region.producer(acc)
            if not (isinstance(prev, GemmOp) and prev.accumulate and any(prev is o for o in self.region.ops())):
                self.ctx.error(f"the softmax result is accumulated into '{acc.base}', which is not carried by "
                               "the loop; the online form cannot rescale it", gemm.loc)
                return
            gemm, acc = prev, prev.operands[2]
        if carried[acc.uid] in done:
            return
        scaled = self.value(acc.base, acc.type)
        self.region.insert_before(gemm, ElementwiseOp((scaled,), (acc, alpha), fn="mul", loc=gemm.loc))
        self.region.replace(gemm, replace(gemm, operands=(gemm.operands[0], gemm.operands[1], scaled)))
        done.append(carried[acc.uid])

    def carry_stats(self, loop: LoopOp, parent: Graph, inits: tuple[Value, Value],
                    args: tuple[Value, Value]) -> LoopOp:
        """The softmax's exported m and l become ordinary loop-carried results."""
        _, m, l = self.sm.results
        n = len(loop.operands)
        exports = {loop.yields[k].uid: loop.results[k] for k in range(n, len(loop.yields))}
        m_res = exports.get(m.uid) or self.value(m.base, self.vec)
        l_res = exports.get(l.uid) or self.value(l.base, self.vec)
        m_res.type = l_res.type = self.vec
        rest = [k for k in range(n, len(loop.yields)) if loop.yields[k] not in (m, l)]
        new = replace(loop, operands=loop.operands + inits, args=loop.args + args,
                      yields=loop.yields[:n] + (m, l) + tuple(loop.yields[k] for k in rest),
                      results=loop.results[:n] + (m_res, l_res) + tuple(loop.results[k] for k in rest))
        parent.replace(loop, new)
        return new
