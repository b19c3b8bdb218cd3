"""Kernel-IR ops: one frozen dataclass per concept (DESIGN §3, second level).

The emitter has exactly one handler per class here. Every op carries the `loc` of the TL
statement it came from, so `#line` directives and late errors point at the user's `.tl` line.
Names that become C++ identifiers are checked by `verify()`; scalar math is an `Expr`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import ClassVar, Iterator

from tlc.diagnostics import Loc, fail
from tlc.kir.expr import Expr, check_ident

DTYPES = ("bf16", "fp16", "fp32")
SCALAR_TYPES = ("i32", "i64", "f32", "bool")
PARAM_TYPES = ("ptr<bf16>", "ptr<fp16>", "ptr<f32>", "i32", "i64", "f32")
# MMA and copy atoms the backend can spell, with CuTe names (validated, then printed verbatim).
MMA_ATOMS = ("SM80_16x8x16_F32BF16BF16F32_TN", "SM80_16x8x16_F32F16F16F32_TN", "SM80_16x8x8_F32F16F16F32_TN")
COPY_ATOMS = ("SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>", "SM80_CP_ASYNC_CACHEALWAYS<cute::uint128_t>",
              "SM75_U32x4_LDSM_N", "SM75_U16x8_LDSM_T", "UniversalCopy<cute::uint128_t>",
              "UniversalCopy<uint32_t>", "AutoVectorizingCopyWithAssumedAlignment<128>")
PARTITIONS = ("partition_S", "partition_D", "partition_A", "partition_B", "partition_C", "retile_S", "retile_D")


@dataclass(frozen=True, kw_only=True)
class Op:
    """Base: `loc` is the TL statement the op came from (None for synthesized boilerplate)."""

    loc: Loc | None = None
    # Field names holding C++ names this op defines; checked as identifiers by verify().
    defines: ClassVar[tuple[str, ...]] = ()
    regions: ClassVar[tuple[str, ...]] = ()

    def verify(self) -> None:
        for name in self.defines:
            check_ident(getattr(self, name), f"{type(self).__name__}.{name}")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in self.regions:
                for op in value:
                    if not isinstance(op, Op):
                        raise fail(f"kernel IR: {type(self).__name__}.{f.name} holds a non-op {op!r}", self.loc)
                    op.verify()
        self.check()

    def check(self) -> None:
        """Op-specific invariants; raise `fail(...)` on violation."""

    def defined_names(self) -> list[str]:
        return [getattr(self, n) for n in self.defines]

    def _need(self, cond: bool, msg: str) -> None:
        if not cond:
            raise fail(f"kernel IR: {type(self).__name__} {msg}", self.loc)


def _ints(value: tuple, n: int | None = None) -> bool:
    return isinstance(value, tuple) and all(isinstance(v, int) and v > 0 for v in value) and (
        n is None or len(value) == n)


# ----------------------------------------------------------------------------- program level
@dataclass(frozen=True, kw_only=True)
class ParamsOp(Op):
    """The launch ABI: one struct passed by value. `fields` = ((name, type), ...)."""

    name: str
    fields: tuple[tuple[str, str], ...]
    defines = ("name",)

    def check(self) -> None:
        for fname, ftype in self.fields:
            check_ident(fname, "parameter field")
            self._need(ftype in PARAM_TYPES, f"field {fname} has type {ftype!r}; expected one of {PARAM_TYPES}")


@dataclass(frozen=True, kw_only=True)
class KernelOp(Op):
    """One `__global__` function taking `const <params> p`; grid is (x, y, z) expressions."""

    name: str
    params: str
    threads: int
    min_blocks: int
    grid: tuple[Expr, Expr, Expr]
    smem_bytes: int
    body: tuple[Op, ...]
    defines = ("name",)
    regions = ("body",)

    def check(self) -> None:
        check_ident(self.params, "params struct")
        self._need(self.threads % 32 == 0 and 0 < self.threads <= 1024, f"threads={self.threads} is not 32..1024 warps")
        self._need(self.smem_bytes >= 0, "smem_bytes must be >= 0")
        self._need(len(self.grid) == 3 and all(isinstance(g, Expr) for g in self.grid), "grid needs 3 expressions")


@dataclass(frozen=True, kw_only=True)
class ProgramOp(Op):
    """A program: parameter structs and one or more kernels (e.g. split-KV + combine)."""

    name: str
    body: tuple[Op, ...]
    defines = ("name",)
    regions = ("body",)

    def kernels(self) -> list[KernelOp]:
        return [op for op in self.body if isinstance(op, KernelOp)]


# ----------------------------------------------------------------------------- scalars
@dataclass(frozen=True, kw_only=True)
class LetOp(Op):
    """`const int m_block = blockIdx.x;` — a named scalar."""

    name: str
    type: str
    value: Expr
    defines = ("name",)

    def check(self) -> None:
        self._need(self.type in SCALAR_TYPES, f"type {self.type!r} not in {SCALAR_TYPES}")


# ----------------------------------------------------------------------------- atoms and layouts
@dataclass(frozen=True, kw_only=True)
class TiledMmaOp(Op):
    """TiledMMA: `atom` repeated over `warps` (M, N, K) warps, covering `tile` (M, N, K) per step."""

    name: str
    atom: str
    warps: tuple[int, int, int]
    tile: tuple[int, int, int]
    thread_slice: str
    defines = ("name", "thread_slice")

    def check(self) -> None:
        self._need(self.atom in MMA_ATOMS, f"unknown MMA atom {self.atom!r}")
        self._need(_ints(self.warps, 3) and _ints(self.tile, 3), "warps and tile need 3 positive ints")


@dataclass(frozen=True, kw_only=True)
class SmemLayoutOp(Op):
    """Shared layout: `atom` (rows, cols) row-major under Swizzle<B,M,S>, tiled to `shape` (+ stage dim)."""

    name: str
    swizzle: tuple[int, int, int]
    atom: tuple[int, int]
    shape: tuple[int, ...]
    defines = ("name",)

    def check(self) -> None:
        self._need(_ints(self.atom, 2) and _ints(self.shape) and len(self.shape) in (2, 3), "bad atom/shape")
        self._need(len(self.swizzle) == 3 and all(isinstance(v, int) and v >= 0 for v in self.swizzle), "bad swizzle")
        self._need(self.shape[0] % self.atom[0] == 0 and self.shape[1] % self.atom[1] == 0,
                   f"shape {self.shape} is not a multiple of the atom {self.atom}")


@dataclass(frozen=True, kw_only=True)
class SmemTransposeLayoutOp(Op):
    """The (cols, rows[, stages]) view of layout `of` — V read as Vᵀ for the P·V GEMM."""

    name: str
    of: str
    shape: tuple[int, ...]
    strip_swizzle: bool = False
    defines = ("name",)

    def check(self) -> None:
        check_ident(self.of, "layout")
        self._need(_ints(self.shape) and len(self.shape) in (2, 3), "bad shape")


# ----------------------------------------------------------------------------- tensors
@dataclass(frozen=True, kw_only=True)
class SharedBufferOp(Op):
    """A shared-memory tensor at byte `offset` of the dynamic shared allocation."""

    name: str
    dtype: str
    layout: str
    offset_bytes: int
    defines = ("name",)

    def check(self) -> None:
        check_ident(self.layout, "layout")
        self._need(self.dtype in DTYPES, f"dtype {self.dtype!r}")
        self._need(self.offset_bytes % 128 == 0, f"offset {self.offset_bytes} is not 128-byte aligned")


@dataclass(frozen=True, kw_only=True)
class SharedViewOp(Op):
    """Another layout over the same shared memory as `of` (sVt over sV, sO reusing sQ)."""

    name: str
    of: str
    layout: str
    defines = ("name",)

    def check(self) -> None:
        check_ident(self.of, "tensor")
        check_ident(self.layout, "layout")


@dataclass(frozen=True, kw_only=True)
class GlobalTensorOp(Op):
    """Global tensor at `ptr + offset` with `rows` rows of `cols` contiguous elements (cols=0: a vector)."""

    name: str
    dtype: str
    ptr: Expr
    offset: Expr
    rows: Expr
    cols: int
    row_stride: Expr
    defines = ("name",)

    def check(self) -> None:
        self._need(self.dtype in DTYPES, f"dtype {self.dtype!r}")


@dataclass(frozen=True, kw_only=True)
class GlobalTileOp(Op):
    """`local_tile(src, tile, coord)`; a coord of `_` keeps that tile mode for iteration."""

    name: str
    src: str
    tile: tuple[int, ...]
    coord: tuple[Expr, ...]
    defines = ("name",)

    def check(self) -> None:
        check_ident(self.src, "tensor")
        self._need(_ints(self.tile) and len(self.tile) == len(self.coord), "tile and coord ranks differ")


@dataclass(frozen=True, kw_only=True)
class IdentityTileOp(Op):
    """Coordinates (row, col) of a tile: partitioned like data, used for bounds predicates."""

    name: str
    shape: tuple[int, int]
    defines = ("name",)

    def check(self) -> None:
        self._need(_ints(self.shape, 2), "shape needs 2 positive ints")


@dataclass(frozen=True, kw_only=True)
class TiledCopyOp(Op):
    """A TiledCopy. kind `threads`: `thread_layout` (rows, cols) threads × `value_layout` values each;
    kind `A`/`B`/`C`: matched to the operand layout of TiledMMA `mma` (ldmatrix, epilogue stores)."""

    name: str
    atom: str
    dtype: str
    kind: str
    thread_slice: str
    thread_layout: tuple[int, ...] = ()
    value_layout: tuple[int, ...] = ()
    mma: str = ""
    defines = ("name", "thread_slice")

    def check(self) -> None:
        self._need(self.atom in COPY_ATOMS, f"unknown copy atom {self.atom!r}")
        self._need(self.dtype in DTYPES, f"dtype {self.dtype!r}")
        self._need(self.kind in ("threads", "A", "B", "C"), f"kind {self.kind!r}")
        if self.kind == "threads":
            self._need(_ints(self.thread_layout, 2) and _ints(self.value_layout, 2), "needs thread/value layouts")
        else:
            check_ident(self.mma, "tiled mma")


@dataclass(frozen=True, kw_only=True)
class PartitionOp(Op):
    """`Tensor name = slice.method(src)`: a thread's share of a tile (partition_S/D/A/B/C, retile_S/D)."""

    name: str
    slice: str
    method: str
    src: Expr
    defines = ("name",)

    def check(self) -> None:
        check_ident(self.slice, "thread slice")
        self._need(self.method in PARTITIONS, f"method {self.method!r}")


