"""Tile sizes `tlc.attention` binds (-D) per head dim and target (sm_80 family; sm_90a), with their source.

All measured on an H200 with `python3 bench/bench_attention.py --extra --sweep` (2026-11-23, the
per-op lowering), double-buffered K/V. d = 64: 128×128 on 4 warps, 337.4 TFLOP/s (312.4 causal)
against 313.9 (292.2) for 128×64, despite 24 bytes of spills. d = 128: 128×48, spill-free, 349.3
against 346.1 for 128×64 (which spills 24 bytes) and 332.6 for 128×32. d = 256: 128×64 on 8 warps,
FlashAttention-2's own tiles, measured 316.5 TFLOP/s against 280.4 for 64×32 on 4 warps (H200,
2026-11-23, `python3 bench/bench_attention.py --extra --sweep`). MLA prefill (192/128): 64×64 on
4 warps, 285.0 against 262.8 for 128×64 on 8 warps (same run). Other head dims pad to a
multiple of 32 and use the tiles of the next tabled width.

sm_90a (wgmma, one warp group of 4 warps per 64 rows): H200 sweep of 2026-11-23
(`TLC_BENCH_SWEEP="128x64x8x2;128x160x8x2;128x192x8x2;192x128x12x2;128x128x8x3;64x128x4x2"
TLC_BENCH_WIDE_SWEEP="128x32x8x2;128x96x8x2;64x64x4x2;192x64x12x2" python3 bench/bench_attention.py
--arch sm_90a --extra --sweep --no-baselines`, bench/results/2026-11-23-h200-s4-sweep-sm90a.txt,
whose closing rows are the then-default 128×128 tiles), TFLOP/s non-causal: d = 64 128×64 378
against 304 for 128×128; d = 128 128×128 429 against 425 for 128×192 and 395 for 128×64; d = 256
128×64 497 against 479 for 128×96; MLA prefill causal 64×64 on 4 warps 407 against 402 for 128×64
(the then-default 128×64 on 8 warps). Those were the cp.async kernels; with warp-specialize and
overlap-gemms (TMA ring, producer warp group), the H200 sweep of 2026-11-23 (session 5,
`TLC_BENCH_SWEEP="128x128x8x2;128x192x8x2;128x128x8x3" python3 bench/bench_attention.py --sweep
--arch sm_90a --no-baselines`) measured d = 64 128×128 430.5 (380.8 causal) against 358.4 (319.9) for
128×64 and 436.0 (375.3) for 128×192; d = 128 128×128 587.9, 589.2 with 3 stages; 128×192 is refused
by check-resources (276 registers). MLA prefill 192/128 causal (`TLC_BENCH_SWEEP=";"
TLC_BENCH_WIDE_SWEEP="128x64x8x2;128x96x8x2;128x128x8x2" python3 bench/bench_attention.py --extra
--sweep --arch sm_90a --no-baselines`, bench/results/2026-11-23-h200-s5-sweep-extra-sm90a.json):
128×128 on 8 warps 545.9 against 516.0 (128×96), 490.5 (128×64) and 384.9 for the then-default 64×64
on 4 warps (timed only). Checked and timed again on the H200 (session 6, 2026-11-23, sweeps now
check each variant's output; `TLC_BENCH_SWEEP=";" TLC_BENCH_WIDE_SWEEP="128x128x8x2;128x96x8x2"
python3 bench/bench_attention.py --extra --sweep --arch sm_90a --no-baselines`,
bench/results/2026-11-23-h200-s6-mla-sweep.txt): 128×128 on 8 warps 546.9 (PASS) against 514.3 for
128×96 and 386.9 for 64×64 in the same process; cuDNN ran this row at 522.1 in the run before it.
So MLA prefill (192/128) takes 128×128 on 8 warps (SM90A_PAIRS). Once check-resources counted the
carried P at bf16 and TMA took tile rows that are not whole cp.async passes, the same session's sweep
(bench/results/2026-11-23-h200-s6-tile-sweep-sm90a.txt, outputs checked) measured d = 64 192×128 on
12 warps (three consumer warp groups, FlashAttention-3's hd64 tile) 469.8 (379.1 causal) against
428.5 (376.7) for 128×128, so d ≤ 64 takes it; d = 128 128×192 598.2 (506.9 causal) against 587.8
(509.3) and 128×176 455.5: 128×128 stays (a 192-row K/V tile is a partial last tile at S = 1k);
d = 256 128×80 463.2, 128×96 505.4, 128×112 373.7 against 620.4 for 128×64. d = 256 stays 128×64 (620.3; 128×96 and 128×128 are refused by check-resources).
"""
from __future__ import annotations

