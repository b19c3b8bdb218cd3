"""Kernel-IR ops of the Hopper path (sm_90a): TMA descriptors and bulk tensor loads, mbarrier rings,
wgmma (SS and RS) with its fences and commit groups, warp-group roles with setmaxnreg, named barriers.

Emitted by `tlc.backend_cute.emit_sm90`; descriptors are encoded at launch by `tlc.backend_cute.launch`.
`lower-tile-ops{arch=sm_90a}` produces the wgmma ops (with cp.async copies); docs/hopper.md says how
the TMA, mbarrier and warp-role ops will be used.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from tlc.diagnostics import fail
from tlc.kir.base import DTYPES, Op, _ints, walk
from tlc.kir.effects import PURE, Effect, EffectDecl, Effects
from tlc.kir.expr import Expr, Var, check_ident
from tlc.kir.ops_decl import KernelOp, ParamsOp, ProgramOp

SWIZZLE_BYTES = (0, 32, 64, 128)    # TMA swizzle modes = the GMMA shared-layout atoms' row widths
MMA_SOURCES = ("SS", "RS")           # wgmma operands: both from shared memory, or A from registers
ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
WARP_GROUP = 128                     # threads of one warp group: the unit of wgmma and setmaxnreg
REGISTER_FILE = 65536                # 32-bit registers per SM (and per CTA) on sm_90
MAX_THREAD_REGS = 248                # the most registers a thread starts with (255, in 8-register steps)


def entry_registers(threads: int) -> int:
    """Registers each thread of a `threads`-thread, one-block-per-SM kernel starts with: the cap
    `__launch_bounds__(threads, 1)` gives, which ptxas takes as the entry count when the kernel uses
    setmaxnreg (a 640-thread kernel starts at 96). The block's register pool is this times `threads`:
    setmaxnreg.inc past it waits for registers no warp will free, and the kernel hangs."""
    return min(MAX_THREAD_REGS, REGISTER_FILE // threads // 8 * 8)


# ----------------------------------------------------------------------------- program level
@dataclass(frozen=True, kw_only=True)
class TmaParamsOp(ParamsOp):
    """The launch struct with TMA descriptor slots: `fields` as `ParamsOp`, then one 128-byte,
    64-byte aligned `CUtensorMap` per name in `descriptors`, filled by the launcher. Kernels using it
    take it as `const __grid_constant__`, so a descriptor's address is a parameter-space address.
        TmaParamsOp(name=gemm_params, fields=((A_ptr, "ptr<bf16>"), (M, i32)), descriptors=(tma_A,))"""

    descriptors: tuple[str, ...] = ()

    def check(self) -> None:
        super().check()
        names = [n for n, _ in self.fields]
        for d in self.descriptors:
            check_ident(d, "TMA descriptor slot")
            self._need(d not in names, f"descriptor slot {d} has the name of a field")
        self._need(len(set(self.descriptors)) == len(self.descriptors), "names a descriptor slot twice")


# ----------------------------------------------------------------------------- kernel level
@dataclass(frozen=True, kw_only=True)
class Sm90KernelOp(KernelOp):
    """A kernel for sm_90a: like `KernelOp`, with the parameter struct `__grid_constant__` (TMA
    descriptors are read in place) and the Hopper headers. `min_blocks` = 1 gives the register cap
    setmaxnreg needs (HOPPER.md)."""

    def check(self) -> None:
        super().check()
        for op in walk(self):
            if isinstance(op, WarpSpecializeOp):
                self._need(self.min_blocks == 1, "uses setmaxnreg: needs min_blocks=1 (a register cap at entry)")
                self._need(self.threads % WARP_GROUP == 0 and self.threads > WARP_GROUP,
                           f"threads={self.threads}: warp specialization needs 2 or more whole warp groups")
                consumers = self.threads - op.producer_threads
                total = op.producer_regs * op.producer_threads + op.consumer_regs * consumers
                pool = entry_registers(self.threads) * self.threads
                self._need(total <= pool,
                           f"asks {op.producer_regs}x{op.producer_threads} + {op.consumer_regs}x{consumers} = "
                           f"{total} registers; {self.threads} threads start with {entry_registers(self.threads)} "
                           f"each, a pool of {pool} (setmaxnreg.inc past it never returns)")


@dataclass(frozen=True, kw_only=True)
class TmaDescriptorOp(Op):
    """Names the descriptor in slot `name` of the kernel's `TmaParamsOp`: a tiled TMA map over the
    global tensor at `ptr` (a pointer field), `box` elements per copy (outermost first, the tensor's
    rank), `swizzle` bytes (0/32/64/128, matching the shared layout). The launcher encodes it from the
    torch tensor bound to `ptr` (its shape and strides); here it binds `name` to the slot's address.
        TmaDescriptorOp(name=tma_A, ptr=`p.A_ptr`, dtype=bf16, box=(128, 64), swizzle=128)"""

    name: str
    ptr: Expr
    dtype: str
    box: tuple[int, ...]
    swizzle: int = 128
    defines = ("name",)
    declared_effects = PURE

    def check(self) -> None:
        self._need(isinstance(self.ptr, Var) and self.ptr.name.startswith("p."),
                   f"ptr must name a pointer field `p.<field>`, got `{self.ptr}`")
        self._need(self.dtype in DTYPES, f"dtype {self.dtype!r}")
        self._need(_ints(self.box) and 1 <= len(self.box) <= 5, "box needs 1 to 5 positive ints")
        self._need(all(b <= 256 for b in self.box), f"box {self.box}: TMA boxes are at most 256 per dimension")
        self._need(self.swizzle in SWIZZLE_BYTES, f"swizzle {self.swizzle} not in {SWIZZLE_BYTES}")
        inner = self.box[-1] * ELEMENT_BYTES[self.dtype]
        self._need(inner % 16 == 0, f"the box's inner extent is {inner} bytes; TMA needs a multiple of 16")
        if self.swizzle:
            self._need(inner <= self.swizzle, f"the box's inner extent ({inner} bytes) exceeds the "
                       f"{self.swizzle}-byte swizzle span: split the tile into boxes of {self.swizzle} bytes")

    @property
    def field(self) -> str:
        return self.ptr.name[2:]

    @property
    def box_bytes(self) -> int:
        n = ELEMENT_BYTES[self.dtype]
        for b in self.box:
            n *= b
        return n


@dataclass(frozen=True, kw_only=True)
class GmmaSmemLayoutOp(Op):
    """A shared layout wgmma and TMA both accept: CuTe's `GMMA::Layout_K_SW<swizzle>_Atom<dtype>`
    (`k_major`: cols contiguous) or `Layout_MN_…` tiled to `shape` (rows, cols[, stages]); rows are
    M or N, cols K. The buffer holding it must start 1024-byte aligned (the swizzle is by address).
        GmmaSmemLayoutOp(name=sA_layout, dtype=bf16, swizzle=128, shape=(128, 64, 2))"""

    name: str
    dtype: str
    swizzle: int
    shape: tuple[int, ...]
    k_major: bool = True
    defines = ("name",)
    declared_effects = PURE

    def check(self) -> None:
        self._need(self.dtype in DTYPES, f"dtype {self.dtype!r}")
        self._need(self.swizzle in SWIZZLE_BYTES, f"swizzle {self.swizzle} not in {SWIZZLE_BYTES}")
        self._need(_ints(self.shape) and len(self.shape) in (2, 3), "shape needs (rows, cols[, stages])")
        span = max(self.swizzle, 16) // ELEMENT_BYTES[self.dtype]   # elements along the contiguous mode
        rows, cols = self.shape[0], self.shape[1]
        atom = (8, span) if self.k_major else (span, 8)
        self._need(rows % atom[0] == 0 and cols % atom[1] == 0,
                   f"shape {self.shape[:2]} is not a multiple of the {self.swizzle}-byte atom {atom}")


@dataclass(frozen=True, kw_only=True)
class MbarrierOp(Op):
    """`count` mbarriers (one per stage of a ring) at byte `offset_bytes` of shared memory."""

    name: str
    count: int
    offset_bytes: int
    defines = ("name",)
    declared_effects = PURE

    def check(self) -> None:
        self._need(isinstance(self.count, int) and self.count >= 1, "count must be >= 1")
        self._need(self.offset_bytes % 8 == 0, f"offset {self.offset_bytes} is not 8-byte aligned")


@dataclass(frozen=True, kw_only=True)
class MbarrierInitOp(Op):
    """Initialise every barrier of `bar` to expect `arrivals` arrivals per phase, then fence the
    init (fence.mbarrier_init). Run by one thread, followed by a CTA barrier before any use."""

    bar: str
    arrivals: int
    declared_effects = EffectDecl(kinds=Effect.MBARRIER)

    def check(self) -> None:
        check_ident(self.bar, "mbarrier")
        self._need(isinstance(self.arrivals, int) and self.arrivals >= 1, "arrivals must be >= 1")


@dataclass(frozen=True, kw_only=True)
class MbarrierArriveExpectTxOp(Op):
    """Arrive on `bar[stage]` and expect `bytes` more bytes of transactions (the TMA loads of that stage)."""

    bar: str
    stage: Expr
    bytes: int
    declared_effects = EffectDecl(kinds=Effect.MBARRIER)

    def check(self) -> None:
        check_ident(self.bar, "mbarrier")
        self._need(isinstance(self.bytes, int) and 0 < self.bytes < 2**20, f"bytes={self.bytes}")


@dataclass(frozen=True, kw_only=True)
class MbarrierArriveOp(Op):
    """Arrive on `bar[stage]` (a consumer releasing a stage to the producer)."""

    bar: str
    stage: Expr
    declared_effects = EffectDecl(kinds=Effect.MBARRIER)

    def check(self) -> None:
        check_ident(self.bar, "mbarrier")


@dataclass(frozen=True, kw_only=True)
class MbarrierWaitOp(Op):
    """Wait until the phase of `bar[stage]` with parity `phase` (0/1) has completed. A fresh
    barrier counts its phase "1" as completed, so a producer's first wait on an empty ring passes."""

    bar: str
    stage: Expr
    phase: Expr
    declared_effects = EffectDecl(kinds=Effect.MBARRIER)

    def check(self) -> None:
        check_ident(self.bar, "mbarrier")


