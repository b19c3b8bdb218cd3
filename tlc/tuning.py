"""Tile sizes `tlc.attention` binds (-D) per head dim on the sm_80-family path, with their source.

d = 64 and 128: double-buffered K/V with 4 warps along M were the fastest swept tiles (H200,
bench/bench_attention.py --sweep, 2026-11-22); at d = 128 BN = 48 is spill-free where BN = 64
spills (254 vs 255 registers + 16-48 B local, 2026-11-22 and -23). d = 256: 128×64 on 8 warps,
FlashAttention-2's own tiles, measured 316.5 TFLOP/s against 280.4 for 64×32 on 4 warps (H200,
2026-11-23, `python3 bench/bench_attention.py --extra --sweep`). MLA prefill (192/128): 64×64 on
4 warps, 285.0 against 262.8 for 128×64 on 8 warps (same run). Other head dims pad to a
multiple of 32 and use the tiles of the next tabled width.
"""
from __future__ import annotations

DEFAULT_TILES = {64: dict(bm=128, bn=64, warps=4, stages=2), 128: dict(bm=128, bn=48, warps=4, stages=2),
                 192: dict(bm=64, bn=64, warps=4, stages=2), 256: dict(bm=128, bn=64, warps=8, stages=2)}


def default_tiles(d_qk: int, d_v: int) -> dict:
    """BM, BN, warps and stages for these head dims: the tabled width at or above the padded one."""
    width = -(-max(d_qk, d_v) // 32) * 32
    key = min((k for k in DEFAULT_TILES if k >= width), default=256)
    return dict(DEFAULT_TILES[key])