DEFAULT_TILES = {64: dict(bm=128, bn=128, warps=4, stages=2), 128: dict(bm=128, bn=48, warps=4, stages=2),
                 192: dict(bm=64, bn=64, warps=4, stages=2), 256: dict(bm=128, bn=64, warps=8, stages=2)}


SM90A_TILES = {64: dict(bm=192, bn=128, warps=12, stages=2), 128: dict(bm=128, bn=128, warps=8, stages=2),
               192: dict(bm=64, bn=64, warps=4, stages=2), 256: dict(bm=128, bn=64, warps=8, stages=2)}
# Head-dim pairs whose tiles differ from their width's row (MLA prefill: two consumer warp groups, ping-pong).
SM90A_PAIRS: dict[tuple[int, int], dict] = {(192, 128): dict(bm=128, bn=128, warps=8, stages=2)}


# sm_90a schedule knobs per tabled width beside the tiles: at d <= 64 the softmax is half of each trip's
# work, and reducing each score row in two chains (`reduction-chains`) ran 1.011x at d = 64 and d = 64
# causal on an H200 (2026-11-23, bench/results/2026-11-23-h200-s9-reduce-chains-*.txt); at d = 128 it
# changed nothing (1.000 / 0.998) and at d = 256 it lost (0.988), four chains lost more.
SM90A_SCHEDULE = {64: {"ReduceChains": 2}}


# sm_80-family schedule knobs: at d = 64 the folded ldmatrix sources (fold-partitions, which compile the
# kernel 3x faster) ran 0.967x (causal) and 0.965x (128x64 tiles) of CuTe's partitions on an H200, so d = 64
# keeps CuTe's; d = 128, 256 and MLA prefill ran 0.993-1.006x folded (2026-11-27, `python3
# bench/bench_attention.py --extra --arch sm_90 --no-baselines`, folded against kept, alternating twice;
# bench/results/2026-11-27-h200-s11-fold-ldsm-*.txt; today's spelling of the switch:
# TLC_BENCH_DEFINES="FoldLdmatrix=true" against "FoldLdmatrix=false").
DEFAULT_SCHEDULE = {64: {"FoldLdmatrix": False}}


