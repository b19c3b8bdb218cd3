"""Handlers of the CuTe emitter for fold-partitions' views (tlc.kir.ops_views): each spells the flat
layout the op carries, so NVRTC builds one `Layout<…>` per view instead of CuTe's partitioning.

`CuteEmitter` inherits `ViewEmitter`; subclassing registers these handlers on its `emit` dispatcher.
"""
from __future__ import annotations

import contextlib

from tlc.diagnostics import fail

from tlc.backend_cute.cpp import CPP_DTYPE, cpp_expr, predicate_limits, row_test, shifted_data
from tlc.backend_cute.handler_table import HandlerTable
from tlc.kir.expr import Expr, Index, Var, parse_expr
from tlc.expr.rewrite import substitute
from tlc.kir.ops_exec import kblock_slice
from tlc.kir.ops_views import (AtomAsyncCopyOp, AtomCopyOp, AtomMmaOp, CoordViewOp, CopyAtomOp, GlobalTileViewOp,
                               MmaAtomOp, RegisterFragmentOp, RetileViewOp, StaticSmemLayoutOp, WgmmaDescriptorFragmentOp,
                               WgmmaRegisterFragmentOp,
                               StaticTransposeLayoutOp, ThreadViewOp)

_TABLE = HandlerTable("ViewEmitter")
_handles = _TABLE.handles


def _static(kind: str, value) -> str:
    if isinstance(value, tuple):
        return f"{kind}<{', '.join(_static(kind, v) for v in value)}>"
    return f"Int<{value}>"


def _basis(value) -> str:
    if isinstance(value[0], tuple):
        return f"Stride<{', '.join(_basis(v) for v in value)}>"
    axis, step = value
    return f"ScaledBasis<Int<{step}>, {axis}>"


def static_layout(shape: tuple, stride: tuple) -> str:
    return f"Layout<{_static('Shape', shape)}, {_static('Stride', stride)}>{{}}"


def _dynamic(make: str, value) -> str:
    if isinstance(value, tuple):
        return f"{make}({', '.join(_dynamic(make, v) for v in value)})"
    return f"({cpp_expr(value)})" if isinstance(value, Expr) else f"Int<{value}>{{}}"


def _with_loops(e: Expr, names: list[str]) -> Expr:
    """`t` or `t[_, a, _]` with its modes after the first `_` taken by the loop variables `names`."""
    if isinstance(e, Var):
        return Index(e, (Var("_"), *map(Var, names)))
    out, it, seen = [], iter(names), False
    for i in e.indices:
        if isinstance(i, Var) and i.name == "_":
            i = Var(next(it)) if seen else i
            seen = True
        out.append(i)
    return Index(e.base, tuple(out))


_WORDS = {8: "uint8_t", 16: "uint16_t", 32: "uint32_t", 64: "uint64_t", 128: "cute::uint128_t"}


def _element(e: Index, v: str) -> Expr:
    """`t[_, a, b]` with its mode-0 `_` replaced by the linear index `v` (one element)."""
    out, done = [], False
    for i in e.indices:
        if not done and isinstance(i, Var) and i.name == "_":
            i, done = parse_expr(v), True
        out.append(i)
    return Index(e.base, tuple(out))


def _is_static(value) -> bool:
    return all(_is_static(v) for v in value) if isinstance(value, tuple) else not isinstance(value, Expr)


