"""Kernel-IR executable ops: async copies and synchronization, fragment math, control flow.
Each declares its effects (`tlc.kir.effects`); a loop's or branch's are its body's ops'."""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import ClassVar

from tlc.kir.base import DTYPES, Op
from tlc.diagnostics import fail
from tlc.kir.effects import PURE, Effect, EffectDecl, Effects
from tlc.kir.expr import Expr, Index, Var, check_ident

_ALL = Var("_")
POSITIONS = ("q_idx", "kv_idx")   # a predicate MaskOp's per-element names: the score's global row and column


# ----------------------------------------------------------------------------- async copies and sync
@dataclass(frozen=True, kw_only=True)
class AsyncCopyOp(Op):
    """Issue cp.async `copy` src→dst (per thread partitions). Rows whose coordinate in `pred`
    is ≥ `row_limit` (or < `row_first`, when given) are zero-filled instead. Defines `token`
    (complete after a WaitOp)."""

    token: str
    copy: str
    src: Expr
    dst: Expr
    pred: Expr | None = None
    row_limit: Expr | None = None
    # Columns at or past `col_limit` (padding) are zero-filled too.
    col_limit: Expr | None = None
    # The shared buffer written (scheduling passes read it; the emitter does not).
    buffer: str = ""
    # Rows before `row_first` (a tile that starts before the tensor's first row) are zero-filled too.
    row_first: Expr | None = None
    # A gather: `src` is a tile of GlobalTensorOp `gather` (which has `rows_at`) whose first row is tensor row
    # `gather_row0`; each row reads the storage row its map gives (zero-filled where that is outside the storage).
    gather: str = ""
    gather_row0: Expr | None = None
    defines = ("token",)
    declared_effects = EffectDecl(reads=("src", "pred"), writes=("dst",), cp_async_writes=("buffer",),
                                  tokens_defined=("token",), kinds=Effect.CP_ASYNC)
    quiet_defaults: ClassVar[tuple[str, ...]] = ("gather", "gather_row0")

    def check(self) -> None:
        check_ident(self.copy, "tiled copy")
        self._need((self.pred is None) == (self.row_limit is None), "pred and row_limit go together")
        self._need(self.row_first is None or self.pred is not None, "row_first needs pred")
        _check_gather(self)


@dataclass(frozen=True, kw_only=True)
class CommitOp(Op):
    """`cp.async.commit_group`: the async copies `tokens` form group `name`."""

    name: str
    tokens: tuple[str, ...]
    defines = ("name",)
    declared_effects = EffectDecl(tokens_used=("tokens",), tokens_defined=("name",), kinds=Effect.ASYNC_GROUP)

    def check(self) -> None:
        for t in self.tokens:
            check_ident(t, "token")


@dataclass(frozen=True, kw_only=True)
class WaitOp(Op):
    """`cp.async.wait_group pending`: all but the newest `pending` groups have landed (this thread)."""

    pending: int
    groups: tuple[str, ...] = ()
    declared_effects = EffectDecl(tokens_used=("groups",), kinds=Effect.ASYNC_GROUP)

    def check(self) -> None:
        self._need(self.pending >= 0, "pending must be >= 0")


@dataclass(frozen=True, kw_only=True)
class BarrierOp(Op):
    """`__syncthreads()`: orders shared-memory writes and reads across the CTA."""

    declared_effects = EffectDecl(kinds=Effect.BARRIER)