@dataclass(frozen=True, kw_only=True)
class TmaPrefetchOp(Op):
    """`prefetch.tensormap` of descriptor `desc`: its 128 bytes move toward the SM before the first
    TMA copy needs them, so that copy does not wait on the descriptor's fetch."""

    desc: str
    declared_effects = EffectDecl(kinds=Effect.TMA)

    def check(self) -> None:
        check_ident(self.desc, "TMA descriptor")


@dataclass(frozen=True, kw_only=True)
class TmaLoadOp(Op):
    """One TMA bulk tensor load (`cp.async.bulk.tensor`, SM90_TMA_LOAD_<rank>D) of the box of `desc`
    at element coordinates `coord` (outermost first) into stage `stage` of shared buffer `dst`, at
    element (row, col) = `dst_coord` of the tile; completes as transaction bytes on `bar[stage]`.
    Issued by one thread; rows past the tensor's end are zero-filled by the hardware."""

    desc: str
    bar: str
    stage: Expr
    dst: str
    coord: tuple[Expr, ...]
    dst_coord: tuple[int, int] = (0, 0)
    declared_effects = EffectDecl(writes=("dst",), tma_writes=("dst",), kinds=Effect.TMA | Effect.MBARRIER)

    def check(self) -> None:
        for name, what in ((self.desc, "TMA descriptor"), (self.bar, "mbarrier"), (self.dst, "shared buffer")):
            check_ident(name, what)
        self._need(1 <= len(self.coord) <= 5 and all(isinstance(c, Expr) for c in self.coord),
                   "coord needs 1 to 5 expressions")
        self._need(len(self.dst_coord) == 2 and all(isinstance(c, int) and c >= 0 for c in self.dst_coord)
                   and self.dst_coord[0] % 8 == 0, f"dst_coord {self.dst_coord}: rows must be a multiple of 8")


