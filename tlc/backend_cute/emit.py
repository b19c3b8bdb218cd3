"""Kernel IR → CuTe C++: one handler per kernel-IR op, an indented writer, strict templates.

The emitter knows nothing the ops do not say: tile sizes, atoms, swizzles, stages and barrier
placement all come from the ops. Anything that is not a kernel-IR op is refused.
"""
from __future__ import annotations

import functools
import string
from importlib import resources

import tlc
from tlc.backend_cute.emit_sm90 import Sm90Emitter
from tlc.backend_cute.emit_views import ViewEmitter
from tlc.backend_cute.cpp import (CPP_DTYPE, CPP_PARAM, CPP_SCALAR, cpp_expr, predicate_limits, row_test, shifted,
                                  static_shape, static_stride)
from tlc.backend_cute.writer import Writer
from tlc.diagnostics import fail
from tlc.kir.expr import Expr, Var, free_names
from tlc.kir.ops_exec import POSITIONS, kblock_slice
from tlc.kir.ops_sm90 import WgmmaTiledMmaOp
from tlc.kir.scopes import check_scopes
from tlc.kir.ops import (AllReduceOp, AsyncCopyOp, BarrierOp, BreakOp, ClearOp, CommitOp, ConvertOp, CopyOp,
                         CounterAddOp, CounterOp, CounterSetOp, Exp2ScaleOp, ForOp, FragmentOp, GlobalTensorOp,
                         GlobalTileOp, IdentityTileOp, IfOp, KernelOp, LaunchOp, LetOp, MapOp, MaskOp, MmaOp, Op, ParamsOp, PartitionOp, ProgramOp, RetileAccToAOp,
                         RowBroadcastOp, RowReduceOp, RowStoreOp, FragStoreOp, FragLoadOp, RowLoadOp, RowVectorOp, TimestampOp, TraceBufferOp, WarpAnyOp, SharedBufferOp, SharedViewOp,
                         SmemLayoutOp, SmemTransposeLayoutOp, TiledCopyOp, TiledMmaOp, WaitOp, walk)


@functools.lru_cache(maxsize=None)
def _template(name: str) -> string.Template:
    return string.Template(resources.files("tlc.backend_cute").joinpath("templates", name).read_text())


def _safe_file(name: str) -> str:
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    return "".join(ch if ch.isprintable() and ch not in '"\\' else "_" for ch in base) or "input.tl"


def _ix(e: Expr) -> str:
    return cpp_expr(e)


# wgmma N extents CuTe's op selectors offer by default; the others (176, 80, …: multiples of 8) only with
# CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED, else the selector falls back to N = 16 or 8 atoms (eleven
# m64n16 wgmmas per k-step for N = 176 instead of one m64n176).
DEFAULT_GMMA_N = frozenset({8, 16, 32, 64, 96, 128, 192, 256})


def _gmma_shapes(program: ProgramOp) -> str:
    """The define that lets CuTe select a wgmma of each TiledMMA's own N, where one needs it (the extended
    shapes' headers cost front-end time, so only then)."""
    wide = sorted({op.tile[1] for op in walk(program) if isinstance(op, WgmmaTiledMmaOp)} - DEFAULT_GMMA_N)
    if not wide:
        return ""
    return (f"// wgmma N = {', '.join(map(str, wide))}: CuTe's extended GMMA shapes\n"
            "#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED\n")


