"""When a stale running max is exact: the precondition of `lazy-rescale`, checked on the TL graph.

`lazy-rescale` lets the online softmax keep a running max m that lags the true one by up to 2^8
after exp2. Every trip's P, the running sum l and each rescaled accumulator O then carry the same
unknown positive factor c per row, so the program computes the right thing only if

- P reaches its GEMM unchanged but for casts and register copies (an op on P between the softmax
  and P·V would see c·P; Multiply P by 1000 would also overflow fp16 once c reaches 256),
- after the loop, every rescaled accumulator is used only as `O / l` with the softmax's own sum,
  and the sum only as such a divisor (c cancels in the ratio and nowhere else), and
- the running max is not read after the loop (it is the stale m, not the row max).

`stale_max_blocker` returns why a program breaks one of these (the lazy-rescale pass then leaves the
kernel as it is and says so in the schedule notes), or None when every online softmax keeps them.
"""
from __future__ import annotations

from tlc.ir.graph import Graph
from tlc.ir.ops import CopyOp, ElementwiseOp, GemmOp, LoopOp, ReshapeOp, RowReduceOp, ScaledExpOp
from tlc.ir.types import Value
from tlc.passes.tile_origin import all_users


def stale_max_blocker(graph: Graph) -> str | None:
    """Why a stale running max would change what `graph` computes, or None when it cannot."""
    for region, loop in graph.walk():
        if isinstance(loop, LoopOp) and loop.body is not None:
            why = _loop_blocker(graph, loop)
            if why:
                return why
    return None


def _loop_blocker(root: Graph, loop: LoopOp) -> str | None:
    body = loop.body
    assert body is not None
    carried = {a.uid: i for i, a in enumerate(loop.args[1:])}
    for alpha_op in body.ops():
        if not (isinstance(alpha_op, ScaledExpOp) and alpha_op.operands[0].uid in carried):
            continue  # the online softmax's rescale factor exp2(m_old - m_new) reads the carried max
        m_old, m_new = alpha_op.operands[0], alpha_op.operands[1]
        alpha = alpha_op.results[0]
        if all_users(root, loop.results[carried[m_old.uid]]):
            return "the program reads the softmax's running max after the loop"
        scaled = []
        for u in body.users(alpha):
            other = next((o for o in u.operands if o is not alpha), None)
            if not (isinstance(u, ElementwiseOp) and u.fn == "mul" and other is not None and other.uid in carried):
                return f"the rescale factor reaches a '{u.mnemonic}' other than a rescale of a carried value"
            scaled.append(carried[other.uid])
        sums = [i for i in scaled if not _feeds_gemm(body, loop.args[1 + i])]
        accs = [i for i in scaled if i not in sums]
        for p_op in body.ops():
            if isinstance(p_op, ScaledExpOp) and p_op is not alpha_op and p_op.operands[1] is m_new:
                why = _p_reaches_gemm_plainly(body, p_op.results[0])
                if why:
                    return why
        if len(sums) != 1:
            return "the softmax's running sum is not one carried value"
        l_res = loop.results[sums[0]]
        acc_res = {loop.results[i].uid for i in accs}
        for i in accs:
            users = all_users(root, loop.results[i])
            if not all(isinstance(u, ElementwiseOp) and u.fn == "div" and u.operands[0] is loop.results[i]
                       and u.operands[1] is l_res for u in users):
                return (f"'{loop.results[i].base}' is used after the loop other than divided by the softmax's "
                        f"sum '{l_res.base}'")
        for u in all_users(root, l_res):
            if not (isinstance(u, ElementwiseOp) and u.fn == "div" and u.operands[1] is l_res
                    and u.operands[0].uid in acc_res):
                return f"the softmax's sum '{l_res.base}' is used after the loop other than as O's divisor"
    return None


def _feeds_gemm(body: Graph, v: Value) -> bool:
    """Whether the carried value `v` is (after its rescale) an accumulator of a GEMM in the body."""
    return any(isinstance(u, GemmOp) and u.accumulate and u.operands[2] is x
               for x, u in body.users_from(v, lambda u: isinstance(u, ElementwiseOp) and u.fn == "mul"))


def _p_reaches_gemm_plainly(body: Graph, p: Value) -> str | None:
    for _, u in body.users_from(p, lambda u: isinstance(u, (ReshapeOp, CopyOp))):
        if isinstance(u, (ReshapeOp, CopyOp)) or isinstance(u, RowReduceOp) and u.fn == "sum" or isinstance(u, GemmOp):
            continue
        return f"the softmax result '{p.base}' passes through a '{u.mnemonic}' before its GEMM"
    return None