# sm_90a causal kernels: at d = 64 (192-row tiles, three consumer warp groups) the first group's rows see
# no key of the tile's last trip in most tiles; skipping those trips per group (`skip-masked-trips`) ran
# 1.018x and 1.011x on d = 64 causal, alternating twice with it off, while the other causal rows (at d = 256
# the first group skips its last trip, about 1 in 32; at d = 128 and MLA none) lost 0.4-2.3 % to the guarded
# wgmma (H200, 2026-11-27, `TLC_BENCH_DEFINES="SkipMaskedTrips=..." python3 bench/bench_attention.py --bar --arch sm_90a
# --no-baselines --rows causal`, bench/results/2026-11-27-h200-s12-skip-masked-trips-*.txt).
#
# At d = 256 causal the grid's tiles run in L2-sized sections of heads, longest first (`l2-sections`): 1.056x /
# 1.042x alternating twice with the hardware's order on an H200 (2026-11-27, `TLC_BENCH_DEFINES="L2Sections=..."
# python3 bench/bench_attention.py --bar --arch sm_90a --no-baselines --rows causal`,
# bench/results/2026-11-27-h200-s13-l2-sections-ab.txt); the other causal rows lost 0.5-2.5 % with it.
#
# At d = 64 causal a one-tile CTA spends about 3.4 of its median 29.5 µs outside its KV loops (set-up, the Q
# wait, the store, the SM's gap: `python3 bench/timeline.py 'MHA d=64 causal$'`, H200, 2026-11-27,
# bench/results/2026-11-27-h200-s14-timeline-d64-causal.txt). A 3-stage ring with the next wave's Q prefetched
# into L2 (`prefetch-next-tile`) ran 1.007x of 2 stages without it over three rounds of one call (1.002-1.012x each)
# (`TLC_BENCH_DEFINES="Stages=2;PrefetchNext=false"` against the default, `--rows 'MHA d=64 causal$'`;
# 3 stages alone 1.002x; …-s14-final-ab.txt) and 1.013x in another (…-s14-d64-causal-variants.txt, where
# PingPong=false ran 1.000x, the dynamic persistent kernel 0.99x, one reduction chain 0.99x).
SM90A_CAUSAL_SCHEDULE = {64: {"SkipMaskedTrips": True, "Stages": 3}, 256: {"L2Sections": True}}


# Every one-tile-per-CTA sm_90a kernel prefetches the next wave's Q into L2 (`prefetch-next-tile`; persistent
# kernels load their next tile themselves). On every bar row where it applies it ran 1.000-1.011x alternating
# twice with it off (H200, 2026-11-27, `TLC_BENCH_DEFINES="PrefetchNext=true" python3 bench/bench_attention.py
# --bar --arch sm_90a --no-baselines` against the default at 9c8834e; GQA 32/8 causal 1.011x, MQA 32/1 causal
# 1.007x, S = 16k 1.008x, d = 256 causal with l2-sections 1.000x, MLA prefill 1.002x;
# bench/results/2026-11-27-h200-s15-prefetch-next-ab.txt).
SM90A_ONE_TILE_SCHEDULE = {"PrefetchNext": True}


# sm_90a kernels over short key sequences: a persistent kernel hides each tile's prologue (the Q load, the
# first Q·Kᵀ) and epilogue behind the next tile's loads, a large share when a tile has few KV trips. H200,
# 2026-11-27, B·S = 16k, each row alternating twice in one call with the one-tile-per-CTA kernel
# (`TLC_BENCH_DEFINES="Persistent=false;StaticTiles=false"` against the default, `python3
# bench/bench_attention.py --bar|--short --arch sm_90a --no-baselines`, bench/results/2026-11-27-h200-s13-
# short-keys-ab.txt). Non-causal, static tiles (`Persistent` + `StaticTiles`): S = 1k d = 64 1.03x, d = 128
# 1.05x, d = 256 1.01-1.02x, GQA 1.04x; S = 2k d = 128 1.03x; S = 4k d = 64 1.03x, d = 128 1.00-1.01x,
# d = 256 1.00x, fp16 1.02x, GQA 0.997x, MQA 0.988x; at S = 16k 0.98x (…-s12-static-tiles-ab-*.txt).
# Causal, the dynamic scheduler (`Persistent`): S = 1k d = 64 1.04x, d = 128 1.02x, GQA 1.05x,
# but d = 256 0.93x and MLA prefill 0.96x; S = 2k d = 128 1.00x; S = 4k 0.90-0.99x (`TLC_BENCH_DEFINES=
# "Persistent=true"`, …-s13-persistent-causal-ab-*.txt); static causal tiles lose 7-15 % at S = 4k but for GQA
# and MQA (`"Persistent=true;StaticTiles=true"`, …-s13-static-causal-heads-ab-*.txt: their concurrent tiles
# span every head's K/V). Once one-tile kernels prefetched the next wave's Q (SM90A_ONE_TILE_SCHEDULE), the
# static persistent kernel kept its lead at S <= 2k and at S = 4k for d = 64 only (H200, 2026-11-27, at
# 9c8834e with SM90A_ONE_TILE_SCHEDULE, `TLC_BENCH_DEFINES="Persistent=false;StaticTiles=false;PrefetchNext=true"` against the
# default, alternating twice, `--bar` rows at S = 4k and 1k and `--short`, `--no-baselines`;
# bench/results/2026-11-27-h200-s15-short-keys-ab.txt): one tile + prefetch at S = 4k d = 64 0.990x, d = 128
# 1.009x, d = 256 1.008x, GQA 32/8 1.009x, MQA 32/1 1.016x, fp16 1.001x; S = 2k d = 128 0.991x; S = 1k
# 0.95-0.99x non-causal, causal (dynamic) d = 64 0.961x, d = 128 0.977x, GQA 0.969x. Per causality: (the most keys
# per tabled width, the knobs); MLA prefill's pair and the widths not listed keep one tile per CTA. The causal
# short kernels keep the 2-stage ring they were timed with (d = 64 causal's 3 stages are for its one-tile kernel).
SM90A_SHORT_KEYS = {False: ({64: 4096, 128: 2048, 256: 2048}, {"Persistent": True, "StaticTiles": True}),
                    True: ({64: 1024, 128: 1024}, {"Persistent": True, "Stages": 2})}