@dataclass(frozen=True, kw_only=True)
class TmaPrefetchTileOp(Op):
    """`cp.async.bulk.prefetch.tensor` (SM90_TMA_LOAD_<rank>D::PREFETCH) of the box of `desc` at element
    coordinates `coord` (outermost first) into L2: no shared memory, no barrier, nothing waits on it — a
    hint that a later TMA load of that box (another CTA's) finds it in L2. Boxes past the tensor's end
    fetch nothing there."""

    desc: str
    coord: tuple[Expr, ...]
    declared_effects = EffectDecl(kinds=Effect.TMA)

    def check(self) -> None:
        check_ident(self.desc, "TMA descriptor")
        self._need(1 <= len(self.coord) <= 5 and all(isinstance(c, Expr) for c in self.coord),
                   "coord needs 1 to 5 expressions")


@dataclass(frozen=True, kw_only=True)
class TmaStoreOp(Op):
    """One TMA bulk tensor store (`cp.async.bulk.tensor` global ← shared, SM90_TMA_STORE_<rank>D) of the
    box of `desc` from shared buffer `src` at element (row, col) = `src_coord` to element coordinates
    `coord` (outermost first); rows and columns past the tensor's end are not written. Issued by one
    thread once every writer has fenced the async proxy and passed a barrier; `TmaStoreWaitOp` then
    waits until the stores have read shared memory."""

    desc: str
    src: str
    coord: tuple[Expr, ...]
    src_coord: tuple[int, int] = (0, 0)
    declared_effects = EffectDecl(reads=("src",), shared_reads=("src",), kinds=Effect.TMA | Effect.GLOBAL_WRITE)

    def check(self) -> None:
        check_ident(self.desc, "TMA descriptor")
        check_ident(self.src, "shared buffer")
        self._need(1 <= len(self.coord) <= 5 and all(isinstance(c, Expr) for c in self.coord),
                   "coord needs 1 to 5 expressions")
        self._need(len(self.src_coord) == 2 and all(isinstance(c, int) and c >= 0 for c in self.src_coord),
                   f"src_coord {self.src_coord}")