@dataclass(frozen=True, kw_only=True)
class CopyOp(Op):
    """Synchronous tiled copy (S2R, R2S, S2G); rows with `pred` row ≥ `row_limit` (or < `row_first`) are skipped.
    With `kblock`, only that k-block (mode 2 of both partitions) is copied: one GEMM operand load."""

    copy: str
    src: Expr
    dst: Expr
    kblock: Expr | None = None
    pred: Expr | None = None
    row_limit: Expr | None = None
    # Columns at or past `col_limit` (padding) are skipped too.
    col_limit: Expr | None = None
    # Shared buffers read and written (scheduling passes read them; the emitter does not).
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    row_first: Expr | None = None
    # A scatter: `dst` is a tile of GlobalTensorOp `gather` (with `rows_at`) from tensor row `gather_row0`; each
    # row goes to the storage row its map gives (skipped where that is outside the storage).
    gather: str = ""
    gather_row0: Expr | None = None
    declared_effects = EffectDecl(reads=("src", "pred"), writes=("dst",), shared_reads=("reads",),
                                  shared_writes=("writes",))
    quiet_defaults: ClassVar[tuple[str, ...]] = ("gather", "gather_row0")

    def check(self) -> None:
        check_ident(self.copy, "tiled copy")
        self._need((self.pred is None) == (self.row_limit is None), "pred and row_limit go together")
        self._need(self.row_first is None or self.pred is not None, "row_first needs pred")
        _check_gather(self)


def _check_gather(op) -> None:
    """A copy's gather fields (AsyncCopyOp, CopyOp): both or neither, with the rows' coordinates in `pred`."""
    op._need(bool(op.gather) == (op.gather_row0 is not None), "gather and gather_row0 go together")
    op._need(not op.gather or (op.pred is not None and op.row_first is None),
             "a gather reads its rows' coordinates from pred (tiles counted from the start)")
    if op.gather:
        check_ident(op.gather, "gathered tensor")


# ----------------------------------------------------------------------------- fragment math
@dataclass(frozen=True, kw_only=True)
class ClearOp(Op):
    """Set a fragment to zero."""

    target: str
    declared_effects = EffectDecl(writes=("target",))

    def check(self) -> None:
        check_ident(self.target, "fragment")


def kblock_slice(e: Expr, kb: Expr) -> Expr:
    """K-block `kb` of a partitioned GEMM operand: `t` → `t[_, _, kb]`, `t[_, _, _, s]` → `t[_, _, kb, s]`."""
    if isinstance(e, Var):
        return Index(e, (_ALL, _ALL, kb))
    if isinstance(e, Index) and len(e.indices) >= 3 and e.indices[2] == _ALL:
        return Index(e.base, (*e.indices[:2], kb, *e.indices[3:]))
    raise fail(f"kernel IR: `{e}` has no k-block mode to select")


@dataclass(frozen=True, kw_only=True)
class MmaOp(Op):
    """acc += a·b over k-block `kblock` of the operand fragments `a` and `b` (mode 2 of a
    partitioned fragment), with TiledMMA `mma`."""

    mma: str
    acc: str
    a: str
    b: str
    kblock: Expr
    declared_effects = EffectDecl(reads=("a", "b", "acc"), writes=("acc",))

    def check(self) -> None:
        for n in (self.mma, self.acc, self.a, self.b):
            check_ident(n, "fragment")


@dataclass(frozen=True, kw_only=True)
class MaskOp(Op):
    """Set masked scores to -inf. Element (r, c) of `target` has coordinate `coord` + (row0, col0);
    masked iff bounds and c ≥ sk, or causal and c > r + diag, diag = 0 (top_left) or sk - sq
    (bottom_right), or — a predicate mask, neither bounds nor causal — where `predicate` is true with
    `q_idx` = r and `kv_idx` = c bound per element (its other names are the kernel's)."""

    target: str
    coord: str
    row0: Expr
    col0: Expr
    sq: Expr
    sk: Expr
    causal: bool
    alignment: str
    bounds: bool
    predicate: Expr | None = None
    declared_effects = EffectDecl(reads=("target", "coord"), writes=("target",))
    quiet_defaults: ClassVar[tuple[str, ...]] = ("predicate",)   # the text leaves `predicate=none` out
    binds: ClassVar[dict[str, tuple[str, ...]]] = {"predicate": POSITIONS}   # names the op itself defines there

    def used_names(self) -> set[str]:
        return super().used_names() - set(POSITIONS)

    def check(self) -> None:
        check_ident(self.target, "fragment")
        check_ident(self.coord, "coordinates")
        self._need(self.alignment in ("top_left", "bottom_right"), f"alignment {self.alignment!r}")
        self._need(self.predicate is None or not (self.causal or self.bounds),
                   "with a predicate is neither causal nor bounds")


