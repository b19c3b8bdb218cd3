"""The atoms the sm_80-family lowering uses, as thread-value (TV) layouts: the SM80 mma.sync
atoms ((thread, value) → m + M·k of the atom's tile, as CuTe's MMA_Traits and the PTX ISA's
fragment tables; tlc.lowering.layout_check checks the latter) and the copy atoms (cp.async,
ldmatrix, universal copies) with their (thread, value) → bit layouts recast to elements.
"""
from __future__ import annotations

from dataclasses import dataclass

from pycute import Layout

from tlc.layout.algebra import upcast


@dataclass(frozen=True)
class MmaAtom:
    name: str
    shape_mnk: tuple[int, int, int]
    a_tv: Layout  # (T32, V) → m + M·k
    b_tv: Layout  # (T32, V) → n + N·k
    c_tv: Layout  # (T32, V) → m + M·n
    threads: int = 32


_C16x8 = Layout(((4, 8), (2, 2)), ((32, 1), (16, 8)))
MMA_ATOMS: dict[str, MmaAtom] = {
    name: MmaAtom(name, (16, 8, 16), Layout(((4, 8), (2, 2, 2)), ((32, 1), (16, 8, 128))),
                  Layout(((4, 8), (2, 2)), ((16, 1), (8, 64))), _C16x8)
    for name in ("SM80_16x8x16_F32BF16BF16F32_TN", "SM80_16x8x16_F32F16F16F32_TN")
}
MMA_ATOMS["SM80_16x8x8_F32F16F16F32_TN"] = MmaAtom(
    "SM80_16x8x8_F32F16F16F32_TN", (16, 8, 8), _C16x8, Layout(((4, 8), 2), ((16, 1), 8)), _C16x8)


def wgmma_atom(n: int, kind: str) -> MmaAtom:
    """A warpgroup MMA (SM90 GMMA 64×n×16, 16-bit operands, f32 accumulator) as TV layouts over its
    128 threads, as CuTe's MMA_Traits: A from registers (RS, ALayout_64x16) or shared memory (SS,
    every thread sees the tile), B from shared memory, C in CLayout_64xN."""
    shared = lambda rows: Layout((128, (rows, 16)), (0, (1, rows)))  # noqa: E731 - CuTe's ABLayout<rows, 16>
    a_tv = Layout(((4, 8, 4), (2, 2, 2)), ((128, 1, 16), (64, 8, 512))) if kind == "RS" else shared(64)
    c_tv = Layout(((4, 8, 4), (2, 2, n // 8)), ((128, 1, 16), (64, 8, 512)))
    return MmaAtom(f"SM90_64x{n}x16_{kind}", (64, n, 16), a_tv, shared(n), c_tv, threads=128)


@dataclass(frozen=True)
class CopyAtom:
    """A copy instruction's TV layouts in elements of the copied type (CuTe's Copy_Atom<Op, T>)."""

    name: str
    threads: int
    src: Layout
    dst: Layout
    ref: Layout

    @property
    def values(self) -> int:
        return self.ref[1].size()


# (thread, value) → bit, from the PTX semantics of each instruction (CuTe's Copy_Traits).
_BIT_LAYOUTS: dict[str, tuple[int, Layout, Layout, str]] = {
    # one thread moves one 128-bit vector
    "SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>": (1, Layout((1, 128)), Layout((1, 128)), "src"),
    "SM80_CP_ASYNC_CACHEALWAYS<cute::uint128_t>": (1, Layout((1, 128)), Layout((1, 128)), "src"),
    "UniversalCopy<cute::uint128_t>": (1, Layout((1, 128)), Layout((1, 128)), "src"),
    "UniversalCopy<uint32_t>": (1, Layout((1, 32)), Layout((1, 32)), "src"),
    # ldmatrix.x4: each lane gives one 128-bit row address, receives 4 × 32 bits
    "SM75_U32x4_LDSM_N": (32, Layout((32, 128), (128, 1)), Layout((32, (32, 4)), (32, (1, 1024))), "dst"),
    # ldmatrix.x4.trans: the same rows, 16-bit elements transposed into the lanes
    "SM75_U16x8_LDSM_T": (32, Layout((32, 128), (128, 1)),
                          Layout(((4, 8), (16, 2, 4)), ((256, 16), (1, 128, 1024))), "dst"),
}
ELEMENT_BITS = {"bf16": 16, "fp16": 16, "fp32": 32}


def copy_atom(name: str, dtype: str) -> CopyAtom | None:
    """The atom `name` over elements of `dtype`, or None when the engine does not model it."""
    if name not in _BIT_LAYOUTS or dtype not in ELEMENT_BITS:
        return None
    threads, src, dst, ref = _BIT_LAYOUTS[name]
    bits = ELEMENT_BITS[dtype]
    s, d = upcast(src, bits), upcast(dst, bits)
    return CopyAtom(name, threads, s, d, s if ref == "src" else d)