class ViewEmitter(_TABLE.mixin_base()):
    """Mixin of `CuteEmitter` (it provides `w`, `_at` and the `emit` dispatcher)."""


    @_handles(ThreadViewOp)
    def _thread_view(self, op: ThreadViewOp) -> None:
        self._at(op)
        src = cpp_expr(op.src)
        if op.keep == 0 and _is_static(op.layout_stride):
            layout = static_layout(op.layout_shape, op.layout_stride)
        else:  # a global tile: runtime row strides, and its own tile-index modes last
            first = len(op.layout_shape)
            kept = range(first, first + op.keep)
            shape = ", ".join([_dynamic("make_shape", s) for s in op.layout_shape] + [f"shape<{k - first + 2}>({src})"
                                                                                     for k in kept])
            stride = ", ".join([_dynamic("make_stride", d) for d in op.layout_stride] +
                               [f"stride<{k - first + 2}>({src})" for k in kept])
            layout = f"make_layout(make_shape({shape}), make_stride({stride}))"
        offset = cpp_expr(op.offset)
        if any(op.swizzle):  # the decayed slice starts at the swizzled offset
            b, m, s = op.swizzle
            offset = f"Swizzle<{b}, {m}, {s}>{{}}(int({offset}))"
        self.w.line(f"Tensor {op.name} = make_tensor({src}.data() + ({offset}), {layout});")

    @_handles(CoordViewOp)
    def _coord_view(self, op: CoordViewOp) -> None:
        self._at(op)
        layout = f"Layout<{_static('Shape', op.layout_shape)}, {_basis(op.layout_stride)}>{{}}"
        self.w.line(f"Tensor {op.name} = make_tensor(make_inttuple_iter(make_coord(int({cpp_expr(op.row)}), "
                    f"int({cpp_expr(op.col)}))), {layout});")

    @_handles(RetileViewOp)
    def _retile_view(self, op: RetileViewOp) -> None:
        self._at(op)
        self.w.line(f"Tensor {op.name} = make_tensor({cpp_expr(op.src)}.data(), "
                    f"{static_layout(op.layout_shape, op.layout_stride)});")

    @_handles(RegisterFragmentOp)
    def _register_fragment(self, op: RegisterFragmentOp) -> None:
        self._at(op)
        self.w.line(f"Tensor {op.name} = make_tensor<{CPP_DTYPE[op.dtype]}>("
                    f"{static_layout(op.layout_shape, op.layout_stride)});")

    @_handles(WgmmaRegisterFragmentOp)
    def _wgmma_register_fragment(self, op: WgmmaRegisterFragmentOp) -> None:
        self._at(op)
        self.w.line(f"Tensor {op.name} = make_tensor<float>({static_layout(op.layout_shape, op.layout_stride)});")

    @_handles(WgmmaDescriptorFragmentOp)
    def _wgmma_descriptors(self, op: WgmmaDescriptorFragmentOp) -> None:
        self._at(op)
        # the offset depends on the thread only through its warp group (the fold checks it): taken at the
        # group's first thread, a warp-uniform value, the descriptors live in uniform registers
        base = f"{op.name}_wg0"
        self.w.line(f"const int {base} = tlc::warp_group_thread0();")
        offset = substitute(op.offset, "threadIdx.x", Var(base))
        start = f"raw_pointer_cast({cpp_expr(op.src)}.data()) + ({cpp_expr(offset)})"
        self.w.line(f"Tensor {op.name} = make_tensor(GMMA::DescriptorIterator{{tlc::gmma_desc({start}, "
                    f"{op.desc_lo:#x}u, {op.desc_hi:#x}u)}}, {static_layout(op.layout_shape, op.layout_stride)});")

    @_handles(CopyAtomOp)
    def _copy_atom(self, op: CopyAtomOp) -> None:
        self._at(op)
        self.w.line(f"auto {op.name} = Copy_Atom<{op.atom}, {CPP_DTYPE[op.dtype]}>{{}};")

    @_handles(MmaAtomOp)
    def _mma_atom(self, op: MmaAtomOp) -> None:
        self._at(op)
        self.w.line(f"using {op.name}_t = MMA_Atom<{op.atom}>;")
        self.w.line(f"{op.name}_t {op.name};")

    # ------------------------------------------------------------------ copies by a bare atom
    def _atom_calls(self, copy: str, src: Expr, dst: Expr, rest: tuple[int, ...], first: str = "",
                    vector: tuple[int, ...] = ()) -> None:
        """Loops over the modes after mode 0 (`first` already fixed by an enclosing loop), one call each,
        the first mode fastest as in cute::copy."""
        names = ([first] if first else []) + [f"i{k}_" for k in range(len(rest) - bool(first))]
        with contextlib.ExitStack() as loops:
            for name, extent in reversed(list(zip(names[bool(first):], rest[bool(first):]))):
                self.w.line("CUTE_UNROLL")
                loops.enter_context(self.w.block(f"for (int {name} = 0; {name} < {extent}; ++{name})"))
            self._call(copy, _with_loops(src, names), _with_loops(dst, names), vector)

    def _call(self, copy: str, src: Expr, dst: Expr, vector: tuple[int, ...]) -> None:
        """One atom call on the mode-0 slices `src(_, …)` → `dst(_, …)`, or its plain vector moves."""
        if not vector:
            self.w.line(f"{copy}.call({cpp_expr(src)}, {cpp_expr(dst)});")
            return
        bits, values, moves = vector
        word = _WORDS[bits]

        def move(v: str) -> str:
            return (f"*reinterpret_cast<{word}*>(&{cpp_expr(_element(dst, v))}) = "
                    f"*reinterpret_cast<{word} const*>(&{cpp_expr(_element(src, v))});")
        if moves == 1:
            self.w.line(move("0"))
            return
        self.w.line("CUTE_UNROLL")
        with self.w.block(f"for (int v_ = 0; v_ < {moves}; ++v_)"):
            self.w.line(move(f"v_ * {values}"))

    def _gather_copy(self, op, src: Expr, dst: Expr, row_calls, store: bool) -> None:
        """A gather (AsyncCopyOp.gather, a load) or scatter (CopyOp.gather, a store): row `gm_` of the thread's
        (V, M, K) partitions is tensor row `row_`, at the storage row `at_` its tensor's row map gives — the
        global side's slice shifted by `at_ - row_` rows. Rows at or past the limit, or whose storage row is
        outside the storage, are zero-filled (a load) or skipped (a store). `row_calls()` copies `srow_` into
        `drow_`, the row's (V, K) slices."""
        tensor = self.symbols.get(op.gather)
        if getattr(tensor, "rows_at", None) is None:
            raise fail(f"emitter: a copy at line {op.loc.line} gathers through `{op.gather}`, which is no gathered "
                       "global tensor")
        pred = cpp_expr(op.pred)
        at = cpp_expr(substitute(tensor.rows_at, "row", Var("row_")))
        shifted = "dst_" if store else "src_"
        with self.w.block(""):
            self.w.line(f"auto src_ = {cpp_expr(src)};")
            self.w.line(f"auto dst_ = {cpp_expr(dst)};")
            for line in predicate_limits(op.row_limit, op.col_limit, None):
                self.w.line(line)
            self.w.line(f"const int gather_row0_ = {cpp_expr(op.gather_row0)};")
            # every row's storage row first (the row map's loads all in flight together), then the copies: a
            # load between two copies would wait for its value before the next copy issues
            self.w.line("int at_rows_[decltype(size<1>(dst_))::value];")
            self.w.line("CUTE_UNROLL")
            with self.w.block("for (int gm_ = 0; gm_ < size<1>(dst_); ++gm_)"):
                self.w.line(f"const int row_ = gather_row0_ + get<0>({pred}(0, gm_, 0));")
                self.w.line(f"at_rows_[gm_] = int({at});")
            self.w.line("CUTE_UNROLL")
            with self.w.block("for (int gm_ = 0; gm_ < size<1>(dst_); ++gm_)"):
                self.w.line(f"const int row_ = gather_row0_ + get<0>({pred}(0, gm_, 0));")
                self.w.line("const int at_ = at_rows_[gm_];")
                with self.w.block(f"if (get<0>({pred}(0, gm_, 0)) < row_limit_ && at_ >= 0 && "
                                  f"at_ < {cpp_expr(tensor.storage_rows)})"):
                    for side, name in (("src_", "srow_"), ("dst_", "drow_")):
                        if side == shifted:
                            self.w.line(f"auto {name} = make_tensor({side}(_, gm_, _).data() + int64_t(at_ - row_) * "
                                        f"stride<0>({tensor.name}), {side}(_, gm_, _).layout());")
                        else:
                            self.w.line(f"auto {name} = {side}(_, gm_, _);")
                    row_calls()
                if not store:
                    with self.w.block("else"):
                        self.w.line("cute::clear(dst_(_, gm_, _));")

    def _gather_row_calls(self, op, call, zero_fill: bool = True) -> None:
        """The copies of one gathered row, `call(src, dst)` per column chunk `gk_` (those at or past the column
        limit zero-filled by a load, skipped by a store), or one call for the whole row."""
        if op.col_limit is None:
            call(Var("srow_"), Var("drow_"))
            return
        self.w.line("CUTE_UNROLL")
        with self.w.block("for (int gk_ = 0; gk_ < size<1>(drow_); ++gk_)"):
            with self.w.block(f"if (get<1>({cpp_expr(op.pred)}(0, gm_, gk_)) < col_limit_)"):
                call(parse_expr("srow_[_, gk_]"), parse_expr("drow_[_, gk_]"))
            if zero_fill:
                with self.w.block("else"):
                    self.w.line("cute::clear(drow_(_, gk_));")

    def _atom_copy(self, op, zero_fill: bool) -> None:
        src, dst = op.src, op.dst
        if getattr(op, "kblock", None) is not None:
            src, dst = kblock_slice(src, op.kblock), kblock_slice(dst, op.kblock)
        vector = getattr(op, "vector", ())
        if getattr(op, "gather", ""):
            if len(op.rest) != 2:
                raise fail(f"emitter: gather {op.token} copies a partition of {len(op.rest) + 1} modes; (V, M, K) expected")

            def call(s: Expr, d: Expr) -> None:
                if isinstance(s, Var):   # the whole row: the atom over its K chunks
                    self._atom_calls(op.copy, s, d, op.rest[1:], vector=vector)
                else:
                    self._call(op.copy, s, d, vector)
            self._gather_copy(op, src, dst, lambda: self._gather_row_calls(op, call, zero_fill), store=not zero_fill)
            return
        if op.pred is None:
            self._atom_calls(op.copy, src, dst, op.rest, vector=vector)
            return
        pred = cpp_expr(op.pred)
        with self.w.block(""):
            self.w.line(f"auto src_ = {cpp_expr(src)};")
            self.w.line(f"auto dst_ = {cpp_expr(dst)};")
            for line in predicate_limits(op.row_limit, op.col_limit, op.row_first):
                self.w.line(line)
            self.w.line("CUTE_UNROLL")
            with self.w.block(f"for (int m = 0; m < {op.rest[0]}; ++m)"):
                if op.col_limit is None:  # whole rows in or out
                    with self.w.block(f"if ({row_test(pred + '(0, m, 0)', op.row_first)})"):
                        self._atom_calls(op.copy, Var("src_"), Var("dst_"), op.rest, first="m", vector=vector)
                    if zero_fill:
                        with self.w.block("else"):
                            self.w.line("cute::clear(dst_(_, m, _));")
                    return
                self.w.line("CUTE_UNROLL")
                with self.w.block(f"for (int k = 0; k < {op.rest[1]}; ++k)"):
                    with self.w.block(f"if ({row_test(pred + '(0, m, k)', op.row_first)} && get<1>({pred}(0, m, k)) < col_limit_)"):
                        self._call(op.copy, parse_expr("src_[_, m, k]"), parse_expr("dst_[_, m, k]"), vector)
                    if zero_fill:
                        with self.w.block("else"):
                            self.w.line("cute::clear(dst_(_, m, k));")

    @_handles(AtomCopyOp)
    def _atom_copy_op(self, op: AtomCopyOp) -> None:
        self._at(op)
        self._atom_copy(op, zero_fill=False)

    @_handles(AtomAsyncCopyOp)
    def _atom_async_copy_op(self, op: AtomAsyncCopyOp) -> None:
        self._at(op)
        self.w.line(f"// cp.async {cpp_expr(op.src)} -> {cpp_expr(op.dst)}  [token {op.token}]")
        self._atom_copy(op, zero_fill=True)

    @_handles(AtomMmaOp)
    def _atom_mma(self, op: AtomMmaOp) -> None:
        self._at(op)
        kb = cpp_expr(op.kblock)
        outer, inner = ("n_", "m_") if op.n_outer else ("m_", "n_")
        extent = {"m_": op.m, "n_": op.n}
        self.w.line("CUTE_UNROLL")
        with self.w.block(f"for (int {outer} = 0; {outer} < {extent[outer]}; ++{outer})"):
            self.w.line("CUTE_UNROLL")
            with self.w.block(f"for (int {inner} = 0; {inner} < {extent[inner]}; ++{inner})"):
                # serpentine: the inner index runs backwards on odd outer steps (operand register reuse)
                self.w.line(f"const int {inner}s = ({outer} & 1) ? {extent[inner] - 1} - {inner} : {inner};")
                m, n = ("m_s", "n_") if op.n_outer else ("m_", "n_s")
                self.w.line(f"auto d_ = {op.acc}(_, {m}, {n});")
                self.w.line(f"{op.mma}.call(d_, {op.a}(_, {m}, {kb}), {op.b}(_, {n}, {kb}), d_);")

    # ------------------------------------------------------------------ shared layouts
    def _static_smem(self, name: str, swizzle: tuple[int, int, int], shape: tuple, stride: tuple) -> None:
        layout = static_layout(shape, stride)
        if any(swizzle):
            b, m, s = swizzle
            layout = f"composition(Swizzle<{b}, {m}, {s}>{{}}, {layout})"
        self.w.line(f"using {name} = decltype({layout});")

    @_handles(StaticSmemLayoutOp)
    def _static_smem_layout(self, op: StaticSmemLayoutOp) -> None:
        self._at(op)
        self._static_smem(op.name, op.swizzle, op.layout_shape, op.layout_stride)

    @_handles(StaticTransposeLayoutOp)
    def _static_transpose_layout(self, op: StaticTransposeLayoutOp) -> None:
        self._at(op)
        self._static_smem(op.name, op.swizzle, op.layout_shape, op.layout_stride)

    @_handles(GlobalTileViewOp)
    def _global_tile_view(self, op: GlobalTileViewOp) -> None:
        self._at(op)
        rows, cols = op.tile
        extent = f"int(size<0>({op.src}))" + ("" if op.row_shift is None else f" + ({cpp_expr(op.row_shift)})")
        shape = (f"make_shape(Int<{rows}>{{}}, Int<{cols}>{{}}, tlc::ceil_div({extent}, {rows}), "
                 f"Int<{op.col_tiles}>{{}})")
        stride = (f"make_stride(stride<0>({op.src}), Int<1>{{}}, {rows} * stride<0>({op.src}), Int<{cols}>{{}})")
        self.w.line(f"Tensor {op.name} = make_tensor({shifted_data(op)}, make_layout({shape}, {stride}));")
