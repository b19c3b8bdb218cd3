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
from tlc.ir.ops import (AllocateOp, CopyOp, ElementwiseOp, FullOp, GemmOp, LoopOp, MaskOp, Op, ReshapeOp, RowReduceOp,
                        ScalarOp, ScaledExpOp, SoftmaxOp)
from tlc.ir.types import SCALAR, TileType, Value
from tlc.passes.base import Pass, PassContext
from tlc.names import fresh_value_name
from tlc.passes.tile_origin import all_users, extent

LOG2E = math.log2(math.e)
_HOMOGENEOUS_UNARY = frozenset({"neg", "abs", "relu"})   # f(c·x) = c·f(x) for every c > 0
_TL_NAMES = {"add": "Add", "sub": "Subtract", "mul": "Multiply", "div": "Divide", "max": "Max", "min": "Min",
             "exp": "Exp", "exp2": "Exp2", "log": "Log", "tanh": "Tanh", "relu": "Relu", "neg": "Negate",
             "abs": "Abs", "sqrt": "Sqrt", "square": "Square"}


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
        return Value(fresh_value_name(self.root, base, self.taken), ty, base)

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
        alpha before the trip's GEMM adds to it. Returns the carried indices rescaled.

        Exact only when what reaches the GEMM scales with P: each trip's P is computed against
        the running max, so it is the domain's P times a positive factor, and the rescale by
        alpha fixes the accumulator only if f(c·P) = c·f(P). Any other op on the way is refused."""
        carried = {a.uid: i for i, a in enumerate(loop.args[1:])}
        derived = self.derived_from(p)
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
                    why = self.not_homogeneous(u, derived, carried)
                    if why:
                        self.ctx.error(why, u.loc)
                        return done
                    frontier.append(u.result)
                elif isinstance(u, GemmOp) and u.accumulate and v is not u.operands[2]:
                    if all(o.uid in derived for o in u.operands[:2]):
                        self.ctx.error(f"both operands of this GEMM are computed from the softmax result "
                                       f"'{p.base}', so it grows as P squared, which the online form's rescale "
                                       "cannot follow", u.loc)
                        return done
                    self.rescale_chain(u, carried, alpha, done)
                else:
                    self.ctx.error(f"the softmax result reaches a '{u.mnemonic}' the online form cannot "
                                   "rescale; accumulate it with 'Compute GEMM P, V and accumulate O'", u.loc)
        return done

    def derived_from(self, p: Value) -> set[int]:
        """Uids of `p` and the values in the loop body computed from it."""
        return {p.uid} | {r.uid for _, u in self.region.users_from(p, lambda u: True) for r in u.results}

    def not_homogeneous(self, op: Op, derived: set[int], carried: dict[int, int]) -> str | None:
        """Why `op` does not scale with its operands computed from P (None when it does)."""
        if not isinstance(op, ElementwiseOp):
            return None  # a Reshape (a cast), a register copy or a mask keep c·P as c·P
        fn, p = op.fn, self.sm.results[0].base
        mine = [o for o in op.operands if o.uid in derived]
        others = [o for o in op.operands if o.uid not in derived]
        name = _TL_NAMES.get(fn, fn)
        if any(self.reads_carried(o, carried) for o in others):
            return (f"'{name}' combines the softmax result '{p}' with a value carried through the loop, which the "
                    "online form rescales too; compute it from values loaded or defined in this trip")
        if fn in _HOMOGENEOUS_UNARY:
            return None
        if fn in ("add", "sub", "max", "min") and not others:
            return None
        if fn == "mul" and len(mine) == 1:
            return None
        if fn == "div" and op.operands[0].uid in derived and op.operands[1].uid not in derived:
            return None
        return (f"'{name}' on the softmax result '{p}' is not exact in the online form: each trip's P is taken "
                f"against the running max and rescaled later by exp(m_old - m_new), which commutes only with ops "
                f"that scale with P (Multiply or Divide by a value not computed from P, Negate, Abs, Relu, and "
                f"sums, differences, maxima and minima of such); apply '{name}' to the scores before the softmax "
                f"or to the result after the loop")

    def reads_carried(self, v: Value, carried: dict[int, int]) -> bool:
        """Whether `v` is computed (in this trip) from a loop-carried value."""
        return self.region.depends_on(v, set(carried))

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
        loop = _enclosing_loop(self.region)
        assert loop is not None
        why = self.init_not_zero(loop, carried[acc.uid]) or self.not_carried_plainly(loop, acc, carried)
        if why:
            self.ctx.error(why, gemm.loc)
            return
        scaled = self.value(acc.base, acc.type)
        self.region.insert_before(gemm, ElementwiseOp((scaled,), (acc, alpha), fn="mul", loc=gemm.loc))
        self.region.replace(gemm, replace(gemm, operands=(gemm.operands[0], gemm.operands[1], scaled)))
        done.append(carried[acc.uid])

    def init_not_zero(self, loop: LoopOp, index: int) -> str | None:
        """Why the accumulator may hold something before the loop (None when it is zeros): the
        online form rescales it by exp(m_old - m_new) from the first trip on, m_old = -inf, so a
        value from before the loop would be lost instead of added."""
        init = loop.operands[index]
        assert self.region.parent is not None
        prod = self.region.parent.producer(init)
        if isinstance(prod, AllocateOp) and prod.space == "register" or isinstance(prod, FullOp) and prod.value == 0:
            return None
        where = f" (line {prod.loc.line})" if prod is not None and prod.loc.line > 0 else ""
        return (f"the accumulator '{init.base}' holds a value from before the loop{where}: the online softmax "
                f"rescales what it accumulates by exp(m_old - m_new) from the first trip on, which would scale that "
                f"value away; start the loop from the zeros of 'Allocate {init.base} in register' and add the value "
                "after the loop")

    def not_carried_plainly(self, loop: LoopOp, acc: Value, carried: dict[int, int]) -> str | None:
        """Why the accumulator's trip does more than add to it (None when it only adds, or scales
        it with ops that commute with the rescale)."""
        derived = self.derived_from(acc)
        for op in self.region.ops():
            reads = [o for o in op.operands if o.uid in derived]
            if not reads or isinstance(op, (ReshapeOp, CopyOp)):
                continue
            if isinstance(op, GemmOp):
                if op.accumulate and op.operands[2].uid in derived and all(o.uid not in derived for o in op.operands[:2]):
                    continue
                return (f"'{acc.base}' is a GEMM operand in the loop; the online softmax rescales it every trip, "
                        "so only its accumulator role is exact")
            if isinstance(op, ElementwiseOp) and op.fn == "mul" and any(o.uid not in derived for o in op.operands):
                continue
            if isinstance(op, ElementwiseOp) and (op.fn in _HOMOGENEOUS_UNARY or op.fn == "div"
                                                  and op.operands[1].uid not in derived):
                continue
            if isinstance(op, ElementwiseOp) and op.fn in ("add", "sub", "max", "min") and len(reads) == 2:
                continue
            name = _TL_NAMES.get(getattr(op, "fn", ""), op.mnemonic)
            return (f"'{name}' on the accumulator '{acc.base}' inside the loop is not exact in the online form: "
                    "the accumulator is rescaled by exp(m_old - m_new) every trip, which commutes only with "
                    "Multiply, Divide by values not computed from it, Negate, Abs and Relu; move it after the loop")
        for i, y in enumerate(loop.yields[: len(loop.operands)]):
            if y.uid in derived and i != carried[acc.uid]:
                return f"'{acc.base}' flows into another carried value, which the online form does not rescale"
        return None

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
