"""CuTe checks fold-partitions' views: for each view of a folded kernel, static_asserts that the
element CuTe's own partition gives two sample threads (tidfrg_S/D, thrfrg_C of the tile's layout,
swizzle included) is the one the view addresses, and that fragments and retiles have CuTe's
layouts. Added to a `CheckProgram` (tlc/layout/crosscheck.py) and compiled by NVRTC, no launch."""
from __future__ import annotations

from pycute import Layout

from tlc.kir import ops as K
from tlc.kir import ops_sm90 as H
from tlc.kir.evaluate import evaluate
from tlc.kir.expr import Index, Var
from tlc.kir.ops_views import (CoordViewOp, GlobalTileViewOp, RegisterFragmentOp, RetileViewOp, StaticSmemLayoutOp,
                               WgmmaDescriptorFragmentOp, WgmmaRegisterFragmentOp,
                               StaticTransposeLayoutOp, ThreadViewOp)
from tlc.layout.crosscheck import CPP_TYPE, CheckProgram, copy_expr, mma_type
from tlc.layout.kir_tensors import TileLayouts, engine_copy, engine_mma
from tlc.layout.cpp import layout_type

_GMMA_ATOM = {0: "INTER", 32: "SW32", 64: "SW64", 128: "SW128"}
GLOBAL_ROW = 1000  # the row stride a global tile gets in the check (NVRTC needs a static one)
GLOBAL_ROWS = 300  # and its rows: not a multiple of any tile



def swizzle(x: int, sw: tuple[int, int, int]) -> int:
    b, m, s = sw
    if b == 0:
        return x
    yyy = ((1 << b) - 1) << (m + s)
    return x ^ ((x & yyy) >> s)


def _smem_type(op: K.SmemLayoutOp) -> str:
    r, c = op.atom
    atom = f"Layout<Shape<Int<{r}>, Int<{c}>>, Stride<Int<{c}>, Int<1>>>{{}}"
    if any(op.swizzle):
        atom = f"composition(Swizzle<{op.swizzle[0]}, {op.swizzle[1]}, {op.swizzle[2]}>{{}}, {atom})"
    shape = ", ".join(f"Int<{d}>" for d in op.shape)
    return f"decltype(tile_to_shape({atom}, Shape<{shape}>{{}}))"