def short_keys(arch: str, d_qk: int, d_v: int, causal: bool, seq_k: int | None) -> bool:
    """Whether a call with `seq_k` keys per sequence (None: unknown) takes the short-sequence schedule."""
    if arch != "sm_90a" or seq_k is None or (d_qk, d_v) in SM90A_PAIRS:
        return False
    most = SM90A_SHORT_KEYS[bool(causal)][0].get(_table_width(SM90A_TILES, d_qk, d_v))
    return most is not None and seq_k <= most


def default_schedule(d_qk: int, d_v: int, arch: str, causal: bool = False, seq_k: int | None = None) -> dict:
    """The schedule -D bindings tlc.attention adds to the tiles for these head dims on `arch`; `seq_k`
    (the keys per sequence, when known) picks the short-sequence schedule on sm_90a."""
    if arch != "sm_90a":
        return dict(DEFAULT_SCHEDULE.get(_table_width(DEFAULT_TILES, d_qk, d_v), {}))
    if (d_qk, d_v) in SM90A_PAIRS:
        return dict(SM90A_ONE_TILE_SCHEDULE)
    short = short_keys(arch, d_qk, d_v, causal, seq_k)
    width = _table_width(SM90A_TILES, d_qk, d_v)
    return {**SM90A_SCHEDULE.get(width, {}), **(SM90A_CAUSAL_SCHEDULE.get(width, {}) if causal else {}),
            **(SM90A_SHORT_KEYS[bool(causal)][1] if short else SM90A_ONE_TILE_SCHEDULE)}


def _table_width(table: dict, d_qk: int, d_v: int) -> int:
    """The tabled head dim at or above the wider of the two, padded to a multiple of 32."""
    width = -(-max(d_qk, d_v) // 32) * 32
    return min((k for k in table if k >= width), default=256)


def default_tiles(d_qk: int, d_v: int, arch: str = "sm_90") -> dict:
    """BM, BN, warps and stages for these head dims on `arch` (sm_90a has its own table): the tabled
    width at or above the padded one."""
    table = SM90A_TILES if arch == "sm_90a" else DEFAULT_TILES
    width = -(-max(d_qk, d_v) // 32) * 32
    pair = SM90A_PAIRS.get((d_qk, d_v)) if arch == "sm_90a" else None
    tiles = dict(pair or table[_table_width(table, d_qk, d_v)])
    if arch == "sm_90a":   # TMA boxes take any rows (warp-specialize)
        return tiles
    # Each copy pass moves 32·warps threads × 16 bytes: tile rows must be whole passes at this width.
    per_pass = 32 * tiles["warps"] // (min(64, width & -width) // 8)
    for k in ("bm", "bn"):
        tiles[k] = -(-tiles[k] // per_pass) * per_pass
    return tiles
