"""tlc/layout in Python: the atoms against the PTX ISA's fragment tables, the tiled layouts'
coverage, and partitions equal to the tensor composed with the TV layout (CuTe's definition).
CuTe itself checks the TV layouts in tests/nvrtc/test_layout_engine_nvrtc.py."""
from __future__ import annotations

import pytest
from pycute import Layout

from tlc.layout.algebra import compact_order, fragment_like, top_sizes, upcast
from tlc.layout.atoms import MMA_ATOMS, copy_atom
from tlc.layout.cpp import index_expr, layout_type
from tlc.layout.tiled_copy import TiledCopy
from tlc.layout.tiled_mma import TiledMma
from tlc.lowering.layout_check import ptx_a, ptx_b, ptx_c

BF16 = "SM80_16x8x16_F32BF16BF16F32_TN"


def test_the_mma_atom_is_the_ptx_fragment_table() -> None:
    atom = MMA_ATOMS[BF16]
    for lane in range(32):
        a = [ptx_a(lane, i) for i in range(8)]
        b = [ptx_b(lane, i) for i in range(4)]
        c = [ptx_c(lane, i) for i in range(4)]
        assert [atom.a_tv((lane, i)) for i in range(8)] == [m + 16 * k for m, k in a]
        assert [atom.b_tv((lane, i)) for i in range(4)] == [n + 8 * k for k, n in b]
        assert [atom.c_tv((lane, i)) for i in range(4)] == [m + 16 * n for m, n in c]


def test_copy_atoms_in_elements() -> None:
    ldsm = copy_atom("SM75_U32x4_LDSM_N", "bf16")
    assert ldsm.threads == 32 and ldsm.values == 8 and ldsm.src == Layout((32, 8), (8, 1))
    assert copy_atom("SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>", "bf16").values == 8
    assert copy_atom("UniversalCopy<uint32_t>", "bf16").values == 2
    assert copy_atom("TMA", "bf16") is None
    assert upcast(Layout((32, 128), (128, 1)), 16) == Layout((32, 8), (8, 1))


@pytest.mark.parametrize("warps,tile", [((4, 1, 1), (64, 16, 16)), ((8, 1, 1), (128, 16, 16)),
                                        ((1, 4, 1), (16, 32, 16))])
def test_tiled_mma_tv_layouts_cover_the_tile(warps, tile) -> None:
    mma = TiledMma.of(BF16, warps, tile)
    m, n, k = tile
    c = mma.layout_tv("C")
    assert sorted(c(i) for i in range(c.size())) == list(range(m * n))  # each element once
    a = mma.layout_tv("A")
    assert {a(i) for i in range(a.size())} == set(range(m * k))  # every element, replicated over N warps


def test_thread_copy_is_row_major_threads_with_contiguous_vectors() -> None:
    cp = TiledCopy.of_threads(copy_atom("SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>", "bf16"), (16, 8), (1, 8))
    assert cp.tiler == (16, 64)
    tv = cp.layout_side_tv("S")
    for t in range(128):
        row, col0 = t // 8, (t % 8) * 8
        assert [tv((t, v)) for v in range(8)] == [row + 16 * (col0 + v) for v in range(8)]


def _plain_smem(rows: int, cols: int) -> Layout:
    """The unswizzled 8×64 row-major atoms tiled column-major over (rows, cols)."""
    return Layout(((8, rows // 8), (64, cols // 64)), ((64, 512), (1, 512 * rows // 8)))


@pytest.mark.parametrize("kind", ["A", "B", "B_T", "C"])
def test_a_partition_is_the_tensor_composed_with_the_tv_layout(kind) -> None:
    mma = TiledMma.of(BF16, (4, 1, 1), (64, 16, 16))
    atom = {"A": "SM75_U32x4_LDSM_N", "B": "SM75_U32x4_LDSM_N", "B_T": "SM75_U16x8_LDSM_T",
            "C": "UniversalCopy<uint32_t>"}[kind]
    role = kind[0]
    cp = TiledCopy.of_mma(copy_atom(atom, "bf16"), mma, role)
    rows, cols = (128, 128) if role != "B" else (64, 128)
    tensor = _plain_smem(rows, cols)
    offset, values = cp.partition("S", tensor)
    tv = cp.layout_side_tv("S")
    tm, tn = cp.tiler
    for t in (0, 1, 37, 127):
        for v in range(values.size()):
            val, ri, ci = _coords(values, v)  # (values, RestM, RestN)
            e = tv((t, val))
            row, col = e % tm + ri * tm, e // tm + ci * tn
            assert offset(t) + values(v) == tensor((row, col)), (t, v)


def _coords(layout: Layout, i: int) -> list[int]:
    """Top-level coordinates of linear index i (column-major over the top-level sizes)."""
    out = []
    for s in top_sizes(layout):
        out.append(i % s)
        i //= s
    return out


def test_fragment_like_orders_the_rest_modes_by_stride() -> None:
    # rest strides (4096, 16): K (the smaller) gets the compact stride right after the values
    frag = fragment_like(Layout(((2, 2, 2), 2, 8), ((1, 8, 64), 4096, 16)))
    assert frag == Layout(((2, 2, 2), 2, 8), ((1, 2, 4), 64, 8))
    assert compact_order((2, 3), (5, 5)) == (1, 1)  # equal orders share a start, as CuTe's


def test_cpp_spelling() -> None:
    lay = Layout(((4, 8), 4), ((128, 1), 16))
    assert layout_type(lay) == ("Layout<Shape<Shape<Int<4>, Int<8>>, Int<4>>, "
                                "Stride<Stride<Int<128>, Int<1>>, Int<16>>>")
    expr = index_expr(lay, "t", 128)
    assert all(eval(expr.replace("/", "//"), {"t": t}) == lay(t) for t in range(128))
    assert index_expr(Layout(4, 0), "t", 4) == "0"
