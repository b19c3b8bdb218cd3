"""CuTe checks the engine: a C++ program of `static_assert`s that CuTe's own TV layouts (and the
fragment and partition layouts the fold-partitions pass emits) equal the engine's (by-mode
coalesced types), for the tiled MMAs and copies a kernel-IR program declares. NVRTC compiles it, no launch
(tests/nvrtc/test_layout_engine_nvrtc.py)."""
from __future__ import annotations

from dataclasses import dataclass, field

from pycute import Layout

from tlc.kir.ops import ProgramOp, TiledCopyOp, TiledMmaOp, walk
from tlc.kir.ops_sm90 import WgmmaTiledMmaOp
from tlc.layout.algebra import modes
from tlc.layout.cpp import layout_type
from tlc.layout.kir_tensors import engine_copy, engine_mma

CPP_TYPE = {"bf16": "cute::bfloat16_t", "fp16": "cute::half_t", "fp32": "float"}

PRELUDE = """#include <cute/tensor.hpp>
using namespace cute;
// Equal as functions with equal top-level mode sizes: CuTe's by-mode coalesce is canonical.
template <class A, class B>
constexpr bool tlc_same() {
  constexpr int R = decltype(rank(A{}))::value;
  if constexpr (R != decltype(rank(B{}))::value) {
    return false;
  } else {
    using P = decltype(repeat<R>(Int<1>{}));
    return cute::is_same_v<decltype(coalesce(A{}, P{})), decltype(coalesce(B{}, P{}))>;
  }
}
// CuTe's (thread, value) → offset layout L at thread t, values 0.., against a table.
template <class L, int N>
constexpr bool tlc_offsets(int t, const int (&want)[N]) {
  constexpr L l{};
  constexpr int T = int(size<0>(l));
  for (int i = 0; i < N; ++i) {
    if (int(l(t + T * i)) != want[i]) return false;
  }
  return true;
}
// make_gmma_desc's static fields for the partition P (a wgmma operand's shared partition), as
// make_gmma_desc derives them from its first mode (the atom's tile) recast to 16-byte units.
template <class P, bool KMajor>
constexpr bool tlc_gmma_fields(uint32_t lo, uint32_t hi) {
  using U = decltype(recast<uint128_t const>(tensor<0>(cute::declval<P&>())));
  constexpr auto type = SM90::GMMA::layout_type(U{});
  constexpr int W = type == SM90::GMMA::LayoutType::INTERLEAVE ? 1 : type == SM90::GMMA::LayoutType::B32 ? 2
                  : type == SM90::GMMA::LayoutType::B64 ? 4 : 8;
  constexpr bool inter = type == SM90::GMMA::LayoutType::INTERLEAVE;
  uint32_t lbo = 0, sbo = 0;
  if constexpr (KMajor) {
    constexpr auto c = logical_divide(typename U::layout_type{}, Tile<Layout<_8, _1>, Layout<_2, _1>>{});
    sbo = stride<0, 1>(c);
    lbo = stride<1, 0>(c);
  } else {
    constexpr auto c = logical_divide(typename U::layout_type{}, Tile<Layout<Int<W>, _1>, Layout<_8, _1>>{});
    sbo = inter ? uint32_t(stride<0, 1>(c)) : uint32_t(stride<1, 1>(c));
    lbo = inter ? uint32_t(stride<1, 1>(c)) : uint32_t(stride<0, 1>(c));
  }
  return lo == (lbo << 16) && hi == ((uint32_t(type) << 30) | sbo);
}
template <class L, int N>
constexpr bool tlc_coords(int t, const int (&rows)[N], const int (&cols)[N]) {
  constexpr L l{};
  constexpr int T = int(size<0>(l));
  for (int i = 0; i < N; ++i) {
    auto c = l(t + T * i);
    if (int(get<0>(c)) != rows[i] || int(get<1>(c)) != cols[i]) return false;
  }
  return true;
}
"""


def mma_type(mma: TiledMmaOp | WgmmaTiledMmaOp) -> str:
    if isinstance(mma, WgmmaTiledMmaOp):
        from tlc.backend_cute.emit_sm90 import wgmma_tiled_mma_type   # the emitter's spelling
        return wgmma_tiled_mma_type(mma)
    m, n, k = mma.warps
    tm, tn, tk = mma.tile
    return (f"TiledMMA<MMA_Atom<{mma.atom}>, Layout<Shape<Int<{m}>, Int<{n}>, Int<{k}>>>, "
            f"Tile<Int<{tm}>, Int<{tn}>, Int<{tk}>>>")


def copy_expr(op: TiledCopyOp, mma: str) -> str:
    atom = f"Copy_Atom<{op.atom}, {CPP_TYPE[op.dtype]}>{{}}"
    if op.kind == "threads":
        (r, c), (vr, vc) = op.thread_layout, op.value_layout
        return (f"make_tiled_copy({atom}, Layout<Shape<Int<{r}>, Int<{c}>>, Stride<Int<{c}>, Int<1>>>{{}}, "
                f"Layout<Shape<Int<{vr}>, Int<{vc}>>>{{}})")
    return f"make_tiled_copy_{op.kind}({atom}, {mma}{{}})"


@dataclass
class CheckProgram:
    """The static_asserts gathered so far, deduplicated by the C++ they compare."""

    lines: list[str] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)
    count: int = 0
    aliases: dict[str, str] = field(default_factory=dict)

    def same(self, cute_type: str, engine: Layout, what: str) -> None:
        key = f"{cute_type}|{engine}"
        if key in self.seen:
            return
        self.seen.add(key)
        self.count += 1
        tops = ", ".join(str(m.size()) for m in modes(engine))
        self.lines.append(f"// {what}: engine {engine} (mode sizes {tops})")
        self.lines.append(f"static_assert(tlc_same<{cute_type}, {layout_type(engine)}>(), \"{self.count}\");")

    def raw(self, line: str) -> None:
        if line not in self.seen:
            self.seen.add(line)
            self.count += 1
            self.lines.append(line)

    def alias(self, cpp_type: str) -> str:
        """A short name for a long C++ type (declared once)."""
        if cpp_type not in self.aliases:
            self.aliases[cpp_type] = f"T{len(self.aliases)}"
            self.lines.append(f"using {self.aliases[cpp_type]} = {cpp_type};")
        return self.aliases[cpp_type]

    def add_program(self, program: ProgramOp) -> None:
        mmas = {op.name: op for op in walk(program) if isinstance(op, TiledMmaOp)}
        for op in mmas.values():
            t = self.alias(mma_type(op))
            for role in "ABC":
                self.same(f"decltype({t}{{}}.get_layout{role}_TV())", engine_mma(op).layout_tv(role),
                          f"{op.atom} warps {op.warps} tile {op.tile} {role}")
        for op in walk(program):
            if not isinstance(op, TiledCopyOp):
                continue
            mma = mmas.get(op.mma)
            engine = engine_copy(op, mma)
            if engine is None:
                continue
            expr = copy_expr(op, self.alias(mma_type(mma)) if mma else "")
            for side in "SD":
                self.same(f"decltype(({expr}).get_layout{side}_TV())", engine.layout_side_tv(side),
                          f"{op.atom} {op.kind} {side}")

    def source(self) -> str:
        return PRELUDE + "\n".join(self.lines) + "\n"