@dataclass(frozen=True, kw_only=True)
class TmaStoreWaitOp(Op):
    """This thread's TMA stores so far form one bulk group; wait until the group has read shared
    memory (`cp.async.bulk.commit_group`, `cp.async.bulk.wait_group.read 0`), so the tile may be
    reused or the block may end."""


# ----------------------------------------------------------------------------- wgmma
    declared_effects = EffectDecl(kinds=Effect.TMA | Effect.ASYNC_GROUP)
@dataclass(frozen=True, kw_only=True)
class WgmmaTiledMmaOp(Op):
    """A TiledMMA of wgmma atoms (fp32 accumulators) picked by CuTe's `GMMA::ss_op_selector` (kind
    SS: both operands from shared memory) or `rs_op_selector` (kind RS: A from registers) for a warp
    group's `tile` (M, N, K), repeated over `warp_groups` (M, N, 1). `thread_index` is the thread's
    index among the MMA's warp groups; `a_k_major`/`b_k_major` false: that operand is MN-major.
        WgmmaTiledMmaOp(name=tiled_mma, dtype=bf16, kind=SS, tile=(64, 128, 64), warp_groups=(2, 1, 1),
                        thread_slice=thr_mma, thread_index=`threadIdx.x - 128`)"""

    name: str
    dtype: str
    kind: str
    tile: tuple[int, int, int]
    warp_groups: tuple[int, int, int]
    thread_slice: str
    thread_index: Expr = Var("threadIdx.x")
    a_k_major: bool = True
    b_k_major: bool = True
    defines = ("name", "thread_slice")
    declared_effects = PURE

    def check(self) -> None:
        self._need(self.dtype in ("bf16", "fp16"), f"dtype {self.dtype!r}: wgmma here takes bf16 or fp16")
        self._need(self.kind in MMA_SOURCES, f"kind {self.kind!r} not in {MMA_SOURCES}")
        self._need(_ints(self.tile, 3) and _ints(self.warp_groups, 3), "tile and warp_groups need 3 positive ints")
        m, n, k = self.tile
        self._need(m % 64 == 0 and k % 16 == 0 and n % 8 == 0 and n <= 256,
                   f"tile {self.tile}: wgmma needs M a multiple of 64, N a multiple of 8 up to 256, K of 16")
        self._need(self.warp_groups[2] == 1, "warp_groups along K must be 1")
        self._need(self.kind == "SS" or self.a_k_major, "an A operand from registers is K-major")

    @property
    def threads(self) -> int:
        return WARP_GROUP * self.warp_groups[0] * self.warp_groups[1]


