"""Tile sizes `tlc.attention` binds (-D) per head dim on the sm_80-family path, with their source.

Measured on an H200 (bench/bench_attention.py --sweep, 2026-11-22, the kernels of the previous
builder): double-buffered K/V with 4 warps along M was the fastest of the swept tiles for d = 64
and 128; at d = 128 BN = 48 was spill-free and faster than BN = 64. 192 and 256: the largest
tiles that compiled without spills (NVRTC 13.5, sm_90), not tuned.
"""
from __future__ import annotations

DEFAULT_TILES = {64: dict(bm=128, bn=64, warps=4, stages=2), 128: dict(bm=128, bn=48, warps=4, stages=2),
                 192: dict(bm=64, bn=64, warps=4, stages=2), 256: dict(bm=64, bn=32, warps=4, stages=2)}


def default_tiles(d_qk: int, d_v: int) -> dict:
    """BM, BN, warps and stages for these head dims (64×64, 4 warps, 2 stages when untabled)."""
    return dict(DEFAULT_TILES.get(max(d_qk, d_v), dict(bm=128 if max(d_qk, d_v) <= 64 else 64, bn=64, warps=4,
                                                         stages=2)))