@dataclass(frozen=True, kw_only=True)
class FragmentOp(Op):
    """Register fragment for operand `role` A/B (shaped like smem `src`) or C (shape (M, N)) of `mma`."""

    name: str
    mma: str
    role: str
    dtype: str
    src: Expr | None = None
    shape: tuple[int, ...] = ()
    defines = ("name",)

    def check(self) -> None:
        check_ident(self.mma, "tiled mma")
        self._need(self.role in ("A", "B", "C"), f"role {self.role!r}")
        self._need(self.dtype in DTYPES, f"dtype {self.dtype!r}")
        self._need((self.role == "C") == (self.src is None), "A/B fragments need src, C fragments a shape")
        if self.role == "C":
            self._need(_ints(self.shape, 2), "C fragment needs shape (M, N)")


@dataclass(frozen=True, kw_only=True)
class RowVectorOp(Op):
    """fp32 per-row registers of accumulator `like` (row max, row sum), set to `init`."""

    name: str
    like: str
    init: Expr
    defines = ("name",)

    def check(self) -> None:
        check_ident(self.like, "fragment")


# ----------------------------------------------------------------------------- async copies and sync
@dataclass(frozen=True, kw_only=True)
class AsyncCopyOp(Op):
    """Issue cp.async `copy` src→dst (per thread partitions). Rows whose coordinate in `pred`
    is ≥ `row_limit` are zero-filled instead. Defines `token` (complete after a WaitOp)."""

    token: str
    copy: str
    src: Expr
    dst: Expr
    pred: Expr | None = None
    row_limit: Expr | None = None
    defines = ("token",)

    def check(self) -> None:
        check_ident(self.copy, "tiled copy")
        self._need((self.pred is None) == (self.row_limit is None), "pred and row_limit go together")