@dataclass(frozen=True, kw_only=True)
class WgmmaFragmentOp(Op):
    """Operand fragment of wgmma `mma`: role A/B from the partitioned shared tensor `src` (GMMA
    descriptors; A of an RS MMA: registers shaped like one stage of `src`), or C: fp32 accumulators
    of `shape` (M, N)."""

    name: str
    mma: str
    role: str
    src: Expr | None = None
    shape: tuple[int, ...] = ()
    defines = ("name",)
    declared_effects = PURE

    def check(self) -> None:
        check_ident(self.mma, "wgmma tiled mma")
        self._need(self.role in ("A", "B", "C"), f"role {self.role!r}")
        self._need((self.role == "C") == (self.src is None), "A/B fragments need src, C fragments a shape")
        if self.role == "C":
            self._need(_ints(self.shape, 2), "C fragment needs shape (M, N)")


@dataclass(frozen=True, kw_only=True)
class WgmmaFenceOperandOp(Op):
    """`warpgroup_fence_operand` on register fragments: keeps the compiler from moving their reads
    and writes across the asynchronous wgmma (before the arrive and after the wait)."""

    targets: tuple[str, ...]
    declared_effects = EffectDecl(reads=("targets",), writes=("targets",), kinds=Effect.WGMMA)

    def check(self) -> None:
        self._need(bool(self.targets), "needs at least one fragment")
        for t in self.targets:
            check_ident(t, "fragment")


@dataclass(frozen=True, kw_only=True)
class WgmmaArriveOp(Op):
    """`wgmma.fence`: register and shared operands written before are visible to the next wgmma."""

    declared_effects = EffectDecl(kinds=Effect.WGMMA)


@dataclass(frozen=True, kw_only=True)
class WgmmaOp(Op):
    """acc (+)= a·b with wgmma `mma` over every k-block of the operands (asynchronous: complete
    after a `WgmmaWaitOp`). `a`, `b`: fragments or stage slices of them (`tCrA[_, _, _, stage]`).
    `zero_init`: the first k-block overwrites acc instead of adding to it."""

    mma: str
    acc: str
    a: Expr
    b: Expr
    zero_init: bool = False
    # Shared buffers its descriptors read (insert-sync and pipeline read them; the emitter does not).
    reads: tuple[str, ...] = ()
    declared_effects = EffectDecl(reads=("a", "b", "acc"), writes=("acc",), shared_reads=("reads",),
                                  kinds=Effect.WGMMA)

    def effects(self) -> Effects:
        """`zero_init` overwrites `acc` without reading it."""
        own = super().effects()
        return replace(own, reads=own.reads - {self.acc}) if self.zero_init else own

    def check(self) -> None:
        check_ident(self.mma, "wgmma tiled mma")
        check_ident(self.acc, "fragment")
        for b in self.reads:
            check_ident(b, "shared buffer")


@dataclass(frozen=True, kw_only=True)
class FenceProxyAsyncOp(Op):
    """`fence.proxy.async.shared::cta`: this thread's shared-memory writes through the generic proxy
    (cp.async results, after their wait) become visible to the async proxy that wgmma and TMA read
    through. `insert-sync` puts it between a cp.async wait and the barrier before a wgmma reads."""

    declared_effects = EffectDecl(kinds=Effect.PROXY_FENCE)


