"""`skip-masked-trips` (sm_90a, warp-specialised kernels with a causal or window mask and two or more consumer
warp groups): a warp group skips the GEMMs and the softmax of the trips its own rows mask entirely.

The `mask` pass bounds the KV loop by the tile's rows, but consumer warp group w owns rows
row0 + R·w … row0 + R·w + R − 1 of the tile (R = BM / groups = 64, the wgmma's M). The mask's key window
(tlc.expr.key_window, the reading the `mask` pass classifies tiles by: a causal mask's `kv_idx <= q_idx +
diag`, a predicate's bounds such as a sliding window's `q_idx - Window <= kv_idx <= q_idx`) gives the keys the
group's rows can see, the bounds being non-decreasing in the row:

    wg_last_key  = last key of the group's last row     (an upper bound: causal, a window's right edge)
    wg_first_key = first key of the group's first row   (a lower bound: a window's left edge)

so a trip whose keys col0 … col0 + BN − 1 (its mask's col0, whatever the program's K/V tile order) lie past
wg_last_key or before wg_first_key is all −inf for the group — on 192-row causal tiles (d = 64) the first
group's last trip, at S = 4096 three percent of all warp-group trips; on a sliding window a group's first or
last trip of a tile. A term the window leaves out of its bounds only masks more, so such a trip is masked
whatever it says. Such a trip adds nothing: its scores are masked, so the row max and sum are unchanged,
alpha is 1 and P is 0. The group keeps every synchronising op of the trip (the ring's waits and releases,
the ping-pong named barriers, the wgmma fences, commits and waits, empty commit groups included), so the
producer, the other groups and the next tile see the same protocol; it drops only

    the Q·Kᵀ wgmma of a trip               IfOp(sees, [G1]);  sees = col0 <= wg_last_key && col0 + BN - 1 >= wg_first_key
    the trip's softmax                     IfOp(sees, [tail]), IfOp(!sees, [its waits, releases])
    the P·V wgmma that reads the trip's P  IfOp(p_live, [G2]); p_live = sees after each softmax

`p_live` travels with P (overlap-gemms issues P·V of trip n − 1 in trip n, and the last after the loop).
Covered: the rotated trips overlap-gemms emits (its peeled first trip, the loops that hold the window
mask's guard, the last P·V), in any op list of the consumer (the persistent tile loop's too). The loop
before the first masked trip (split-masked-trips) is untouched: a trip no row of the tile masks is
skipped by no group. Another shape keeps its trips, with the reason in the schedule notes.

A wgmma under a branch costs: ptxas waits for the GEMMs around it (C7517, "wgmma.wait_group is
injected"), 0.4-2.3 % on the causal rows where little or nothing is skipped (d = 128, 256, MLA; windows
were not timed). So it
is off unless `Param SkipMaskedTrips = true`; `tlc.attention.tuning` sets it for the sm_90a d = 64 causal kernels
(192-row tiles), where the skipped trips outweigh that (H200, docs/hopper.md).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from tlc.kir import ops as K
from tlc.kir import ops_sm90 as H
from tlc.kir.expr import BinOp, Const, Expr, Var, free_names
from tlc.expr.key_window import QUERY, KeyWindow, key_window
from tlc.kir.transforms.base import Facts, KernelTransform, Notes
from tlc.kir.transforms.schedule import Schedule

LAST, FIRST, LIVE = "wg_last_key", "wg_first_key", "p_live"
_SYNC = (H.WgmmaOp, H.WgmmaCommitOp, H.WgmmaWaitOp, H.WgmmaArriveOp, H.WgmmaFenceOperandOp, H.MbarrierWaitOp,
         H.MbarrierArriveOp, H.NamedBarrierOp)
_PROTOCOL = (H.WgmmaWaitOp, H.MbarrierWaitOp, H.MbarrierArriveOp, H.NamedBarrierOp)


class Declined(Exception):
    """The kernel keeps its trips; the message says why."""


def _negate(cond: Expr) -> Expr:
    """`!cond` for a comparison or a conjunction of two."""
    flip = {"<=": ">", ">=": "<", "<": ">=", ">": "<="}
    if isinstance(cond, BinOp) and cond.op in flip:
        return BinOp(flip[cond.op], cond.lhs, cond.rhs)
    if isinstance(cond, BinOp) and cond.op == "&&":
        return BinOp("||", _negate(cond.lhs), _negate(cond.rhs))
    raise ValueError(f"cannot negate `{cond}`")


def _is_sync(op: K.Op) -> bool:
    """A wgmma/mbarrier/named-barrier op, or an IfOp holding only such ops (one thread's release)."""
    if isinstance(op, K.IfOp):
        return bool(op.body) and all(_is_sync(x) for x in op.body)
    return isinstance(op, _SYNC)


def window_of(mask: K.MaskOp) -> KeyWindow | None:
    """The keys each query row `q_idx` sees through `mask` (tlc.expr.key_window, the `mask` pass's reading of a
    predicate): a causal mask's `kv_idx <= q_idx + diag`, a predicate's bounds; None where it gives none (bounds,
    a document mask). A predicate term the window leaves out only masks more: a trip outside the window is
    masked for every row whatever those terms say."""
    if mask.causal:
        diag = BinOp("-", mask.sk, mask.sq) if mask.alignment == "bottom_right" else Const(0)
        return KeyWindow(lower=(), upper=(BinOp("+", Var(QUERY), diag),), exact=True)
    if mask.predicate is not None:
        return key_window(mask.predicate)
    return None


def _window_mask(ops) -> K.MaskOp | None:
    return next((x for op in ops for x in K.walk(op) if isinstance(x, K.MaskOp) and window_of(x) is not None), None)


def _mask_guard_at(body: list[K.Op]) -> int | None:
    """Index of the first op of `body` that holds the window's MaskOp (its `n >= E` guard)."""
    return next((i for i, op in enumerate(body) if _window_mask((op,)) is not None), None)


GROUP_ROWS = 64   # a consumer warp group's rows of the scores: the wgmma's M


class _Trips:
    def __init__(self, mask: K.MaskOp, group: str, keys: int) -> None:
        self.mask, self.scores, self.group, self.keys = mask, mask.target, group, keys
        self.window = window_of(mask)
        self.done = 0

    def last_key(self) -> Expr | None:
        """wg_last_key: the last key column this group's last row sees (None: the window has no upper bound).
        The window's bounds do not fall as the row grows, so the group's last row sees the furthest."""
        last = BinOp("+", self.mask.row0, BinOp("-", BinOp("*", Const(GROUP_ROWS), BinOp("+", Var(self.group),
                                                                                             Const(1))), Const(1)))
        return self.window.last_key(last)

    def first_key(self) -> Expr | None:
        """wg_first_key: the first key column this group's first row sees (None: no lower bound)."""
        first = BinOp("+", self.mask.row0, BinOp("*", Const(GROUP_ROWS), Var(self.group)))
        return self.window.first_key(first)

    def sees(self, col0: Expr) -> Expr:
        """Whether a trip whose keys start at `col0` holds a key some row of the group sees."""
        conds = []
        if self.last_key() is not None:
            conds.append(BinOp("<=", col0, Var(LAST)))
        if self.first_key() is not None:
            conds.append(BinOp(">=", BinOp("+", col0, Const(self.keys - 1)), Var(FIRST)))
        return conds[0] if len(conds) == 1 else BinOp("&&", conds[0], conds[1])

    def _other_mask(self, m: K.MaskOp) -> bool:
        """A window mask on another tensor, row origin, diagonal or predicate than the one the group's keys are
        taken from."""
        ref = self.mask
        return ((m.target, m.row0, m.sq, m.sk, m.alignment, m.causal, m.predicate)
                != (ref.target, ref.row0, ref.sq, ref.sk, ref.alignment, ref.causal, ref.predicate))

    def _gemms(self, body) -> tuple[int | None, int | None]:
        s = [i for i, op in enumerate(body) if isinstance(op, H.WgmmaOp) and op.acc == self.scores]
        o = [i for i, op in enumerate(body) if isinstance(op, H.WgmmaOp) and op.acc != self.scores]
        if len(s) > 1 or len(o) > 1:
            raise Declined("a trip issues more than one Q·Kᵀ or P·V wgmma")
        return (s[0] if s else None), (o[0] if o else None)

    def trip(self, body: tuple[K.Op, ...], loc) -> tuple[K.Op, ...]:
        """One rotated trip: G1 and the softmax under col0 <= wg_last_key, G2 under p_live."""
        body = list(body)
        i1, i2 = self._gemms(body)
        at = _mask_guard_at(body)
        if i1 is None or at is None or at < i1 or (i2 is not None and i2 > at):
            raise Declined("a masked trip is not G1, [G2 of the trip before], then the softmax (overlap-gemms off?)")
        masks = [x for op in body for x in K.walk(op) if isinstance(x, K.MaskOp) and window_of(x) is not None]
        col0 = masks[0].col0
        if any(self._other_mask(m) or m.col0 != col0 for m in masks):
            raise Declined("a trip's window masks differ in their tensor, origin, alignment or predicate")
        sees = self.sees(col0)
        k = 1 + max(i for i in range(at) if _is_sync(body[i]))
        head, tail = body[:k], body[k:]
        if free_names(col0) & {n for op in tail for x in K.walk(op) for n in x.defined_names()}:
            raise Declined("a trip's causal mask origin is computed inside its softmax")
        keep = [op for op in tail if _is_sync(op)]
        if any(isinstance(x, _PROTOCOL) for op in tail if not _is_sync(op) for x in K.walk(op)):
            raise Declined("the softmax of a trip holds a wait, release or barrier inside another op")
        if any(isinstance(x, H.WgmmaOp) for op in keep for x in K.walk(op)):
            raise Declined("a wgmma follows the softmax in a trip")
        head[i1] = K.IfOp(cond=sees, body=(head[i1],), loc=head[i1].loc)
        if i2 is not None:
            head[i2] = K.IfOp(cond=Var(LIVE), body=(head[i2],), loc=head[i2].loc)
        out = [*head, K.IfOp(cond=sees, body=tuple(tail), loc=loc)]
        if keep:
            out.append(K.IfOp(cond=_negate(sees), body=tuple(keep), loc=loc))
        out.append(K.CounterSetOp(counter=LIVE, value=sees, loc=loc))
        self.done += 1
        return tuple(out)

    def last_pv(self, body: tuple[K.Op, ...]) -> tuple[K.Op, ...]:
        i1, i2 = self._gemms(list(body))
        if i1 is not None or i2 is None:
            raise Declined("the op after the loops is not the last P·V alone")
        g2 = body[i2]
        return (*body[:i2], K.IfOp(cond=Var(LIVE), body=(g2,), loc=g2.loc), *body[i2 + 1:])

    def seq(self, ops: tuple[K.Op, ...]) -> tuple[K.Op, ...]:
        """Rewrite the trips found directly in `ops`, else look inside its loops (a persistent tile loop)."""
        trips = [i for i, op in enumerate(ops) if isinstance(op, (K.IfOp, K.ForOp))
                 and any(isinstance(x, H.WgmmaOp) and x.acc == self.scores for x in op.body)]
        if not trips:
            return tuple(dataclasses.replace(op, body=self.seq(op.body)) if isinstance(op, K.ForOp) else op
                         for op in ops)
        first, last = trips[0], trips[-1]
        if not isinstance(ops[first], K.IfOp):
            raise Declined("the first trip is not peeled (overlap-gemms off)")
        pv = next((i for i in range(last + 1, len(ops)) if isinstance(ops[i], K.IfOp)
                   and any(isinstance(x, H.WgmmaOp) for x in ops[i].body)), None)
        if pv is None:
            raise Declined("no P·V after the loops")
        out = list(ops)
        peeled: K.IfOp = ops[first]
        body = list(peeled.body)
        # The ping-pong round's opening arrival (before the trip's first wait) stays with every group's trip count.
        split = next(i for i, op in enumerate(body) if isinstance(op, (H.MbarrierWaitOp, K.LetOp)))
        opening, rest = tuple(body[:split]), tuple(body[split:])
        trip0 = self.trip(rest, peeled.loc)
        out[first] = dataclasses.replace(peeled, body=(*opening, *trip0))
        for i in trips[1:]:
            loop = ops[i]
            if isinstance(loop, K.ForOp) and _mask_guard_at(list(loop.body)) is not None:
                out[i] = dataclasses.replace(loop, body=self.trip(loop.body, loop.loc))
        out[pv] = dataclasses.replace(ops[pv], body=self.last_pv(ops[pv].body))
        loc = peeled.loc
        keys = [K.LetOp(name=name, type="i32", value=value, loc=loc)
                for name, value in ((LAST, self.last_key()), (FIRST, self.first_key())) if value is not None]
        return (*out[:first], *keys, K.CounterOp(name=LIVE, init=Const(0), loc=loc), *out[first:])


def skip_masked_trips(kernel: K.KernelOp) -> tuple[K.KernelOp, list[str]]:
    """The kernel with each consumer group's fully masked trips skipped, and the schedule notes."""
    roles = next((op for op in K.walk(kernel) if isinstance(op, H.WarpSpecializeOp)), None)
    if roles is None:
        return kernel, []
    mask = _window_mask(roles.consumer)
    if mask is None:
        return kernel, []
    groups = (kernel.threads - roles.producer_threads) // H.WARP_GROUP
    named = {op.name: op for op in K.walk(kernel) if hasattr(op, "name")}
    view = named.get(mask.coord)
    tile = named.get(view.src.name) if view is not None and isinstance(getattr(view, "src", None), Var) else None
    names = K.names_defined((kernel,))
    try:
        if groups < 2:
            raise Declined("one consumer warp group")
        if not isinstance(tile, K.IdentityTileOp) or tile.shape[0] != GROUP_ROWS * groups:
            raise Declined(f"the scores' rows are not {groups} warp groups of {GROUP_ROWS}")
        if names & {LAST, FIRST, LIVE}:
            raise Declined(f"the kernel already names {LAST}, {FIRST} or {LIVE}")
        trips = _Trips(mask, roles.group, tile.shape[1])
        consumer = trips.seq(roles.consumer)
        if not trips.done:
            raise Declined("no masked trip found")
    except Declined as why:
        return kernel, [f"skip-masked-trips: kept: {why}"]
    new_roles = dataclasses.replace(roles, consumer=consumer)
    body = K.rewrite_ops(kernel.body, lambda op: new_roles if op is roles else op)
    return dataclasses.replace(kernel, body=body), [
        f"skip-masked-trips: each of {groups} consumer warp groups skips the Q·Kᵀ, softmax and P·V of trips its "
        f"{GROUP_ROWS} rows mask entirely ({trips.done} trip bodies guarded by col0 <= {LAST}, P·V by {LIVE})"]


@dataclass(frozen=True)
class SkipMaskedTripsTransform(KernelTransform):
    """`Param SkipMaskedTrips = true` (schedule.skip_masked_trips; off by default: its guarded wgmma cost
    0.4-2.3 % where little or nothing is skipped, and tlc.attention.tuning sets it for the sm_90a d = 64 causal
    kernels) turns it on. Precondition (facts.masked_trips, proved on the TL graph by
    tlc.passes.masked_trips): a trip whose scores are all masked changes nothing the loop carries; where
    it would, every group runs every trip and the note says why."""

    name: ClassVar[str] = "skip-masked-trips"

    def rewrite(self, kernel: K.KernelOp, schedule: Schedule, facts: Facts) -> tuple[K.KernelOp, Notes]:
        if not schedule.skip_masked_trips:
            return kernel, []
        if facts.masked_trips is not None:
            return kernel, [f"skip-masked-trips: kept: {facts.masked_trips}"]
        if not any(isinstance(op, H.WarpSpecializeOp) for op in K.walk(kernel)):
            return kernel, ["skip-masked-trips: kept: not warp-specialised (sm_90a only)"]
        return skip_masked_trips(kernel)