@dataclass(frozen=True, kw_only=True)
class RowReduceOp(Op):
    """dst[r] = reduce(src[r, :]) over this thread's columns (`accumulate`: fold into dst). `chains` > 1
    reduces each row in that many independent partial results, combined pairwise at the end: the
    same max, a sum in another order, and a dependency chain that many times shorter."""

    dst: str
    src: str
    kind: str
    accumulate: bool
    chains: int = 1
    declared_effects = EffectDecl(reads=("src",), writes=("dst",))

    def effects(self) -> Effects:
        """`accumulate` folds into `dst`, which it then reads too."""
        own = super().effects()
        return replace(own, reads=own.reads | {self.dst}) if self.accumulate else own

    def check(self) -> None:
        check_ident(self.dst, "row vector")
        check_ident(self.src, "fragment")
        self._need(self.kind in ("max", "sum"), f"kind {self.kind!r}")
        self._need(self.chains in (1, 2, 4, 8), f"chains {self.chains}: 1, 2, 4 or 8")


@dataclass(frozen=True, kw_only=True)
class AllReduceOp(Op):
    """Reduce a row vector across the `width` lanes sharing each row (shuffle xor)."""

    target: str
    kind: str
    width: int
    declared_effects = EffectDecl(reads=("target",), writes=("target",), kinds=Effect.WARP_COLLECTIVE)

    def check(self) -> None:
        check_ident(self.target, "row vector")
        self._need(self.kind in ("max", "sum"), f"kind {self.kind!r}")
        self._need(self.width in (1, 2, 4, 8, 16, 32), f"width {self.width}")


@dataclass(frozen=True, kw_only=True)
class Exp2ScaleOp(Op):
    """x = exp2(x·scale_log2 − m·scale_log2) with the row max `row_max` (−inf rows use 0): one FFMA + EX2.
    `poly_every` k > 0: every k-th column of a thread's fragment takes 2^x from a polynomial on the FMA
    pipe instead (tlc::exp2_poly, relative error 1.5e-4), so the MUFU unit does (k − 1) / k of them."""

    target: str
    row_max: str
    scale_log2: Expr
    poly_every: int = 0
    declared_effects = EffectDecl(reads=("target", "row_max"), writes=("target",))

    def check(self) -> None:
        check_ident(self.target, "fragment")
        check_ident(self.row_max, "row vector")
        self._need(isinstance(self.poly_every, int) and 0 <= self.poly_every <= 64, f"poly_every {self.poly_every}")


@dataclass(frozen=True, kw_only=True)
class RowBroadcastOp(Op):
    """x = fn(x, r) for each element x of `target`, r = `vec` at its row (`fn` uses names x and r)."""

    target: str
    vec: str
    fn: Expr
    declared_effects = EffectDecl(reads=("target", "vec"), writes=("target",))

    def check(self) -> None:
        check_ident(self.target, "fragment")
        check_ident(self.vec, "row vector")


@dataclass(frozen=True, kw_only=True)
class WarpAnyOp(Op):
    """`const bool name = __any_sync(full, any i: fn(vec(i)))`: whether `fn` (of x) holds for an element of
    row vector `vec` in any lane of the warp, the same answer in every lane, so an `IfOp` on it is a
    warp-uniform branch. The tile evaluator, which has no lanes, takes the whole tile's answer."""

    name: str
    vec: str
    fn: Expr
    defines = ("name",)
    declared_effects = EffectDecl(reads=("vec",), kinds=Effect.WARP_COLLECTIVE)

    def check(self) -> None:
        check_ident(self.name, "flag")
        check_ident(self.vec, "row vector")