class ViewChecks:
    """Adds one kernel's view checks to `check` (it dedupes and numbers the asserts)."""

    def __init__(self, check: CheckProgram, kernel: K.KernelOp) -> None:
        self.check, self.kernel = check, kernel
        self.tiles = TileLayouts(kernel)
        self.defs = self.tiles.defs
        self.mmas = {op.name: op for op in K.walk(kernel) if isinstance(op, (K.TiledMmaOp, H.WgmmaTiledMmaOp))}
        self.owners = {op.thread_slice: op for op in K.walk(kernel)
                       if isinstance(op, (K.TiledMmaOp, K.TiledCopyOp, H.WgmmaTiledMmaOp))}

    def _layout_cpp(self, name: str) -> str | None:
        op = self.defs.get(name)
        if isinstance(op, K.SmemLayoutOp):
            return self.check.alias(_smem_type(op))
        if isinstance(op, H.GmmaSmemLayoutOp):
            atom = f"GMMA::Layout_{'K' if op.k_major else 'MN'}_{_GMMA_ATOM[op.swizzle]}_Atom<{CPP_TYPE[op.dtype]}>"
            shape = ", ".join(f"Int<{d}>" for d in op.shape)
            return self.check.alias(f"decltype(tile_to_shape({atom}{{}}, Shape<{shape}>{{}}))")
        if isinstance(op, K.SmemTransposeLayoutOp):
            base = self._layout_cpp(op.of)
            cols, rows = op.shape[0], op.shape[1]
            stride = (rows, 1) + ((rows * cols,) if len(op.shape) == 3 else ())
            sh = ", ".join(f"Int<{d}>" for d in op.shape)
            st = ", ".join(f"Int<{d}>" for d in stride)
            view = f"composition({base}{{}}, make_layout(Shape<{sh}>{{}}, Stride<{st}>{{}}))"
            return self.check.alias(f"decltype(get_nonswizzle_portion({view}))" if op.strip_swizzle
                                    else f"decltype({view})")
        return None

    def _tensor(self, e) -> tuple[str, Layout, tuple[int, int, int], str] | None:
        """(C++ layout type, engine layout, swizzle, space) of a tile a view partitions."""
        tile = self.tiles.of(e)
        op = self.defs.get(e.name) if isinstance(e, Var) else None
        if tile is None or op is None:
            return None
        if tile.space == "shared":
            return self._layout_cpp(op.layout), tile.layout, tile.swizzle, "shared"
        if tile.space == "coords":
            sh = ", ".join(f"Int<{d}>" for d in op.shape)
            return self.check.alias(f"decltype(make_identity_layout(Shape<{sh}>{{}}))"), tile.layout, (0, 0, 0), "coords"
        if tile.space == "global":
            r, c = op.tile
            lay = Layout((r, c), (GLOBAL_ROW, 1))
            return f"Layout<Shape<Int<{r}>, Int<{c}>>, Stride<Int<{GLOBAL_ROW}>, Int<1>>>", lay, (0, 0, 0), "global"
        return None

    def _owner(self, op: K.PartitionOp):
        owner = self.owners[op.slice]
        if isinstance(owner, (K.TiledMmaOp, H.WgmmaTiledMmaOp)):
            return self.check.alias(mma_type(owner)), engine_mma(owner), owner
        mma = self.mmas.get(owner.mma)
        mma_t = self.check.alias(mma_type(mma)) if mma else ""
        return self.check.alias(f"decltype({copy_expr(owner, mma_t)})"), engine_copy(owner, mma), owner

    def add(self) -> None:
        for op in K.walk(self.kernel):
            if isinstance(op, (StaticSmemLayoutOp, StaticTransposeLayoutOp)):
                self._static_layout(op)
            elif isinstance(op, GlobalTileViewOp):
                self._global_tile(op)
            elif isinstance(op, (ThreadViewOp, CoordViewOp)):
                self._partition(op)
            elif isinstance(op, RetileViewOp):
                self._retile(op)
            elif isinstance(op, RegisterFragmentOp):
                self._fragment(op)
            elif isinstance(op, WgmmaDescriptorFragmentOp):
                self._wgmma_descriptors(op)
            elif isinstance(op, H.WgmmaFragmentOp) and op.role == "C" and op.mma in self.mmas:
                self._wgmma_fragment(op)

    def _partition(self, op: K.PartitionOp) -> None:
        found = self._tensor(op.src)
        if found is None:
            return
        src_t, layout, sw, space = found
        owner_t, engine, owner = self._owner(op)
        side = op.method[-1]
        if isinstance(owner, (K.TiledMmaOp, H.WgmmaTiledMmaOp)):
            if side != "C":
                return
            expr = f"decltype({owner_t}{{}}.thrfrg_C({src_t}{{}}))"
            to_mode0 = engine._thread_to_mode0("C")
        else:
            expr = f"decltype({owner_t}::tidfrg_{side}({src_t}{{}}))"
            to_mode0 = None
        tv_t = self.check.alias(expr)
        thr, values = engine.partition(side, layout)
        threads = thr.size()
        for t in sorted({5 % threads, max(threads - 27, 0)}):
            col = to_mode0(t) if to_mode0 is not None else t
            offsets = [thr(t) + values(i) for i in range(values.size())]
            what = f"{op.name} thread {t}"
            if space == "coords":
                rows = [o % layout.shape[0] for o in offsets]
                cols = [o // layout.shape[0] for o in offsets]
                self.check.raw(f"static_assert(tlc_coords<{tv_t}>({col}, {_arr(rows)}, {_arr(cols)}), \"{what}\");")
            else:
                want = [swizzle(o, sw) for o in offsets]
                self.check.raw(f"static_assert(tlc_offsets<{tv_t}>({col}, {_arr(want)}), \"{what}\");")

    def _static_layout(self, op) -> None:
        """The shared layout tlc spells equals CuTe's tile_to_shape (or its transposed composition)."""
        cute = self._layout_cpp(op.name)
        mine = Layout(op.layout_shape, op.layout_stride)
        swizzle = op.swizzle if any(op.swizzle) else None
        if swizzle is not None:
            b, m, s = swizzle
            self.check.raw(f"static_assert(cute::is_same_v<decltype({cute}{{}}.layout_a()), Swizzle<{b}, {m}, {s}>>, "
                           f"\"{op.name} swizzle\");")
            cute = f"decltype({cute}{{}}.layout_b())"
        self.check.same(cute, mine, f"{op.name} layout")

    def _global_tile(self, op: GlobalTileViewOp) -> None:
        """local_tile of a (GLOBAL_ROWS, cols) tensor with row stride GLOBAL_ROW equals the spelled layout."""
        rows, cols = GLOBAL_ROWS, self.defs[op.src].cols
        tr, tc = op.tile
        dtype = CPP_TYPE[self.defs[op.src].dtype]
        tensor = (f"make_tensor(make_gmem_ptr(static_cast<{dtype}*>(nullptr)), make_layout(make_shape(Int<{rows}>{{}}, "
                  f"Int<{cols}>{{}}), make_stride(Int<{GLOBAL_ROW}>{{}}, Int<1>{{}})))")
        cute = f"decltype(local_tile({tensor}, Shape<Int<{tr}>, Int<{tc}>>{{}}, make_coord(_, _)).layout())"
        mine = Layout((tr, tc, -(-rows // tr), op.col_tiles), (GLOBAL_ROW, 1, tr * GLOBAL_ROW, tc))
        self.check.same(cute, mine, f"{op.name} tile")

    def _retile(self, op: RetileViewOp) -> None:
        owner_t, engine, owner = self._owner(op)
        frag = self.defs.get(op.src.name) if isinstance(op.src, Var) else None
        if isinstance(frag, K.ConvertOp):  # a converted copy keeps its source's layout
            frag = self.defs.get(frag.src)
        if isinstance(frag, H.WgmmaFragmentOp) and frag.role == "C":
            src = engine_mma(self.mmas[frag.mma]).fragment("C", Layout(frag.shape))
        elif isinstance(frag, RegisterFragmentOp):
            src = Layout(frag.layout_shape, frag.layout_stride)
        else:
            return
        mine = Layout(op.layout_shape, op.layout_stride)
        self.check.same(f"decltype({owner_t}::retile({layout_type(src)}{{}}))", mine, f"{op.name} retile")

    def _wgmma_fragment(self, op: H.WgmmaFragmentOp) -> None:
        """A wgmma accumulator's layout, as fold-partitions spells it (or assumes it, where CuTe keeps the
        fragment), is CuTe's partition_fragment_C layout, mode by mode."""
        mma_t = self.check.alias(mma_type(self.mmas[op.mma]))
        shape = ", ".join(f"Int<{d}>" for d in op.shape)
        mine = (Layout(op.layout_shape, op.layout_stride) if isinstance(op, WgmmaRegisterFragmentOp)
                else engine_mma(self.mmas[op.mma]).fragment("C", Layout(op.shape)))
        self.check.same(f"decltype(partition_fragment_C({mma_t}{{}}, Shape<{shape}>{{}}).layout())", mine,
                        f"{op.name} fragment")

    def _wgmma_descriptors(self, op: WgmmaDescriptorFragmentOp) -> None:
        """A wgmma operand's descriptors: CuTe's make_fragment_A/B layout, the first element of the
        partition (before the swizzle: a descriptor's start address) at two warp groups' threads, and
        make_gmma_desc's static fields."""
        mma = self.mmas[op.mma]
        buf = self.defs[op.src.name]
        lay = self._layout_cpp(buf.layout)
        if lay is None:
            return
        mma_t = self.check.alias(mma_type(mma))
        dtype = CPP_TYPE[mma.dtype]
        tensor = f"make_tensor(make_smem_ptr(static_cast<{dtype}*>(nullptr)), {lay}{{}})"
        part = self.check.alias(f"decltype({mma_t}{{}}.get_slice(0).partition_{op.role}({tensor}))")
        self.check.same(f"decltype({mma_t}{{}}.get_slice(0).make_fragment_{op.role}(cute::declval<{part}&>()).layout())",
                        Layout(op.layout_shape, op.layout_stride), f"{op.name} descriptors")
        k_major = mma.a_k_major if op.role == "A" else mma.b_k_major
        self.check.raw(f"static_assert(tlc_gmma_fields<{part}, {str(k_major).lower()}>({op.desc_lo:#x}u, "
                       f"{op.desc_hi:#x}u), \"{op.name} descriptor fields\");")
        engine = engine_mma(mma)
        tv_t = self.check.alias(f"decltype({mma_t}{{}}.thrfrg_{op.role}(get_nonswizzle_portion({lay}{{}})))")
        to_mode0 = engine._thread_to_mode0(op.role)
        for t in sorted({5, engine.threads - 27}):
            want = evaluate(op.offset, {"threadIdx.x": t})
            self.check.raw(f"static_assert(tlc_offsets<{tv_t}>({to_mode0(t)}, {{{want}}}), \"{op.name} thread {t}\");")

    def _fragment(self, op: RegisterFragmentOp) -> None:
        mma_t = self.check.alias(mma_type(self.mmas[op.mma]))
        mine = Layout(op.layout_shape, op.layout_stride)
        if op.role == "C":
            shape = ", ".join(f"Int<{d}>" for d in op.shape)
            cute = f"decltype(partition_fragment_C({mma_t}{{}}, Shape<{shape}>{{}}).layout())"
        else:
            base = op.src.base if isinstance(op.src, Index) else op.src
            buf = self.defs.get(base.name)
            lay = self._layout_cpp(buf.layout) if buf is not None else None
            if lay is None:
                return
            dtype = CPP_TYPE[op.dtype]
            tensor = f"make_tensor(make_smem_ptr(static_cast<{dtype}*>(nullptr)), {lay}{{}})"
            if isinstance(op.src, Index):
                idx = ", ".join("_" if getattr(i, "name", "") == "_" else str(i.value) for i in op.src.indices)
                tensor = f"{tensor}({idx})"
            cute = f"decltype({mma_t}{{}}.get_slice(0).partition_fragment_{op.role}({tensor}).layout())"
        self.check.same(cute, mine, f"{op.name} fragment")


def _arr(values: list[int]) -> str:
    return "{" + ", ".join(str(v) for v in values) + "}"
