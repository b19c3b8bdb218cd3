"""Hopper (sm_90a) handlers of the CuTe emitter: one per op of `tlc.kir.ops_sm90`, each spelled with
CuTe's SM90 atoms (SM90_TMA_LOAD_<n>D, GMMA op selectors, warpgroup_*) and CUTLASS's barrier classes.

`CuteEmitter` inherits `Sm90Emitter`; subclassing registers these handlers on its `emit` dispatcher.
"""
from __future__ import annotations

import functools
import string
from importlib import resources

from tlc.backend_cute.cpp import CPP_DTYPE, CPP_PARAM, cpp_expr, static_shape
from tlc.backend_cute.handler_table import HandlerTable
from tlc.diagnostics import fail
from tlc.kir.base import Op
from tlc.kir.ops_decl import SharedBufferOp
from tlc.kir.ops_sm90 import (AtomicAddOp, CarryOp, FenceProxyAsyncOp, GmmaSmemLayoutOp, MbarrierArriveExpectTxOp,
                              MbarrierArriveOp, MbarrierInitOp, MbarrierOp, MbarrierWaitOp, NamedBarrierOp,
                              Sm90KernelOp, TileSlotLoadOp, TileSlotOp, TileSlotStoreOp, TmaDescriptorOp, TmaLoadOp, TmaPrefetchOp,
                              TmaPrefetchTileOp,
                              TmaParamsOp, TmaStoreOp, TmaStoreWaitOp, WarpSpecializeOp, WgmmaArriveOp, WgmmaCommitOp, WgmmaFenceOperandOp, WgmmaFragmentOp,
                              WgmmaOp, WgmmaTiledMmaOp, WgmmaWaitOp, WARP_GROUP)

_BARRIER = "cutlass::arch::ClusterBarrier"
_TX_BARRIER = "cutlass::arch::ClusterTransactionBarrier"
_SWIZZLE_ATOM = {0: "INTER", 32: "SW32", 64: "SW64", 128: "SW128"}

_TABLE = HandlerTable("Sm90Emitter")
_handles = _TABLE.handles


@functools.lru_cache(maxsize=None)
def _template(name: str) -> string.Template:
    return string.Template(resources.files("tlc.backend_cute").joinpath("templates", name).read_text())


def _major(k_major: bool) -> str:
    return "GMMA::Major::K" if k_major else "GMMA::Major::MN"


def wgmma_tiled_mma_type(op: WgmmaTiledMmaOp) -> str:
    """The C++ type of a WgmmaTiledMmaOp's TiledMMA (the emitter's, and the layout cross-check's)."""
    t = CPP_DTYPE[op.dtype]
    selector = "ss_op_selector" if op.kind == "SS" else "rs_op_selector"
    atom = (f"GMMA::{selector}<{t}, {t}, float, {static_shape(op.tile)}, {_major(op.a_k_major)}, "
            f"{_major(op.b_k_major)}>()")
    return f"decltype(make_tiled_mma({atom}, Layout<{static_shape(op.warp_groups)}>{{}}))"