@dataclass(frozen=True, kw_only=True)
class TimestampOp(Op):
    """The first thread of each warp group records (its SM, its SM's clock) in `buffer` at
    [(unit × warp groups + warp group) × slots + slot]: a phase boundary for a timeline of the kernel
    (`trace-phases`; bench/timeline.py reads it). The unit is the CTA, or `index` (a persistent
    kernel's tile turn). `label` names the boundary; no effect on values. `slot_offset` (a loop's trip
    number, kept below the slots its caller reserved) is added to `slot`."""

    buffer: str
    slot: int
    slots: int
    label: str
    index: Expr | None = None
    slot_offset: Expr | None = None
    declared_effects = EffectDecl(writes=("buffer",), kinds=Effect.GLOBAL_WRITE)

    def check(self) -> None:
        check_ident(self.buffer, "trace buffer")
        self._need(isinstance(self.slots, int) and isinstance(self.slot, int) and 0 <= self.slot < self.slots,
                   f"slot {self.slot} of {self.slots}")
        self._need(bool(re.fullmatch(r"[A-Za-z0-9_:.-]+", self.label)), f"label {self.label!r}")


@dataclass(frozen=True, kw_only=True)
class MapOp(Op):
    """Elementwise target[i] = fn(x0, x1, ...) with x_j = srcs[j][i] (same shapes)."""

    target: str
    srcs: tuple[str, ...]
    fn: Expr
    declared_effects = EffectDecl(reads=("srcs",), writes=("target",))

    def check(self) -> None:
        check_ident(self.target, "tensor")
        for s in self.srcs:
            check_ident(s, "tensor")


@dataclass(frozen=True, kw_only=True)
class ConvertOp(Op):
    """A new register fragment: `src` converted to `dtype` (cvt pairs)."""

    name: str
    src: str
    dtype: str
    defines = ("name",)
    declared_effects = EffectDecl(reads=("src",))

    def check(self) -> None:
        check_ident(self.src, "fragment")
        self._need(self.dtype in DTYPES, f"dtype {self.dtype!r}")


@dataclass(frozen=True, kw_only=True)
class RetileAccToAOp(Op):
    """View accumulator-layout registers `src` as an A operand of `mma` (P kept in registers)."""

    name: str
    src: str
    mma: str
    defines = ("name",)
    declared_effects = EffectDecl(reads=("src",))

    def check(self) -> None:
        check_ident(self.src, "fragment")
        check_ident(self.mma, "tiled mma")


@dataclass(frozen=True, kw_only=True)
class RowStoreOp(Op):
    """Store row vector `vec` to global vector `dst` at the rows given by C-coordinates `coord`
    (one lane per row group writes), skipping rows ≥ `row_limit`."""

    dst: str
    vec: str
    coord: str
    row_limit: Expr
    declared_effects = EffectDecl(reads=("vec", "coord"), writes=("dst",), kinds=Effect.GLOBAL_WRITE)

    def check(self) -> None:
        for n in (self.dst, self.vec, self.coord):
            check_ident(n, "tensor")


@dataclass(frozen=True, kw_only=True)
class _ElementCopy(Op):
    """A copy between fp32 fragment and a global tile, each lane its own elements at their (row, col) in
    C-coordinates `coord` (partitioned like the fragment), those at rows ≥ `row_limit` (or < `row_first`) and
    columns ≥ `col_limit` left out."""

    dst: str
    src: str
    coord: str
    row_limit: Expr
    col_limit: Expr | None = None
    row_first: Expr | None = None

    def check(self) -> None:
        for n in (self.dst, self.src, self.coord):
            check_ident(n, "tensor")