@dataclass(frozen=True, kw_only=True)
class CommitOp(Op):
    """`cp.async.commit_group`: the async copies `tokens` form group `name`."""

    name: str
    tokens: tuple[str, ...]
    defines = ("name",)

    def check(self) -> None:
        for t in self.tokens:
            check_ident(t, "token")


@dataclass(frozen=True, kw_only=True)
class WaitOp(Op):
    """`cp.async.wait_group pending`: all but the newest `pending` groups have landed (this thread)."""

    pending: int
    groups: tuple[str, ...] = ()

    def check(self) -> None:
        self._need(self.pending >= 0, "pending must be >= 0")


@dataclass(frozen=True, kw_only=True)
class BarrierOp(Op):
    """`__syncthreads()`: orders shared-memory writes and reads across the CTA."""


@dataclass(frozen=True, kw_only=True)
class CopyOp(Op):
    """Synchronous tiled copy (R2S, S2G); rows with `pred` row ≥ `row_limit` are skipped."""

    copy: str
    src: Expr
    dst: Expr
    pred: Expr | None = None
    row_limit: Expr | None = None

    def check(self) -> None:
        check_ident(self.copy, "tiled copy")
        self._need((self.pred is None) == (self.row_limit is None), "pred and row_limit go together")


# ----------------------------------------------------------------------------- fragment math
@dataclass(frozen=True, kw_only=True)
class ClearOp(Op):
    """Set a fragment to zero."""

    target: str

    def check(self) -> None:
        check_ident(self.target, "fragment")