@dataclass(frozen=True, kw_only=True)
class WgmmaCommitOp(Op):
    """`wgmma.commit_group`: the wgmmas issued since the last commit form one group."""

    declared_effects = EffectDecl(kinds=Effect.WGMMA | Effect.ASYNC_GROUP)


@dataclass(frozen=True, kw_only=True)
class WgmmaWaitOp(Op):
    """`wgmma.wait_group pending`: all but the newest `pending` groups have completed."""

    pending: int = 0
    declared_effects = EffectDecl(kinds=Effect.WGMMA | Effect.ASYNC_GROUP)

    def check(self) -> None:
        self._need(isinstance(self.pending, int) and 0 <= self.pending <= 7, "pending must be 0..7")


@dataclass(frozen=True, kw_only=True)
class CarryOp(Op):
    """`target` (a register fragment declared before a loop) takes the values of `src` (same shape and
    type): a value computed in one trip and read by the next, as `overlap-gemms` carries P from a trip's
    softmax to the next trip's P·V wgmma."""

    target: str
    src: str
    declared_effects = EffectDecl(reads=("src",), writes=("target",))

    def check(self) -> None:
        check_ident(self.target, "fragment")
        check_ident(self.src, "fragment")


# ----------------------------------------------------------------------------- roles and barriers
@dataclass(frozen=True, kw_only=True)
class WarpSpecializeOp(Op):
    """Warp-group roles: the first `producer_threads` threads (whole warp groups; the last ones when
    `producer_last`, so the consumers keep thread indices from 0) run `producer` with at most
    `producer_regs` registers (setmaxnreg.dec), the others run `consumer` with `consumer_regs`
    (setmaxnreg.inc): one if/else, as setmaxnreg needs. `group` names the thread's warp-group index
    (warp-uniform)."""

    group: str
    producer_regs: int
    consumer_regs: int
    producer: tuple[Op, ...]
    consumer: tuple[Op, ...]
    producer_threads: int = WARP_GROUP
    producer_last: bool = False
    defines = ("group",)
    regions = ("producer", "consumer")
    declared_effects = PURE

    def check(self) -> None:
        for regs, what in ((self.producer_regs, "producer_regs"), (self.consumer_regs, "consumer_regs")):
            self._need(isinstance(regs, int) and 24 <= regs <= 256 and regs % 8 == 0,
                       f"{what}={regs}: setmaxnreg takes a multiple of 8 in 24..256")
        self._need(self.producer_regs <= self.consumer_regs, "the producer gives registers away, not the consumers")
        self._need(self.producer_threads % WARP_GROUP == 0 and self.producer_threads > 0,
                   f"producer_threads={self.producer_threads} is not whole warp groups")


@dataclass(frozen=True, kw_only=True)
class NamedBarrierOp(Op):
    """`bar.sync`/`bar.arrive` (when `arrive_only`) on user barrier `id` among `threads` threads, e.g.
    the consumer warp groups only. User ids 0..7 are hardware barriers 8..15 (CUTLASS's NamedBarrier
    keeps 0..7, and 0 is __syncthreads'); `id` may be an expression of the warp group (ping-pong)."""

    id: int | Expr
    threads: int
    arrive_only: bool = False
    declared_effects = EffectDecl(kinds=Effect.BARRIER)

    def check(self) -> None:
        self._need(isinstance(self.id, Expr) or (isinstance(self.id, int) and 0 <= self.id <= 7),
                   f"id {self.id} not in 0..7")
        self._need(isinstance(self.threads, int) and self.threads > 0 and self.threads % 32 == 0,
                   f"threads={self.threads} is not whole warps")


# ----------------------------------------------------------------------------- tile scheduler
TILE_COUNTER = "tile_counter"   # a persistent kernel's parameter field (ptr<i32>): the launcher zeroes it per launch
RESIDENT_CTAS_FIELD = "resident_ctas"  # a parameter field (i32) the launcher fills when a TmaPrefetchTileOp reads it: SMs x occupancy

