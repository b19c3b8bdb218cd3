"""Kernel-IR declarations: parameter struct, kernels, scalars, atoms, layouts and tensors. They define
names and have no effects of their own (`PURE`); a kernel does what its body's ops do."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tlc.kir.base import COPY_ATOMS, DTYPES, MMA_ATOMS, Op, PARAM_TYPES, PARTITIONS, SCALAR_TYPES, _ints
from tlc.kir.effects import PURE
from tlc.kir.expr import BinOp, Expr, Var, check_ident

# ----------------------------------------------------------------------------- program level
@dataclass(frozen=True, kw_only=True)
class ParamsOp(Op):
    """The launch ABI: one struct passed by value. `fields` = ((name, type), ...)."""

    name: str
    fields: tuple[tuple[str, str], ...]
    defines = ("name",)
    declared_effects = PURE

    def check(self) -> None:
        for fname, ftype in self.fields:
            check_ident(fname, "parameter field")
            self._need(ftype in PARAM_TYPES, f"field {fname} has type {ftype!r}; expected one of {PARAM_TYPES}")


@dataclass(frozen=True, kw_only=True)
class TraceBufferOp(Op):
    """`__device__ unsigned long long name[entries];` at file scope: where `TimestampOp`s of the
    program's kernels write (the `trace-phases` pass; a reader takes it by name from the module)."""

    name: str
    entries: int
    defines = ("name",)
    declared_effects = PURE

    def check(self) -> None:
        check_ident(self.name, "trace buffer")
        self._need(isinstance(self.entries, int) and 0 < self.entries <= 1 << 26, f"entries={self.entries}")


LAUNCH_ROLES = ("input", "workspace", "output")


@dataclass(frozen=True, kw_only=True)
class LaunchOp(Op):
    """The launch contract of a program of several kernels, in each of its kernels' programs: `kernels` in launch
    order and each global tensor's role, in program order — input (the caller passes it), workspace (a kernel
    stores it and a later one loads it: the launch allocates it, zeroed where it is added into, and never returns
    it) or output (returned, in Allocate order). The program's launcher (`ModuleKernel`) binds from it."""

    program: str
    kernels: tuple[str, ...]
    tensors: tuple[tuple[str, str], ...]
    declared_effects = PURE

    def check(self) -> None:
        for k in self.kernels:
            check_ident(k, "kernel")
        for name, role in self.tensors:
            check_ident(name, "tensor")
            self._need(role in LAUNCH_ROLES, f"tensor {name} has role {role!r}; expected one of {LAUNCH_ROLES}")

    def roles(self) -> dict[str, str]:
        return dict(self.tensors)


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
    declared_effects = PURE

    def check(self) -> None:
        check_ident(self.params, "params struct")
        self._need(self.threads % 32 == 0 and 0 < self.threads <= 1024, f"threads={self.threads} is not 32..1024 warps")
        self._need(self.smem_bytes >= 0, "smem_bytes must be >= 0")
        self._need(len(self.grid) == 3 and all(isinstance(g, Expr) for g in self.grid), "grid needs 3 expressions")

    def own_grid_axes(self) -> bool:
        """Grid z is the batch times axes of the kernel's own (`Kernel k over [split_idx = S]`: `p.batch * S`), which
        LetOps decode from blockIdx.z: a transform that renumbers the grid's tiles must not read z as the batch."""
        z = self.grid[2]
        while isinstance(z, BinOp) and z.op == "*":
            z = z.lhs
        return z == Var("p.batch") and self.grid[2] != Var("p.batch")


@dataclass(frozen=True, kw_only=True)
class ProgramOp(Op):
    """A program: parameter structs and one or more kernels (e.g. split-KV + combine)."""

    name: str
    body: tuple[Op, ...]
    defines = ("name",)
    regions = ("body",)
    declared_effects = PURE

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
    declared_effects = PURE

    def check(self) -> None:
        self._need(self.type in SCALAR_TYPES, f"type {self.type!r} not in {SCALAR_TYPES}")