@dataclass(frozen=True, kw_only=True)
class GemmOp(Op):
    """acc += a·b on fragments with `mma`. An operand with `*_smem` set is loaded per k-block from
    shared memory with S2R copy `*_copy` into the `*_view` retiled view of its fragment."""

    mma: str
    acc: str
    a: str
    b: str
    a_smem: Expr | None = None
    a_copy: str = ""
    a_view: str = ""
    b_smem: Expr | None = None
    b_copy: str = ""
    b_view: str = ""
    # Software-pipeline the S2R loads: issue k-block kb+1 before the MMAs of kb (more registers).
    prefetch: bool = True

    def check(self) -> None:
        for n in (self.mma, self.acc, self.a, self.b):
            check_ident(n, "fragment")
        for smem, copy, view in ((self.a_smem, self.a_copy, self.a_view), (self.b_smem, self.b_copy, self.b_view)):
            if smem is not None:
                check_ident(copy, "smem copy")
                check_ident(view, "fragment view")


@dataclass(frozen=True, kw_only=True)
class MaskOp(Op):
    """Set masked scores to -inf. Element (r, c) of `target` has coordinate `coord` + (row0, col0);
    masked iff bounds and c ≥ sk, or causal and c > r + diag, diag = 0 (top_left) or sk - sq
    (bottom_right)."""

    target: str
    coord: str
    row0: Expr
    col0: Expr
    sq: Expr
    sk: Expr
    causal: bool
    alignment: str
    bounds: bool

    def check(self) -> None:
        check_ident(self.target, "fragment")
        check_ident(self.coord, "coordinates")
        self._need(self.alignment in ("top_left", "bottom_right"), f"alignment {self.alignment!r}")