@dataclass(frozen=True, kw_only=True)
class TileSlotOp(Op):
    """An int at byte `offset_bytes` of shared memory through which a persistent kernel's producer
    hands the consumers the number of the tile it loads next (written before it arms that tile's
    barrier, read after the consumers' wait on it)."""

    name: str
    offset_bytes: int
    defines = ("name",)
    declared_effects = PURE

    def check(self) -> None:
        self._need(self.offset_bytes % 4 == 0, f"offset {self.offset_bytes} is not 4-byte aligned")


@dataclass(frozen=True, kw_only=True)
class TileSlotStoreOp(Op):
    """`*slot = value;` (the producer)."""

    slot: str
    value: Expr
    declared_effects = EffectDecl(writes=("slot",), shared_writes=("slot",))

    def check(self) -> None:
        check_ident(self.slot, "tile slot")


@dataclass(frozen=True, kw_only=True)
class TileSlotLoadOp(Op):
    """`const int name = *slot;` (the consumers, after the barrier the producer armed behind the store)."""

    name: str
    slot: str
    defines = ("name",)
    declared_effects = EffectDecl(reads=("slot",), shared_reads=("slot",))

    def check(self) -> None:
        check_ident(self.slot, "tile slot")


@dataclass(frozen=True, kw_only=True)
class AtomicAddOp(Op):
    """`const int name = atomicAdd(ptr, value);` on a global int (a launch's tile counter, zeroed by the
    launcher before each launch)."""

    name: str
    ptr: Expr
    value: Expr
    defines = ("name",)
    declared_effects = EffectDecl(reads=("ptr",), writes=("ptr",), kinds=Effect.GLOBAL_WRITE)


SM90_OP_CLASSES: tuple[type[Op], ...] = (
    TmaParamsOp, Sm90KernelOp, TmaDescriptorOp, GmmaSmemLayoutOp, MbarrierOp, MbarrierInitOp,
    MbarrierArriveExpectTxOp, MbarrierArriveOp, MbarrierWaitOp, TmaPrefetchOp, TmaPrefetchTileOp, TmaLoadOp, TmaStoreOp, TmaStoreWaitOp,
    WgmmaTiledMmaOp, WgmmaFragmentOp,
    WgmmaFenceOperandOp, WgmmaArriveOp, WgmmaOp, FenceProxyAsyncOp, WgmmaCommitOp, WgmmaWaitOp, CarryOp,
    WarpSpecializeOp, NamedBarrierOp, TileSlotOp, TileSlotStoreOp, TileSlotLoadOp, AtomicAddOp)


def tma_descriptors(program: ProgramOp) -> dict[str, dict[str, TmaDescriptorOp]]:
    """Struct name → slot → the descriptor its kernels declare for it. Every slot must be declared,
    only slots of the kernel's own struct, and kernels sharing a slot must agree."""
    structs = {op.name: op for op in program.body if isinstance(op, TmaParamsOp)}
    out: dict[str, dict[str, TmaDescriptorOp]] = {name: {} for name in structs}
    for kernel in program.kernels():
        for op in walk(kernel):
            if not isinstance(op, TmaDescriptorOp):
                continue
            struct = structs.get(kernel.params)
            if struct is None or op.name not in struct.descriptors:
                raise fail(f"kernel IR: TmaDescriptorOp {op.name} has no slot in {kernel.params}; list it in "
                           f"the TmaParamsOp's descriptors", op.loc)
            seen = out[kernel.params].setdefault(op.name, op)
            if (seen.ptr, seen.dtype, seen.box, seen.swizzle) != (op.ptr, op.dtype, op.box, op.swizzle):
                raise fail(f"kernel IR: two kernels describe descriptor slot {op.name} differently", op.loc)
    for name, struct in structs.items():
        for slot in struct.descriptors:
            if slot not in out[name]:
                raise fail(f"kernel IR: descriptor slot {slot} of {name} is declared by no TmaDescriptorOp", struct.loc)
    return out