# ----------------------------------------------------------------------------- atoms and layouts
@dataclass(frozen=True, kw_only=True)
class TiledMmaOp(Op):
    """TiledMMA: `atom` repeated over `warps` (M, N, K) warps, covering `tile` (M, N, K) per step.

    `replicas` > 1: the block's warps hold that many copies of this MMA's tile, each group of
    warps computing the same values (thread t acts as thread t mod the MMA's threads). Used when
    a block has fewer rows than warps × 16 and a row-wise result (softmax) must stay in one warp.
    """

    name: str
    atom: str
    warps: tuple[int, int, int]
    tile: tuple[int, int, int]
    thread_slice: str
    replicas: int = 1
    defines = ("name", "thread_slice")
    declared_effects = PURE

    def check(self) -> None:
        self._need(self.atom in MMA_ATOMS, f"unknown MMA atom {self.atom!r}")
        self._need(_ints(self.warps, 3) and _ints(self.tile, 3), "warps and tile need 3 positive ints")
        self._need(isinstance(self.replicas, int) and self.replicas >= 1, "replicas must be a positive int")

    @property
    def threads(self) -> int:
        return 32 * self.warps[0] * self.warps[1] * self.warps[2]


@dataclass(frozen=True, kw_only=True)
class SmemLayoutOp(Op):
    """Shared layout: `atom` (rows, cols) row-major under Swizzle<B,M,S>, tiled to `shape` (+ stage dim)."""

    name: str
    swizzle: tuple[int, int, int]
    atom: tuple[int, int]
    shape: tuple[int, ...]
    defines = ("name",)
    declared_effects = PURE

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
    declared_effects = PURE

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
    # May overlap buffers that are dead when it is first written (epilogue staging).
    reuse: bool = False
    defines = ("name",)
    declared_effects = PURE

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
    declared_effects = PURE

    def check(self) -> None:
        check_ident(self.of, "tensor")
        check_ident(self.layout, "layout")


@dataclass(frozen=True, kw_only=True)
class GlobalTensorOp(Op):
    """Global tensor at `ptr + offset` with `rows` rows of `cols` contiguous elements (cols=0: a vector).
    `rows_at` (an expression over `row`): a gathered tensor, its row `row` stored at that row of the
    storage, which has `storage_rows` rows (a storage row outside them reads as zeros); copies that read
    it say `gather` (AsyncCopyOp) and shift each row's address there (tlc/ir/row_maps.py)."""

    name: str
    dtype: str
    ptr: Expr
    offset: Expr
    rows: Expr
    cols: int
    row_stride: Expr
    rows_at: Expr | None = None
    storage_rows: Expr | None = None
    defines = ("name",)
    declared_effects = PURE
    quiet_defaults: ClassVar[tuple[str, ...]] = ("rows_at", "storage_rows")
    binds: ClassVar[dict[str, tuple[str, ...]]] = {"rows_at": ("row",)}   # the row map's own variable

    def check(self) -> None:
        self._need(self.dtype in DTYPES, f"dtype {self.dtype!r}")
        self._need((self.rows_at is None) == (self.storage_rows is None), "rows_at and storage_rows go together")
        self._need(self.rows_at is None or self.cols > 0, "a gathered tensor has columns")


@dataclass(frozen=True, kw_only=True)
class GlobalTileOp(Op):
    """`local_tile(src, tile, coord)`; a coord of `_` keeps that tile mode for iteration.
    `row_shift`: the tiles start that many rows before the tensor's first row (rows counted from
    the end: tiles · tile rows − rows), so tile r covers rows r · tile − row_shift onwards."""

    name: str
    src: str
    tile: tuple[int, ...]
    coord: tuple[Expr, ...]
    row_shift: Expr | None = None
    defines = ("name",)
    declared_effects = PURE

    def check(self) -> None:
        check_ident(self.src, "tensor")
        self._need(_ints(self.tile) and len(self.tile) == len(self.coord), "tile and coord ranks differ")


@dataclass(frozen=True, kw_only=True)
class IdentityTileOp(Op):
    """Coordinates (row, col) of a tile: partitioned like data, used for bounds predicates."""

    name: str
    shape: tuple[int, int]
    defines = ("name",)
    declared_effects = PURE

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
    declared_effects = PURE

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
    declared_effects = PURE

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
    declared_effects = PURE

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
    declared_effects = PURE

    def check(self) -> None:
        check_ident(self.like, "fragment")