@dataclass(frozen=True, kw_only=True)
class RowReduceOp(Op):
    """dst[r] = reduce(src[r, :]) over this thread's columns (`accumulate`: fold into dst)."""

    dst: str
    src: str
    kind: str
    accumulate: bool

    def check(self) -> None:
        check_ident(self.dst, "row vector")
        check_ident(self.src, "fragment")
        self._need(self.kind in ("max", "sum"), f"kind {self.kind!r}")


@dataclass(frozen=True, kw_only=True)
class AllReduceOp(Op):
    """Reduce a row vector across the `width` lanes sharing each row (shuffle xor)."""

    target: str
    kind: str
    width: int

    def check(self) -> None:
        check_ident(self.target, "row vector")
        self._need(self.kind in ("max", "sum"), f"kind {self.kind!r}")
        self._need(self.width in (1, 2, 4, 8, 16, 32), f"width {self.width}")


@dataclass(frozen=True, kw_only=True)
class Exp2ScaleOp(Op):
    """x = exp2(x·scale_log2 − m·scale_log2) with the row max `row_max` (−inf rows use 0): one FFMA + EX2."""

    target: str
    row_max: str
    scale_log2: Expr

    def check(self) -> None:
        check_ident(self.target, "fragment")
        check_ident(self.row_max, "row vector")


@dataclass(frozen=True, kw_only=True)
class RowBroadcastOp(Op):
    """x = fn(x, r) for each element x of `target`, r = `vec` at its row (`fn` uses names x and r)."""

    target: str
    vec: str
    fn: Expr

    def check(self) -> None:
        check_ident(self.target, "fragment")
        check_ident(self.vec, "row vector")


@dataclass(frozen=True, kw_only=True)
class MapOp(Op):
    """Elementwise target[i] = fn(x0, x1, ...) with x_j = srcs[j][i] (same shapes)."""

    target: str
    srcs: tuple[str, ...]
    fn: Expr

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

    def check(self) -> None:
        for n in (self.dst, self.vec, self.coord):
            check_ident(n, "tensor")


# ----------------------------------------------------------------------------- control flow
@dataclass(frozen=True, kw_only=True)
class ForOp(Op):
    """`for var in start, start+step, …` while var < stop (step > 0) or var > stop (step < 0).
    Schedule attributes: `stages` buffers in flight, `prefetch` = next tile issued before compute."""

    var: str
    start: Expr
    stop: Expr
    step: int
    body: tuple[Op, ...]
    stages: int = 1
    prefetch: bool = False
    defines = ("var",)
    regions = ("body",)

    def check(self) -> None:
        self._need(self.step != 0, "step must not be 0")
        self._need(self.stages >= 1, "stages must be >= 1")


@dataclass(frozen=True, kw_only=True)
class IfOp(Op):
    """Run `body` when `cond` holds (uniform across the CTA when it guards barriers)."""

    cond: Expr
    body: tuple[Op, ...]
    regions = ("body",)


OP_CLASSES: dict[str, type[Op]] = {cls.__name__: cls for cls in (
    ProgramOp, ParamsOp, KernelOp, LetOp, TiledMmaOp, SmemLayoutOp, SmemTransposeLayoutOp, SharedBufferOp,
    SharedViewOp, GlobalTensorOp, GlobalTileOp, IdentityTileOp, TiledCopyOp, PartitionOp, FragmentOp,
    RowVectorOp, AsyncCopyOp, CommitOp, WaitOp, BarrierOp, CopyOp, ClearOp, GemmOp, MaskOp, RowReduceOp,
    AllReduceOp, Exp2ScaleOp, RowBroadcastOp, MapOp, ConvertOp, RetileAccToAOp, RowStoreOp, ForOp, IfOp)}


def walk(op: Op) -> Iterator[Op]:
    """Pre-order over `op` and its regions."""
    yield op
    for region in op.regions:
        for child in getattr(op, region):
            yield from walk(child)


_SNAKE = re.compile(r"(?<!^)(?=[A-Z])")


def op_label(cls: type[Op]) -> str:
    return _SNAKE.sub("_", cls.__name__[:-2]).lower()