class CuteEmitter(Sm90Emitter, ViewEmitter):
    """Emit one `ProgramOp`. Instance state only: the writer and a name → op table."""

    def __init__(self, *, line_directives: bool = True, cu_name: str = "kernel.cu") -> None:
        self.w = Writer()
        self.line_directives = line_directives
        self.cu_name = cu_name
        self.symbols: dict[str, Op] = {}
        self._in_tl_line = False

    # ------------------------------------------------------------------ driver
    def emit_program(self, program: ProgramOp, source: str = "<kir>") -> str:
        if not isinstance(program, ProgramOp):
            raise fail(f"emitter: expected a kernel-IR ProgramOp, got {type(program).__name__}")
        program.verify()
        check_scopes(program)
        for op in walk(program):
            for name in op.defined_names():
                self.symbols[name] = op
        self.w.raw(_template("preamble.cuh").substitute(
            tlc_version=getattr(tlc, "__version__", "0.1.0"), source=_safe_file(source), program=program.name,
            gmma_shapes=_gmma_shapes(program)))
        for op in program.body:
            self.w.line()
            self.emit(op)
        return self.w.text()

    def _at(self, op: Op) -> None:
        """`#line` before the op's code: its `.tl` line, or back to the `.cu` for synthesized ops."""
        if not self.line_directives:
            return
        if op.loc is not None and op.loc.line > 0:
            self.w.raw(f'#line {op.loc.line} "{_safe_file(op.loc.file)}"')
            self._in_tl_line = True
        elif self._in_tl_line:
            self.w.raw(f'#line {self.w.next_line + 1} "{_safe_file(self.cu_name)}"')
            self._in_tl_line = False

    @staticmethod
    def _thread_index(mma: TiledMmaOp | WgmmaTiledMmaOp) -> str:
        """A replicated MMA's threads: each group of its size acts as threads 0 … size-1."""
        if isinstance(mma, WgmmaTiledMmaOp):  # an epilogue copy matched to a wgmma accumulator
            return cpp_expr(mma.thread_index)
        return f"threadIdx.x % {mma.threads}" if mma.replicas > 1 else "threadIdx.x"

    def _mma(self, name: str) -> TiledMmaOp:
        op = self.symbols.get(name)
        if not isinstance(op, (TiledMmaOp, WgmmaTiledMmaOp)):
            raise fail(f"emitter: {name!r} is not a TiledMmaOp")
        return op

    @functools.singledispatchmethod
    def emit(self, op: object) -> None:
        raise fail(f"emitter: {type(op).__name__} is not a kernel-IR op; lower TL ops with lower-tile-ops first",
                   getattr(op, "loc", None))

    # ------------------------------------------------------------------ program level
    @emit.register
    def _(self, op: ParamsOp) -> None:
        self._at(op)
        with self.w.block(f"struct {op.name}", "};"):
            for fname, ftype in op.fields:
                self.w.line(f"{CPP_PARAM[ftype]} {fname};")

    @emit.register
    def _(self, op: KernelOp) -> None:
        self._kernel_function(op, "kernel_open.cuh")

    def _kernel_function(self, op: KernelOp, opening: str) -> None:
        """The `__global__` function: `opening` (a template of the signature and prologue), the body, `}`."""
        self._at(op)
        self.w.raw(_template(opening).substitute(
            threads=op.threads, min_blocks=op.min_blocks, name=op.name, params=op.params).rstrip("\n"))
        with self.w.indented():
            for child in op.body:
                self.emit(child)
        self.w.line("}")

    @emit.register
    def _(self, op: ProgramOp) -> None:
        raise fail("emitter: nested ProgramOp", op.loc)

    # ------------------------------------------------------------------ scalars, atoms, layouts
    @emit.register
    def _(self, op: LetOp) -> None:
        self._at(op)
        self.w.line(f"const {CPP_SCALAR[op.type]} {op.name} = {_ix(op.value)};")

    @emit.register
    def _(self, op: TiledMmaOp) -> None:
        self._at(op)
        m, n, k = op.warps
        tm, tn, tk = op.tile
        self.w.line(f"using {op.name}_t = TiledMMA<MMA_Atom<{op.atom}>, Layout<{static_shape((m, n, k))}>, "
                    f"Tile<Int<{tm}>, Int<{tn}>, Int<{tk}>>>;")
        self.w.line(f"{op.name}_t {op.name};")
        self.w.line(f"auto {op.thread_slice} = {op.name}.get_slice({self._thread_index(op)});")

    @emit.register
    def _(self, op: SmemLayoutOp) -> None:
        self._at(op)
        rows, cols = op.atom
        atom = f"Layout<{static_shape((rows, cols))}, {static_stride((cols, 1))}>{{}}"
        if any(op.swizzle):
            b, m, s = op.swizzle
            atom = f"composition(Swizzle<{b}, {m}, {s}>{{}}, {atom})"
        self.w.line(f"using {op.name} = decltype(tile_to_shape({atom}, {static_shape(op.shape)}{{}}));")

    @emit.register
    def _(self, op: SmemTransposeLayoutOp) -> None:
        self._at(op)
        cols, rows = op.shape[0], op.shape[1]
        stride = (rows, 1) + ((rows * cols,) if len(op.shape) == 3 else ())
        view = f"composition({op.of}{{}}, make_layout({static_shape(op.shape)}{{}}, {static_stride(stride)}{{}}))"
        if op.strip_swizzle:
            view = f"get_nonswizzle_portion({view})"
        self.w.line(f"using {op.name} = decltype({view});")

    # ------------------------------------------------------------------ tensors
    @emit.register
    def _(self, op: SharedBufferOp) -> None:
        self._at(op)
        self.w.line(f"Tensor {op.name} = make_tensor(make_smem_ptr(reinterpret_cast<{CPP_DTYPE[op.dtype]}*>("
                    f"smem_ + {op.offset_bytes})), {op.layout}{{}});")

    @emit.register
    def _(self, op: SharedViewOp) -> None:
        self._at(op)
        self.w.line(f"Tensor {op.name} = make_tensor({op.of}.data(), {op.layout}{{}});")

    @emit.register
    def _(self, op: GlobalTensorOp) -> None:
        self._at(op)
        ptr = f"make_gmem_ptr({_ix(op.ptr)} + ({_ix(op.offset)}))"
        if op.cols:
            shape = f"make_shape({_ix(op.rows)}, Int<{op.cols}>{{}})"
            stride = f"make_stride({_ix(op.row_stride)}, Int<1>{{}})"
        else:
            shape, stride = f"make_shape({_ix(op.rows)})", "make_stride(Int<1>{})"
        self.w.line(f"Tensor {op.name} = make_tensor({ptr}, {shape}, {stride});")

    @emit.register
    def _(self, op: GlobalTileOp) -> None:
        self._at(op)
        coord = ", ".join(_ix(c) for c in op.coord)
        self.w.line(f"Tensor {op.name} = local_tile({shifted(op)}, {static_shape(op.tile)}{{}}, make_coord({coord}));")

    @emit.register
    def _(self, op: IdentityTileOp) -> None:
        self._at(op)
        self.w.line(f"Tensor {op.name} = make_identity_tensor({static_shape(op.shape)}{{}});")

    @emit.register
    def _(self, op: TiledCopyOp) -> None:
        self._at(op)
        atom = f"Copy_Atom<{op.atom}, {CPP_DTYPE[op.dtype]}>{{}}"
        if op.kind == "threads":
            rows, cols = op.thread_layout
            threads = f"Layout<{static_shape((rows, cols))}, {static_stride((cols, 1))}>{{}}"
            values = f"Layout<{static_shape(op.value_layout)}>{{}}"
            self.w.line(f"auto {op.name} = make_tiled_copy({atom}, {threads}, {values});")
        else:
            self.w.line(f"auto {op.name} = make_tiled_copy_{op.kind}({atom}, {op.mma});")
        index = "threadIdx.x" if op.kind == "threads" else self._thread_index(self._mma(op.mma))
        self.w.line(f"auto {op.thread_slice} = {op.name}.get_thread_slice({index});")

    @emit.register
    def _(self, op: PartitionOp) -> None:
        self._at(op)
        self.w.line(f"Tensor {op.name} = {op.slice}.{op.method}({_ix(op.src)});")

    @emit.register
    def _(self, op: FragmentOp) -> None:
        self._at(op)
        mma = self._mma(op.mma)
        if op.role == "C":
            self.w.line(f"Tensor {op.name} = partition_fragment_C({op.mma}, {static_shape(op.shape)}{{}});")
        else:
            self.w.line(f"Tensor {op.name} = {mma.thread_slice}.partition_fragment_{op.role}({_ix(op.src)});")

    @emit.register
    def _(self, op: RowVectorOp) -> None:
        self._at(op)
        self.w.line(f"Tensor {op.name} = make_tensor<float>(make_shape(size<0>(tlc::rowcol({op.like}.layout()))));")
        self.w.line(f"cute::fill({op.name}, {_ix(op.init)});")

    # ------------------------------------------------------------------ copies and synchronization
    def _predicated_copy(self, copy: str, src: Expr, dst: Expr, pred: Expr, limit: Expr, zero_fill: bool,
                         col_limit: Expr | None = None, row_first: Expr | None = None) -> None:
        with self.w.block(""):
            self.w.line(f"auto src_ = {_ix(src)};")
            self.w.line(f"auto dst_ = {_ix(dst)};")
            for line in predicate_limits(limit, col_limit, row_first):
                self.w.line(line)
            self.w.line("CUTE_UNROLL")
            with self.w.block("for (int m = 0; m < size<1>(dst_); ++m)"):
                if col_limit is None:
                    with self.w.block(f"if ({row_test(_ix(pred) + '(0, m, 0)', row_first)})"):
                        self.w.line(f"cute::copy({copy}, src_(_, m, _), dst_(_, m, _));")
                    if zero_fill:
                        with self.w.block("else"):
                            self.w.line("cute::clear(dst_(_, m, _));")
                    return
                self.w.line("CUTE_UNROLL")
                with self.w.block("for (int k = 0; k < size<2>(dst_); ++k)"):
                    with self.w.block(f"if ({row_test(_ix(pred) + '(0, m, k)', row_first)} && "
                                      f"get<1>({_ix(pred)}(0, m, k)) < col_limit_)"):
                        self.w.line(f"cute::copy({copy}, src_(_, m, k), dst_(_, m, k));")
                    if zero_fill:
                        with self.w.block("else"):
                            self.w.line("cute::clear(dst_(_, m, k));")

    @emit.register
    def _(self, op: AsyncCopyOp) -> None:
        self._at(op)
        self.w.line(f"// cp.async {_ix(op.src)} -> {_ix(op.dst)}  [token {op.token}]")
        if op.gather:
            def call(s: Expr, d: Expr) -> None:
                self.w.line(f"cute::copy({op.copy}, {_ix(s)}, {_ix(d)});")
            self._gather_copy(op, op.src, op.dst, lambda: self._gather_row_calls(op, call), store=False)
        elif op.pred is None:
            self.w.line(f"cute::copy({op.copy}, {_ix(op.src)}, {_ix(op.dst)});")
        else:
            self._predicated_copy(op.copy, op.src, op.dst, op.pred, op.row_limit, zero_fill=True,
                                  col_limit=op.col_limit, row_first=op.row_first)

    @emit.register
    def _(self, op: CopyOp) -> None:
        self._at(op)
        if op.kblock is not None:
            src, dst = (_ix(kblock_slice(e, op.kblock)) for e in (op.src, op.dst))
            self.w.line(f"cute::copy({op.copy}, {src}, {dst});")
        elif op.gather:
            def call(s: Expr, d: Expr) -> None:
                self.w.line(f"cute::copy({op.copy}, {_ix(s)}, {_ix(d)});")
            self._gather_copy(op, op.src, op.dst, lambda: self._gather_row_calls(op, call, False), store=True)
        elif op.pred is None:
            self.w.line(f"cute::copy({op.copy}, {_ix(op.src)}, {_ix(op.dst)});")
        else:
            self._predicated_copy(op.copy, op.src, op.dst, op.pred, op.row_limit, zero_fill=False,
                                  col_limit=op.col_limit, row_first=op.row_first)

    @emit.register
    def _(self, op: CommitOp) -> None:
        self._at(op)
        self.w.line(f"cp_async_fence();  // group {op.name}: {', '.join(op.tokens)}")

    @emit.register
    def _(self, op: WaitOp) -> None:
        self._at(op)
        self.w.line(f"cp_async_wait<{op.pending}>();")

    @emit.register
    def _(self, op: BarrierOp) -> None:
        self._at(op)
        self.w.line("__syncthreads();")

    # ------------------------------------------------------------------ fragment math
    @emit.register
    def _(self, op: ClearOp) -> None:
        self._at(op)
        self.w.line(f"cute::clear({op.target});")

    @emit.register
    def _(self, op: MmaOp) -> None:
        self._at(op)
        a, b = (_ix(kblock_slice(Var(x), op.kblock)) for x in (op.a, op.b))
        self.w.line(f"cute::gemm({op.mma}, {a}, {b}, {op.acc});")

    @emit.register
    def _(self, op: MaskOp) -> None:
        self._at(op)
        if op.predicate is not None:
            self._predicate_mask(op)
            return
        conds = []
        if op.bounds:
            conds.append("col >= sk_")
        if op.causal:
            conds.append("col > row + diag_")
        with self.w.block(""):
            self.w.line(f"const int row0_ = {_ix(op.row0)}, col0_ = {_ix(op.col0)};")
            self.w.line(f"const int sk_ = {_ix(op.sk)};")
            if op.causal:
                diag = f"{_ix(op.sk)} - {_ix(op.sq)}" if op.alignment == "bottom_right" else "0"
                self.w.line(f"const int diag_ = {diag};  // causal, {op.alignment} aligned")
            self.w.line("CUTE_UNROLL")
            with self.w.block(f"for (int i = 0; i < size({op.target}); ++i)"):
                self.w.line(f"const int row = row0_ + get<0>({op.coord}(i));")
                self.w.line(f"const int col = col0_ + get<1>({op.coord}(i));")
                if not op.causal:
                    self.w.line("(void)row;")
                self.w.line(f"if ({' || '.join(conds) or 'false'}) {{ {op.target}(i) = -INFINITY; }}")

    def _predicate_mask(self, op: MaskOp) -> None:
        """`if (predicate) x = -INFINITY` per element, q_idx and kv_idx its global row and column."""
        assert op.predicate is not None
        used = free_names(op.predicate)
        with self.w.block(""):
            self.w.line(f"const int row0_ = {_ix(op.row0)}, col0_ = {_ix(op.col0)};")
            self.w.line("CUTE_UNROLL")
            with self.w.block(f"for (int i = 0; i < size({op.target}); ++i)"):
                self.w.line(f"const int q_idx = row0_ + get<0>({op.coord}(i));")
                self.w.line(f"const int kv_idx = col0_ + get<1>({op.coord}(i));")
                unused = [n for n in POSITIONS if n not in used]
                if unused:
                    self.w.line(" ".join(f"(void){n};" for n in unused))
                self.w.line(f"if ({_ix(op.predicate)}) {{ {op.target}(i) = -INFINITY; }}")

    def _rows(self, name: str) -> None:
        self.w.line(f"Tensor {name}_rc = make_tensor({name}.data(), tlc::rowcol({name}.layout()));")

    @emit.register
    def _(self, op: RowReduceOp) -> None:
        self._at(op)
        combine = "fmaxf({a}, {b})" if op.kind == "max" else "{a} + {b}"
        with self.w.block(""):
            self._rows(op.src)
            self.w.line("CUTE_UNROLL")
            with self.w.block(f"for (int mi = 0; mi < size<0>({op.src}_rc); ++mi)"):
                if op.chains == 1:
                    start = "0" if op.accumulate else "1"
                    self.w.line(f"float r = {op.dst}(mi);" if op.accumulate else f"float r = {op.src}_rc(mi, 0);")
                    self.w.line("CUTE_UNROLL")
                    with self.w.block(f"for (int ni = {start}; ni < size<1>({op.src}_rc); ++ni)"):
                        self.w.line(f"r = {combine.format(a='r', b=f'{op.src}_rc(mi, ni)')};")
                else:
                    self._chained_reduce(op, combine)
                self.w.line(f"{op.dst}(mi) = r;")

    def _chained_reduce(self, op: RowReduceOp, combine: str) -> None:
        """`op.chains` partial results over the columns (column ni into chain ni % chains), then pairwise."""
        c, identity = op.chains, ("-INFINITY" if op.kind == "max" else "0.f")
        n = f"int(size<1>({op.src}_rc))"
        self.w.line(f"float r_[{c}];")
        self.w.line("CUTE_UNROLL")
        with self.w.block(f"for (int k = 0; k < {c}; ++k)"):
            self.w.line(f"r_[k] = k < {n} ? {op.src}_rc(mi, k) : {identity};")
        self.w.line("CUTE_UNROLL")
        with self.w.block(f"for (int ni = {c}; ni < {n}; ++ni)"):
            self.w.line(f"r_[ni % {c}] = {combine.format(a=f'r_[ni % {c}]', b=f'{op.src}_rc(mi, ni)')};")
        half = c // 2
        while half >= 1:
            self.w.line("CUTE_UNROLL")
            with self.w.block(f"for (int k = 0; k < {half}; ++k)"):
                self.w.line(f"r_[k] = {combine.format(a='r_[k]', b=f'r_[k + {half}]')};")
            half //= 2
        folded = combine.format(a=op.dst + "(mi)", b="r_[0]") if op.accumulate else "r_[0]"
        self.w.line(f"float r = {folded};")

    @emit.register
    def _(self, op: AllReduceOp) -> None:
        self._at(op)
        combine = "fmaxf(x, {v})" if op.kind == "max" else "x + {v}"
        self.w.line("CUTE_UNROLL")
        with self.w.block(f"for (int mi = 0; mi < size({op.target}); ++mi)"):
            self.w.line(f"float x = {op.target}(mi);")
            offset = op.width // 2
            while offset >= 1:
                self.w.line(f"x = {combine.format(v=f'__shfl_xor_sync(0xffffffff, x, {offset})')};")
                offset //= 2
            self.w.line(f"{op.target}(mi) = x;")

    @emit.register
    def _(self, op: Exp2ScaleOp) -> None:
        self._at(op)
        with self.w.block(""):
            self._rows(op.target)
            self.w.line(f"const float scale_ = {_ix(op.scale_log2)};")
            self.w.line("CUTE_UNROLL")
            with self.w.block(f"for (int mi = 0; mi < size<0>({op.target}_rc); ++mi)"):
                self.w.line("// A fully masked row has max -inf: use 0 so exp2 gives 0, not NaN.")
                self.w.line(f"const float max_scaled = {op.row_max}(mi) == -INFINITY ? 0.f : {op.row_max}(mi) * scale_;")
                self.w.line("CUTE_UNROLL")
                with self.w.block(f"for (int ni = 0; ni < size<1>({op.target}_rc); ++ni)"):
                    arg = f"{op.target}_rc(mi, ni) * scale_ - max_scaled"
                    if op.poly_every:   # unrolled: the column test folds away
                        k = op.poly_every
                        self.w.line(f"{op.target}_rc(mi, ni) = ni % {k} == {k - 1} ? tlc::exp2_poly({arg}) : exp2f({arg});")
                    else:
                        self.w.line(f"{op.target}_rc(mi, ni) = exp2f({arg});")

    @emit.register
    def _(self, op: RowBroadcastOp) -> None:
        self._at(op)
        with self.w.block(""):
            self._rows(op.target)
            self.w.line("CUTE_UNROLL")
            with self.w.block(f"for (int mi = 0; mi < size<0>({op.target}_rc); ++mi)"):
                self.w.line(f"const float r = {op.vec}(mi);")
                self.w.line("CUTE_UNROLL")
                with self.w.block(f"for (int ni = 0; ni < size<1>({op.target}_rc); ++ni)"):
                    self.w.line(f"const float x = {op.target}_rc(mi, ni);")
                    self.w.line(f"{op.target}_rc(mi, ni) = {_ix(op.fn)};")

    @emit.register
    def _(self, op: LaunchOp) -> None:
        # the launcher's contract (names checked identifiers): a comment in the C++, what ModuleKernel binds from
        self.w.line(f"// launch: kernels {' → '.join(op.kernels)}; tensors "
                    f"{', '.join(f'{n} {role}' for n, role in op.tensors)}")

    @emit.register
    def _(self, op: TraceBufferOp) -> None:
        self._at(op)
        self.w.line(f"__device__ unsigned long long {op.name}[{op.entries}];")
        self.w.raw(_template("trace_stamp.cuh").substitute(buffer=op.name, entries=op.entries))

    @emit.register
    def _(self, op: TimestampOp) -> None:
        self._at(op)
        buffer = self.symbols.get(op.buffer)
        if not isinstance(buffer, TraceBufferOp):
            raise fail(f"emitter: TimestampOp writes {op.buffer!r}, which is not a TraceBufferOp", op.loc)
        unit = f"{op.buffer}_cta()" if op.index is None else f"static_cast<unsigned long long>({cpp_expr(op.index)})"
        slot = str(op.slot) if op.slot_offset is None else f"{op.slot} + {cpp_expr(op.slot_offset)}"
        self.w.line(f"if (threadIdx.x % 128 == 0) {op.buffer}_stamp({op.slots}, {slot}, {unit});  // {op.label}")

    @emit.register
    def _(self, op: WarpAnyOp) -> None:
        self._at(op)
        self.w.line(f"bool {op.name}_lane = false;")
        self.w.line("CUTE_UNROLL")
        with self.w.block(f"for (int i = 0; i < size({op.vec}); ++i)"):
            self.w.line(f"const float x = {op.vec}(i);")
            self.w.line(f"{op.name}_lane |= {_ix(op.fn)};")
        self.w.line(f"const bool {op.name} = __any_sync(0xffffffff, {op.name}_lane);")

    @emit.register
    def _(self, op: MapOp) -> None:
        self._at(op)
        self.w.line("CUTE_UNROLL")
        with self.w.block(f"for (int i = 0; i < size({op.target}); ++i)"):
            for j, src in enumerate(op.srcs):
                self.w.line(f"const float x{j} = static_cast<float>({src}(i));")
            self.w.line(f"{op.target}(i) = {_ix(op.fn)};")

    @emit.register
    def _(self, op: ConvertOp) -> None:
        self._at(op)
        self.w.line(f"Tensor {op.name} = tlc::convert_type<{CPP_DTYPE[op.dtype]}>({op.src});")

    @emit.register
    def _(self, op: RetileAccToAOp) -> None:
        self._at(op)
        self.w.line(f"Tensor {op.name} = make_tensor({op.src}.data(), tlc::acc_to_a<{op.mma}_t>({op.src}.layout()));")

    @emit.register
    def _(self, op: RowStoreOp) -> None:
        self._at(op)
        with self.w.block(""):
            self._rows(op.coord)
            self.w.line(f"const int row_limit_ = {_ix(op.row_limit)};")
            with self.w.block(f"if (get<1>({op.coord}_rc(0, 0)) == 0)"):
                self.w.line("CUTE_UNROLL")
                with self.w.block(f"for (int mi = 0; mi < size<0>({op.coord}_rc); ++mi)"):
                    self.w.line(f"const int row = get<0>({op.coord}_rc(mi, 0));")
                    self.w.line(f"if (row < row_limit_) {{ {op.dst}(row) = {op.vec}(mi); }}")

    def _element_limits(self, op) -> str:
        """The in-range test of a per-element copy at (row, col), its limits declared first."""
        self.w.line(f"const int row_limit_ = {_ix(op.row_limit)};")
        tests = ["row < row_limit_"]
        if op.col_limit is not None:
            self.w.line(f"const int col_limit_ = {_ix(op.col_limit)};")
            tests.append("col < col_limit_")
        if op.row_first is not None:
            self.w.line(f"const int row_first_ = {_ix(op.row_first)};")
            tests.append("row >= row_first_")
        return " && ".join(tests)

    @emit.register
    def _(self, op: FragStoreOp) -> None:
        self._at(op)
        with self.w.block(""):
            test = self._element_limits(op)
            write = (f"atomicAdd(&{op.dst}(row, col), {op.src}(i));" if op.add else f"{op.dst}(row, col) = {op.src}(i);")
            self.w.line("CUTE_UNROLL")
            with self.w.block(f"for (int i = 0; i < size({op.src}); ++i)"):
                self.w.line(f"const int row = get<0>({op.coord}(i)), col = get<1>({op.coord}(i));")
                self.w.line(f"if ({test}) {{ {write} }}")

    @emit.register
    def _(self, op: FragLoadOp) -> None:
        self._at(op)
        with self.w.block(""):
            test = self._element_limits(op)
            self.w.line("CUTE_UNROLL")
            with self.w.block(f"for (int i = 0; i < size({op.dst}); ++i)"):
                self.w.line(f"const int row = get<0>({op.coord}(i)), col = get<1>({op.coord}(i));")
                self.w.line(f"{op.dst}(i) = ({test}) ? static_cast<float>({op.src}(row, col)) : 0.f;")

    @emit.register
    def _(self, op: RowLoadOp) -> None:
        self._at(op)
        with self.w.block(""):
            self._rows(op.coord)
            self.w.line(f"const int row_limit_ = {_ix(op.row_limit)};")
            self.w.line("CUTE_UNROLL")
            with self.w.block(f"for (int mi = 0; mi < size<0>({op.coord}_rc); ++mi)"):
                self.w.line(f"const int row = get<0>({op.coord}_rc(mi, 0));")
                self.w.line(f"{op.dst}(mi) = row < row_limit_ ? static_cast<float>({op.src}(row)) : 0.f;")

    # ------------------------------------------------------------------ control flow
    @emit.register
    def _(self, op: ForOp) -> None:
        self._at(op)
        cmp, inc = ("<", f"+= {op.step}") if op.step > 0 else (">", f"-= {-op.step}")
        if op.step in (1, -1):
            inc = "++" if op.step > 0 else "--"
        if op.unroll:
            self.w.line("// k-blocks" + (": the next one's operands loaded before this one's MMAs" if op.prefetch else ""))
            self.w.line("CUTE_UNROLL")
        else:
            self.w.line(f"// schedule: {op.stages} stage(s)" + (", next tile issued before compute" if op.prefetch
                                                                 else ""))
            self.w.line(f"#pragma unroll {op.unroll_by or 1}")
        head = f"for (int {op.var} = {_ix(op.start)}; {op.var} {cmp} {_ix(op.stop)}; {inc}{op.var})"
        if op.step not in (1, -1):
            head = f"for (int {op.var} = {_ix(op.start)}; {op.var} {cmp} {_ix(op.stop)}; {op.var} {inc})"
        with self.w.block(head):
            for child in op.body:
                self.emit(child)

    @emit.register
    def _(self, op: CounterOp) -> None:
        self._at(op)
        self.w.line(f"int {op.name} = {_ix(op.init)};")

    @emit.register
    def _(self, op: CounterAddOp) -> None:
        self._at(op)
        self.w.line(f"{op.counter} += {_ix(op.value)};")

    @emit.register
    def _(self, op: CounterSetOp) -> None:
        self._at(op)
        self.w.line(f"{op.counter} = {_ix(op.value)};")

    @emit.register
    def _(self, op: BreakOp) -> None:
        self._at(op)
        self.w.line("break;")

    @emit.register
    def _(self, op: IfOp) -> None:
        self._at(op)
        with self.w.block(f"if ({_ix(op.cond)})"):
            for child in op.body:
                self.emit(child)


def emit_program(program: ProgramOp, *, source: str = "<kir>", line_directives: bool = True,
                 cu_name: str = "kernel.cu") -> str:
    return CuteEmitter(line_directives=line_directives, cu_name=cu_name).emit_program(program, source)