class Sm90Emitter(_TABLE.mixin_base()):
    """Mixin of `CuteEmitter` (it provides `w`, `symbols`, `_at` and the `emit` dispatcher)."""


    def _sm90_headers(self) -> None:
        """The Hopper includes, once, at file scope before the first sm_90a struct or kernel."""
        if not getattr(self, "_sm90_included", False):
            self.w.raw(_template("sm90_headers.cuh").substitute())
            self.w.raw(_template("preamble_sm90.cuh").substitute())
            self._sm90_included = True

    def _sym(self, name: str, kind: type[Op] | tuple[type[Op], ...], op: Op) -> Op:
        found = self.symbols.get(name)
        if not isinstance(found, kind):
            want = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            raise fail(f"emitter: {type(op).__name__} needs `{name}` to be a {want}", op.loc)
        return found

    # ------------------------------------------------------------------ program and kernel
    @_handles(TmaParamsOp)
    def _params(self, op: TmaParamsOp) -> None:
        self._sm90_headers()
        self._at(op)
        with self.w.block(f"struct {op.name}", "};"):
            for fname, ftype in op.fields:
                self.w.line(f"{CPP_PARAM[ftype]} {fname};")
            for slot in op.descriptors:
                self.w.line(f"alignas(64) cute::TmaDescriptor {slot};  // CUtensorMap, encoded at launch")

    @_handles(Sm90KernelOp)
    def _kernel(self, op: Sm90KernelOp) -> None:
        self._sm90_headers()
        self._kernel_threads = op.threads   # where a producer_last WarpSpecializeOp's producers start
        self._kernel_function(op, "kernel_open_sm90.cuh")

    # ------------------------------------------------------------------ TMA and shared layouts
    @_handles(TmaDescriptorOp)
    def _descriptor(self, op: TmaDescriptorOp) -> None:
        self._at(op)
        box = "x".join(str(b) for b in op.box)
        self.w.line(f"cute::TmaDescriptor const* {op.name} = &p.{op.name};  // over {op.ptr}: {op.dtype} boxes "
                    f"{box}, swizzle {op.swizzle} B")

    @_handles(GmmaSmemLayoutOp)
    def _gmma_layout(self, op: GmmaSmemLayoutOp) -> None:
        self._at(op)
        atom = f"GMMA::Layout_{'K' if op.k_major else 'MN'}_{_SWIZZLE_ATOM[op.swizzle]}_Atom<{CPP_DTYPE[op.dtype]}>"
        self.w.line(f"using {op.name} = decltype(tile_to_shape({atom}{{}}, {static_shape(op.shape)}{{}}));")

    def _tma_coords(self, op: TmaLoadOp | TmaStoreOp | TmaPrefetchTileOp) -> str:
        """A TMA copy's coordinates as the TMA unit takes them, innermost first (one per box mode)."""
        desc = self._sym(op.desc, TmaDescriptorOp, op)
        if len(op.coord) != len(desc.box):
            raise fail(f"emitter: {type(op).__name__} gives {len(op.coord)} coordinates for the rank-{len(desc.box)} "
                       f"descriptor {op.desc}", op.loc)
        return ", ".join(cpp_expr(c) for c in reversed(op.coord))

    @_handles(TmaPrefetchOp)
    def _tma_prefetch(self, op: TmaPrefetchOp) -> None:
        self._at(op)
        self._sym(op.desc, TmaDescriptorOp, op)
        self.w.line(f"cute::prefetch_tma_descriptor({op.desc});")

    @_handles(TmaPrefetchTileOp)
    def _tma_prefetch_tile(self, op: TmaPrefetchTileOp) -> None:
        self._at(op)
        coords = self._tma_coords(op)
        self.w.line(f"SM90_TMA_LOAD_{len(op.coord)}D::PREFETCH::copy({op.desc}, {coords});")

    @_handles(TmaLoadOp)
    def _tma_load(self, op: TmaLoadOp) -> None:
        self._at(op)
        coords = self._tma_coords(op)
        buffer = self._sym(op.dst, SharedBufferOp, op)
        layout = self.symbols.get(buffer.layout)
        rank = len(getattr(layout, "shape", ()))
        row, col = op.dst_coord
        where = f"{row}, {col}" + (f", {cpp_expr(op.stage)}" if rank == 3 else "")
        self.w.line(f"SM90_TMA_LOAD_{len(op.coord)}D::copy({op.desc}, &{op.bar}[{cpp_expr(op.stage)}], "
                    f"static_cast<uint64_t>(TMA::CacheHintSm90::EVICT_NORMAL), &{op.dst}({where}), {coords});")

    @_handles(TmaStoreOp)
    def _tma_store(self, op: TmaStoreOp) -> None:
        self._at(op)
        coords = self._tma_coords(op)
        self._sym(op.src, SharedBufferOp, op)
        row, col = op.src_coord
        self.w.line(f"SM90_TMA_STORE_{len(op.coord)}D::copy({op.desc}, &{op.src}({row}, {col}), {coords});")

    @_handles(TmaStoreWaitOp)
    def _tma_store_wait(self, op: TmaStoreWaitOp) -> None:
        self._at(op)
        self.w.line("tma_store_arrive();")
        self.w.line("tma_store_wait<0>();  // the stores have read shared memory")

    # ------------------------------------------------------------------ mbarriers
    @_handles(MbarrierOp)
    def _mbarrier(self, op: MbarrierOp) -> None:
        self._at(op)
        self.w.line(f"uint64_t* {op.name} = reinterpret_cast<uint64_t*>(smem_ + {op.offset_bytes});  "
                    f"// {op.count} mbarrier(s)")

    @_handles(MbarrierInitOp)
    def _mbarrier_init(self, op: MbarrierInitOp) -> None:
        self._at(op)
        bar = self._sym(op.bar, MbarrierOp, op)
        self.w.line("CUTE_UNROLL")
        with self.w.block(f"for (int i = 0; i < {bar.count}; ++i)"):
            self.w.line(f"{_TX_BARRIER}::init(&{op.bar}[i], {op.arrivals});")
        self.w.line("cutlass::arch::fence_barrier_init();")

    @_handles(MbarrierArriveExpectTxOp)
    def _arrive_expect_tx(self, op: MbarrierArriveExpectTxOp) -> None:
        self._at(op)
        self.w.line(f"{_TX_BARRIER}::arrive_and_expect_tx(&{op.bar}[{cpp_expr(op.stage)}], {op.bytes});")

    @_handles(MbarrierArriveOp)
    def _arrive(self, op: MbarrierArriveOp) -> None:
        self._at(op)
        self.w.line(f"{_BARRIER}::arrive(&{op.bar}[{cpp_expr(op.stage)}]);")

    @_handles(MbarrierWaitOp)
    def _wait(self, op: MbarrierWaitOp) -> None:
        self._at(op)
        self.w.line(f"{_BARRIER}::wait(&{op.bar}[{cpp_expr(op.stage)}], {cpp_expr(op.phase)});")

    # ------------------------------------------------------------------ wgmma
    @_handles(WgmmaTiledMmaOp)
    def _wgmma_mma(self, op: WgmmaTiledMmaOp) -> None:
        self._at(op)
        self.w.line(f"using {op.name}_t = {wgmma_tiled_mma_type(op)};")
        self.w.line(f"{op.name}_t {op.name};")
        self.w.line(f"auto {op.thread_slice} = {op.name}.get_slice({cpp_expr(op.thread_index)});")

    @_handles(WgmmaFragmentOp)
    def _wgmma_fragment(self, op: WgmmaFragmentOp) -> None:
        self._at(op)
        mma = self._sym(op.mma, WgmmaTiledMmaOp, op)
        if op.role == "C":
            self.w.line(f"Tensor {op.name} = partition_fragment_C({op.mma}, {static_shape(op.shape)}{{}});")
        elif op.role == "A" and mma.kind == "RS":
            self.w.line(f"Tensor {op.name} = {mma.thread_slice}.partition_fragment_A({cpp_expr(op.src)});")
        else:  # shared-memory operands: GMMA descriptors over the partitioned tile
            self.w.line(f"Tensor {op.name} = {mma.thread_slice}.make_fragment_{op.role}({cpp_expr(op.src)});")

    @_handles(WgmmaFenceOperandOp)
    def _fence_operand(self, op: WgmmaFenceOperandOp) -> None:
        self._at(op)
        for target in op.targets:
            self.w.line(f"warpgroup_fence_operand({target});")

    @_handles(WgmmaArriveOp)
    def _wgmma_arrive(self, op: WgmmaArriveOp) -> None:
        self._at(op)
        self.w.line("warpgroup_arrive();")

    @_handles(WgmmaOp)
    def _wgmma(self, op: WgmmaOp) -> None:
        self._at(op)
        self._sym(op.mma, WgmmaTiledMmaOp, op)
        with self.w.block(""):
            self.w.line(f"auto a_ = {cpp_expr(op.a)};")
            self.w.line(f"auto b_ = {cpp_expr(op.b)};")
            scale = "Zero" if op.zero_init else "One"
            self.w.line(f"{op.mma}.accumulate_ = GMMA::ScaleOut::{scale};")
            self.w.line("CUTE_UNROLL")
            with self.w.block("for (int kb = 0; kb < size<2>(a_); ++kb)"):
                self.w.line(f"cute::gemm({op.mma}, a_(_, _, kb), b_(_, _, kb), {op.acc});")
                if op.zero_init:
                    self.w.line(f"{op.mma}.accumulate_ = GMMA::ScaleOut::One;")

    @_handles(FenceProxyAsyncOp)
    def _fence_proxy_async(self, op: FenceProxyAsyncOp) -> None:
        self._at(op)
        self.w.line("cutlass::arch::fence_view_async_shared();  // cp.async writes -> wgmma's async proxy")

    @_handles(WgmmaCommitOp)
    def _wgmma_commit(self, op: WgmmaCommitOp) -> None:
        self._at(op)
        self.w.line("warpgroup_commit_batch();")

    @_handles(WgmmaWaitOp)
    def _wgmma_wait(self, op: WgmmaWaitOp) -> None:
        self._at(op)
        self.w.line(f"warpgroup_wait<{op.pending}>();")

    @_handles(CarryOp)
    def _carry(self, op: CarryOp) -> None:
        self._at(op)
        self.w.line("CUTE_UNROLL")
        self.w.line(f"for (int i = 0; i < size({op.target}); ++i) {op.target}(i) = {op.src}(i);")

    # ------------------------------------------------------------------ roles and barriers
    @_handles(WarpSpecializeOp)
    def _roles(self, op: WarpSpecializeOp) -> None:
        self._at(op)
        with self.w.block(""):
            self.w.line(f"const int {op.group} = cutlass::canonical_warp_group_idx();")
            if op.producer_last:
                consumers = self._kernel_threads // WARP_GROUP - op.producer_threads // WARP_GROUP
                test = f"{op.group} >= {consumers}"
            else:
                test = f"{op.group} < {op.producer_threads // WARP_GROUP}"
            with self.w.block(f"if ({test})"):
                self.w.line(f"// producer: gives registers away (setmaxnreg.dec {op.producer_regs})")
                self.w.line(f"cutlass::arch::warpgroup_reg_dealloc<{op.producer_regs}>();")
                for child in op.producer:
                    self.emit(child)
            with self.w.block("else"):
                self.w.line(f"// consumers: take them (setmaxnreg.inc {op.consumer_regs})")
                self.w.line(f"cutlass::arch::warpgroup_reg_alloc<{op.consumer_regs}>();")
                for child in op.consumer:
                    self.emit(child)

    # ------------------------------------------------------------------ tile scheduler
    @_handles(TileSlotOp)
    def _tile_slot(self, op: TileSlotOp) -> None:
        self._at(op)
        self.w.line(f"int* {op.name} = reinterpret_cast<int*>(smem_ + {op.offset_bytes});  // the next tile's number")

    @_handles(TileSlotStoreOp)
    def _tile_slot_store(self, op: TileSlotStoreOp) -> None:
        self._at(op)
        self.w.line(f"*{op.slot} = {cpp_expr(op.value)};")

    @_handles(TileSlotLoadOp)
    def _tile_slot_load(self, op: TileSlotLoadOp) -> None:
        self._at(op)
        self.w.line(f"const int {op.name} = *{op.slot};")

    @_handles(AtomicAddOp)
    def _atomic_add(self, op: AtomicAddOp) -> None:
        self._at(op)
        self.w.line(f"const int {op.name} = atomicAdd({cpp_expr(op.ptr)}, {cpp_expr(op.value)});")

    @_handles(NamedBarrierOp)
    def _named_barrier(self, op: NamedBarrierOp) -> None:
        self._at(op)
        call = "arrive" if op.arrive_only else "sync"
        if isinstance(op.id, int):
            self.w.line(f"cutlass::arch::NamedBarrier::{call}({op.threads}, {op.id});  // hardware barrier {op.id + 8}")
        else:
            self.w.line(f"cutlass::arch::NamedBarrier::{call}({op.threads}, {cpp_expr(op.id)});")