@dataclass(frozen=True, kw_only=True)
class FragStoreOp(_ElementCopy):
    """Store (or with `add`, atomically add) fp32 fragment `src` into global tile `dst`, element by element: an
    fp32 output written from the registers, no staging (a reduce-store's elements are summed by the memory
    system, whichever CTA adds first)."""

    add: bool = False
    declared_effects = EffectDecl(reads=("src", "coord"), writes=("dst",), kinds=Effect.GLOBAL_WRITE)


@dataclass(frozen=True, kw_only=True)
class FragLoadOp(_ElementCopy):
    """Load fp32 fragment `dst` from global tile `src`, element by element, converted to fp32; elements left out
    read 0: a register tile no GEMM produces, loaded straight from global memory."""

    declared_effects = EffectDecl(reads=("src", "coord"), writes=("dst",))


@dataclass(frozen=True, kw_only=True)
class RowLoadOp(Op):
    """Load row vector `dst` from global vector tile `src` at the rows of C-coordinates `coord` (the row
    layout's identity partition); every lane loads its rows, those ≥ `row_limit` read 0."""

    dst: str
    src: str
    coord: str
    row_limit: Expr
    declared_effects = EffectDecl(reads=("src", "coord"), writes=("dst",))

    def check(self) -> None:
        for n in (self.dst, self.src, self.coord):
            check_ident(n, "tensor")


# ----------------------------------------------------------------------------- control flow
@dataclass(frozen=True, kw_only=True)
class ForOp(Op):
    """`for var in start, start+step, …` while var < stop (step > 0) or var > stop (step < 0).
    Schedule attributes: `stages` buffers in flight, `prefetch` = next tile issued before compute;
    `unroll`: a loop over a GEMM's k-blocks, fully unrolled (static bounds, registers indexed by it);
    `unroll_by` k > 0: emitted unrolled k times, so k trips' independent loads can be in flight together
    (`unroll-register-loops`); 0: one trip at a time."""

    var: str
    start: Expr
    stop: Expr
    step: int
    body: tuple[Op, ...]
    stages: int = 1
    prefetch: bool = False
    unroll: bool = False
    unroll_by: int = 0
    quiet_defaults: ClassVar[tuple[str, ...]] = ("unroll_by",)
    defines = ("var",)
    regions = ("body",)
    declared_effects = PURE

    def check(self) -> None:
        self._need(self.step != 0, "step must not be 0")
        self._need(self.stages >= 1, "stages must be >= 1")


@dataclass(frozen=True, kw_only=True)
class IfOp(Op):
    """Run `body` when `cond` holds (uniform across the CTA when it guards barriers)."""

    cond: Expr
    body: tuple[Op, ...]
    regions = ("body",)
    declared_effects = PURE


@dataclass(frozen=True, kw_only=True)
class CounterOp(Op):
    """`int name = init;` — a scalar that `CounterAddOp`s advance: what a persistent kernel carries
    from one tile to the next (its mbarrier rings' position)."""

    name: str
    init: Expr
    defines = ("name",)
    declared_effects = PURE


@dataclass(frozen=True, kw_only=True)
class CounterAddOp(Op):
    """`counter += value;` on a `CounterOp`'s scalar."""

    counter: str
    value: Expr
    declared_effects = EffectDecl(reads=("counter",), writes=("counter",))

    def check(self) -> None:
        check_ident(self.counter, "counter")


@dataclass(frozen=True, kw_only=True)
class CounterSetOp(Op):
    """`counter = value;` on a `CounterOp`'s scalar."""

    counter: str
    value: Expr
    declared_effects = EffectDecl(writes=("counter",))

    def check(self) -> None:
        check_ident(self.counter, "counter")


@dataclass(frozen=True, kw_only=True)
class BreakOp(Op):
    """`break;` out of the innermost enclosing `ForOp` (a loop whose end is found inside it)."""

    declared_effects = EffectDecl(kinds=Effect.CONTROL)
