"""tlc/layout/gmma.py: CuTe's GMMA shared layouts and the static descriptor fields fold-partitions
emits. The expected words are the ones the sm_90a d=128 kernel's SASS builds with CuTe's own
make_gmma_desc (0x10000 / 0x40000040 for Q and K, 0x4000000 / 0x40000040 for V); tests/nvrtc checks
every shipped kernel's fields against CuTe's algebra."""
from __future__ import annotations

import pytest
from pycute import Layout, composition

from tlc.kir import ops_sm90 as H
from tlc.kir.expr import Var
from tlc.layout.algebra import modes
from tlc.layout.gmma import descriptor_fields, descriptor_layout, gmma_layout
from tlc.layout.kir_tensors import engine_mma


def _mma(kind: str, b_k_major: bool, n: int = 128, groups: int = 2) -> H.WgmmaTiledMmaOp:
    return H.WgmmaTiledMmaOp(name="m", dtype="bf16", kind=kind, tile=(64, n, 16), warp_groups=(groups, 1, 1),
                             thread_slice="thr_m", thread_index=Var("threadIdx.x"), a_k_major=True,
                             b_k_major=b_k_major)


def test_the_sw128_atoms_tile_column_major_with_an_element_swizzle() -> None:
    k, sw = gmma_layout(2, 128, (128, 128, 2), k_major=True)
    assert sw == (3, 3, 3)                                    # Swizzle<3,4,3> on bytes = <3,3,3> on bf16
    assert [k(r, c, 0) for r, c in ((0, 0), (1, 0), (8, 0), (0, 1), (0, 64))] == [0, 64, 512, 1, 8192]
    assert k(0, 0, 1) == 16384
    mn, _ = gmma_layout(2, 128, (128, 64), k_major=False)    # MN-major: 64 contiguous rows per atom
    assert [mn(r, c) for r, c in ((1, 0), (0, 1), (64, 0), (0, 8))] == [1, 64, 512, 1024]   # atoms rows first
    assert gmma_layout(4, 0, (8, 8), k_major=True)[1] == (0, 0, 0)


def test_q_k_and_v_descriptors_of_the_d128_kernel() -> None:
    sq, _ = gmma_layout(2, 128, (128, 128), True)
    thr, values = engine_mma(_mma("SS", True)).partition("A", sq)
    first, *rest = modes(values)
    assert descriptor_fields(first, True, 128, 2) == (0x10000, 0x40000040)
    frag = descriptor_layout(rest, 2)                         # k16 steps of 32 B, then the next 128-B atom
    assert [frag(0, 0, k) for k in range(8)] == [0, 2, 4, 6, 1024, 1026, 1028, 1030]
    assert [thr(t) for t in (0, 127, 128, 255)] == [0, 0, 4096, 4096]   # warp group 1 starts 64 rows down
    sv, _ = gmma_layout(2, 128, (128, 128, 2), True)
    vt = composition(sv, Layout((128, 128, 2), (128, 1, 16384)))        # V read as (d, keys): MN-major
    thr, values = engine_mma(_mma("RS", False)).partition("B", vt)
    first, *rest = modes(values)
    assert descriptor_fields(first, False, 128, 2) == (0x4000000, 0x40000040)
    assert descriptor_layout(rest, 2)(0, 0, 1, 1) == 128 + 2048          # 16 keys = 2 KiB; a stage 32 KiB
    assert thr(200) == 0


@pytest.mark.parametrize("swizzle", [32, 64])
def test_narrower_swizzles_give_their_layout_type(swizzle: int) -> None:
    tile, _ = gmma_layout(2, swizzle, (64, 64), True)
    _, values = engine_mma(_mma("SS", True, n=64, groups=1)).partition("B", tile)
    lo, hi = descriptor_fields(modes(values)[0], True, swizzle, 2)
    assert hi >> 30 == {64: 2, 32: 3}[swizzle] and hi & 0x3FFF == swizzle * 8 // 16 and lo == 1 << 16


def test_a_layout_that_is_no_canonical_gmma_layout_is_declined() -> None:
    assert descriptor_fields(Layout((64, 16), (1, 64)), True, 128, 2) is None   # K-major claimed, MN-major given
