"""Tile sizes `tlc.attention` binds (-D) per head dim on the sm_80-family path, with their source.

All measured on an H200 with `python3 bench/bench_attention.py --extra --sweep` (2026-11-23, the
per-op lowering), double-buffered K/V. d = 64: 128×128 on 4 warps, 337.4 TFLOP/s (312.4 causal)
against 313.9 (292.2) for 128×64, despite 24 bytes of spills. d = 128: 128×48, spill-free, 349.3
against 346.1 for 128×64 (which spills 24 bytes) and 332.6 for 128×32. d = 256: 128×64 on 8 warps,
FlashAttention-2's own tiles, measured 316.5 TFLOP/s against 280.4 for 64×32 on 4 warps (H200,
2026-11-23, `python3 bench/bench_attention.py --extra --sweep`). MLA prefill (192/128): 64×64 on
4 warps, 285.0 against 262.8 for 128×64 on 8 warps (same run). Other head dims pad to a
multiple of 32 and use the tiles of the next tabled width.
"""
from __future__ import annotations

DEFAULT_TILES = {64: dict(bm=128, bn=128, warps=4, stages=2), 128: dict(bm=128, bn=48, warps=4, stages=2),
                 192: dict(bm=64, bn=64, warps=4, stages=2), 256: dict(bm=128, bn=64, warps=8, stages=2)}


def default_tiles(d_qk: int, d_v: int) -> dict:
    """BM, BN, warps and stages for these head dims: the tabled width at or above the padded one."""
    width = -(-max(d_qk, d_v) // 32) * 32
    key = min((k for k in DEFAULT_TILES if k >= width), default=256)
    tiles = dict(DEFAULT_TILES[key])
    # Each copy pass moves 32·warps threads × 16 bytes: tile rows must be whole passes at this width.
    per_pass = 32 * tiles["warps"] // (min(64, width & -width) // 8)
    for k in ("bm", "bn"):
        tiles[k] = -(-tiles[k] // per_pass) * per_pass
    return tiles
