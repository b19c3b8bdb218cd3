"""GPU correctness of the sm_90a lowering (wgmma SS/RS fed by TMA from a producer warp group, or by cp.async
with `WarpSpecialize = false`; docs/hopper.md): specs built
from their `.tl` for sm_90a equal the TL interpreter (float64, CPU) on the same bf16 inputs at odd
sizes, q ≠ k lengths, causal both alignments; outputs NaN-poisoned first (unwritten rows show).

Run on an H100/H200: `pytest -m gpu tests/gpu/test_sm90a_specs_gpu.py` (skipped without an sm_90 GPU).
Fill the cache first on a CPU machine or the GPU host (no GPU needed):
`python tests/gpu/test_sm90a_specs_gpu.py --precompile --jobs 8`.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.gpu import differential  # noqa: E402
from tests.gpu.differential import precompile_main  # noqa: E402

SPECS = ROOT / "specs"
ARCH = "sm_90a"
CASES: dict[str, tuple[str, dict[str, str]]] = {
    "mha128": ("mha_fwd", {}),                                          # BM 128 (2 warp groups), BN 64
    "mha128_causal": ("mha_fwd", {"Causal": "true"}),
    "mha128_causal_br": ("mha_fwd", {"Causal": "true", "Align": "bottom_right"}),
    "mha64": ("mha_fwd", {"HeadDim": "64"}),
    "mha64_bm64_bn128": ("mha_fwd", {"HeadDim": "64", "BM": "64", "BN": "128"}),   # one warp group
    "mha128_1stage": ("gqa_fwd", {"Warps": "8", "Stages": "1"}),
    "mha_d40_causal": ("mha_fwd", {"HeadDim": "40", "Causal": "true"}),  # padded to 64 columns
    "mha_d96": ("mha_fwd", {"HeadDim": "96"}),                           # padded to 128 columns
    "mha_d160_causal": ("mha_fwd", {"HeadDim": "160", "BM": "64", "Causal": "true"}),   # 160 → 192
    "gqa64": ("gqa_fwd", {"HeadDim": "64", "Warps": "8"}),
    "b2b": ("b2b_gemm_relu", {}),
    "softcap_causal": ("softcap_fwd", {"Causal": "true"}),
    "mha128_bn128": ("mha_fwd", {"BN": "128"}),                          # wider tiles in 240 registers
    "mha128_3stage_causal": ("gqa_fwd", {"Warps": "8", "Stages": "3", "Causal": "true"}),   # a 3-deep TMA ring
    "mha128_no_overlap": ("mha_fwd", {"Overlap": "false"}),              # each trip's GEMMs in order
    "mha128_causal_no_pingpong": ("mha_fwd", {"Causal": "true", "PingPong": "false"}),
    "mha128_cpasync": ("mha_fwd", {"WarpSpecialize": "false"}),          # the cp.async schedule
    "mha128_tma_store": ("mha_fwd", {"TmaStore": "true"}),               # the epilogue stored with TMA
    "mha_d40_causal_tma_store": ("mha_fwd", {"HeadDim": "40", "Causal": "true", "TmaStore": "true"}),
    "mha128_causal_cpasync": ("mha_fwd", {"Causal": "true", "WarpSpecialize": "false"}),
    # emulate-exp2: every 4th (2nd) exp2 by the FMA-pipe polynomial; bottom-right at sq > sk has rows
    # with no key at all (their exp2 of -inf must be 0)
    "mha64_bm192_exp2poly": ("gqa_fwd", {"HeadDim": "64", "BM": "192", "BN": "128", "Warps": "12",
                                         "Causal": "true", "Exp2Poly": "4"}),
    "mha128_causal_br_exp2poly": ("mha_fwd", {"Causal": "true", "Align": "bottom_right", "Exp2Poly": "2"}),
    # reduction-chains: row max / sum in 4 (8) partial results; the traced kernel (trace-phases) computes the same
    "mha128_causal_br_chains4": ("mha_fwd", {"Causal": "true", "Align": "bottom_right", "ReduceChains": "4"}),
    "mha_d40_chains8_traced": ("mha_fwd", {"HeadDim": "40", "ReduceChains": "8", "Trace": "true",
                                           "TraceTrips": "true"}),
    "mha128_causal_persistent_traced": ("mha_fwd", {"Causal": "true", "Persistent": "true", "Trace": "true"}),
    # wgmma N outside CuTe's default shapes (CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED): 128×176 and d = 256 128×80
    "gqa128_bn176_causal": ("gqa_fwd", {"Warps": "8", "BN": "176", "Causal": "true"}),
    "gqa256_bn80": ("gqa_fwd", {"HeadDim": "256", "Warps": "8", "BN": "80"}),
    "mha128_causal_one_loop_eager": ("mha_fwd", {"Causal": "true", "SplitMasked": "false", "LazyRescale": "false"}),
    # persistent: a CTA loops over tiles (the rings' position carried, Q re-armed per tile)
    "mha128_persistent": ("mha_fwd", {"Persistent": "true"}),
    "mha128_causal_persistent": ("mha_fwd", {"Causal": "true", "Persistent": "true"}),   # trips vary per tile
    "gqa128_3stage_causal_persistent": ("gqa_fwd", {"Warps": "8", "Stages": "3", "Causal": "true",
                                                    "Persistent": "true"}),
    "mha_d40_causal_tma_store_persistent": ("mha_fwd", {"HeadDim": "40", "Causal": "true", "TmaStore": "true",
                                                        "Persistent": "true"}),
    "mha_d256_persistent": ("mha_fwd", {"HeadDim": "256", "Persistent": "true"}),   # O staged over Q's bytes
    # gqa_fwd counts its query tiles from the end: the first tile's TMA boxes start before row 0 (zero-filled
    # loads; TMA may not store a box that starts before row 0, so that tile keeps the threads' copy, whose
    # row_first predicate skips the rows before 0)
    "gqa128_causal_tma_store_from_end": ("gqa_fwd", {"Warps": "8", "BN": "128", "Causal": "true", "TmaStore": "true"}),
    "gqa128_tma_store_from_end_persistent": ("gqa_fwd", {"Warps": "8", "BN": "128", "TmaStore": "true",
                                                         "Persistent": "true"}),
    # persistent with static tiles (blockIdx.x + k·gridDim.x, no counter)
    "gqa128_causal_static_tiles": ("gqa_fwd", {"Warps": "8", "BN": "128", "Causal": "true", "Persistent": "true",
                                               "StaticTiles": "true"}),
    # skip-masked-trips: a warp group skips the trips its own rows mask (192-row tiles: the first group's
    # last trip; 64-key trips: the first group's last at d = 256; bottom-right shifts the diagonal)
    "gqa64_bm192_causal": ("gqa_fwd", {"HeadDim": "64", "BM": "192", "BN": "128", "Warps": "12", "Causal": "true",
                                       "SkipMaskedTrips": "true"}),
    "gqa64_bm192_causal_br_persistent": ("gqa_fwd", {"HeadDim": "64", "BM": "192", "BN": "128", "Warps": "12",
                                                     "Causal": "true", "Align": "bottom_right", "Persistent": "true",
                                                     "SkipMaskedTrips": "true"}),
    "mha256_bn64_causal_br": ("mha_fwd", {"HeadDim": "256", "BN": "64", "Warps": "8", "Causal": "true",
                                          "Align": "bottom_right", "SkipMaskedTrips": "true"}),
    "mha128_bn64_causal_one_loop": ("mha_fwd", {"BN": "64", "Causal": "true", "SplitMasked": "false",
                                                "SkipMaskedTrips": "true"}),
    # l2-sections: a 1-D grid decoded into L2-sized sections of heads, longest query tiles first (gqa_fwd counts
    # its tiles from the end, mha_fwd from the start: both directions of the decode)
    "gqa256_bn64_causal_l2_sections": ("gqa_fwd", {"HeadDim": "256", "BN": "64", "Warps": "8", "Causal": "true",
                                                   "L2Sections": "true"}),
    "mha128_causal_br_l2_sections": ("mha_fwd", {"Causal": "true", "Align": "bottom_right", "L2Sections": "true"}),
    "gqa128_causal_l2_tail": ("gqa_fwd", {"Warps": "8", "BN": "128", "Causal": "true", "L2Sections": "true",
                                          "L2TailOnly": "true"}),
    # prefetch-next-tile: each CTA prefetches into L2 the Q boxes of the CTA a resident wave later (a hint: the
    # output must not change); at these cases' sizes no CTA has one, test_sm90a_prefetch_next_with_more_ctas_than_
    # the_gpu_holds runs them with hundreds of CTAs
    "gqa64_bm192_causal_prefetch_next": ("gqa_fwd", {"HeadDim": "64", "BM": "192", "BN": "128", "Warps": "12",
                                                     "Causal": "true", "SkipMaskedTrips": "true",
                                                     "PrefetchNext": "true"}),
    "gqa64_bm192_3stage_causal_prefetch_next": ("gqa_fwd", {"HeadDim": "64", "BM": "192", "BN": "128", "Warps": "12",
                                                            "Stages": "3", "Causal": "true", "SkipMaskedTrips": "true",
                                                            "PrefetchNext": "true", "ReduceChains": "2"}),
    "sliding_window128": ("sliding_window_fwd", {"Window": "200"}),
    # each of the 2 consumer warp groups skips the trips left or right of the window its 64 rows see
    "sliding_window128_skip": ("sliding_window_fwd", {"Window": "200", "SkipMaskedTrips": "true"}),
    "sliding_window128_w40_skip": ("sliding_window_fwd", {"Window": "40", "SkipMaskedTrips": "true"}),
    "documents128_causal": ("document_mask_fwd", {"Causal": "true"}),
    "kv_lengths128_causal": ("kv_lengths_fwd", {"Causal": "true"}),   # cp.async: TMA would read the unseen rows
    "lse128_causal": ("mha_lse_fwd", {"Causal": "true"}),
    "lse64_bm192_causal_br": ("mha_lse_fwd", {"HeadDim": "64", "BM": "192", "BN": "128", "Causal": "true",
                                              "Align": "bottom_right"}),
    "group_sum128_causal": ("group_sum_fwd", {"Causal": "true"}),   # a reduce-store from the consumers
    "group_sum64_bm192": ("group_sum_fwd", {"HeadDim": "64", "BM": "192", "BN": "128"}),
    "merge128": ("merge_states", {}),   # no GEMM: the sm_80 family's rules, compiled for sm_90a
    "merge128_bm128_8warps": ("merge_states", {"BM": "128", "Warps": "8"}),
    "split_kv64": ("split_kv_fwd", {}),   # wgmma halves, then the merge by the sm_80 rules
    "split_kv128_bm128": ("split_kv_fwd", {"HeadDim": "128", "BM": "128", "BN": "128"}),
    # a paged KV cache (rows gathered through a block table): cp.async with wgmma, TMA cannot gather
    "paged128": ("paged_kv_fwd", {}),
    "paged128_page64_bm128": ("paged_kv_fwd", {"BM": "128", "PageSize": "64"}),
    "decode128_causal": ("decode_fwd", {"Causal": "true"}),
    "paged_decode128_bn128": ("paged_decode_fwd", {"BN": "128", "Splits": "8"}),
    "gqa256_bn64_causal_l2_prefetch_next": ("gqa_fwd", {"HeadDim": "256", "BN": "64", "Warps": "8", "Causal": "true",
                                                        "L2Sections": "true", "PrefetchNext": "true"}),
}


def source(case: str) -> tuple[bytes, str, dict[str, str]]:
    """The spec's bytes with a binding it does not declare (a schedule choice) appended as a Param line."""
    spec, defines = CASES[case]
    path = SPECS / f"{spec}.tl"
    text = path.read_text()
    extra = {k: v for k, v in defines.items() if f"\nParam {k} " not in text}
    text += "".join(f"\nParam {k} = {v}" for k, v in extra.items())
    return text.encode(), str(path), {k: v for k, v in defines.items() if k not in extra}


if __name__ == "__main__" and "--precompile" in sys.argv:
    precompile_main(CASES, source, ARCH)

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# (seqlen_q, seqlen_k): a single row and key, odd lengths inside one tile and across tiles, q ≠ k both ways
SIZES = [(1, 1), (17, 17), (17, 33), (333, 77), (77, 333), (1000, 1000), (1, 1000)]


@pytest.fixture(autouse=True)
def _hopper() -> None:
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90a kernels need an sm_90 GPU (H100/H200)")


def run_case(case: str, sq: int, sk: int, B: int = 1, H: int = 2, Hkv: int | None = None,
             key_growth: float = 1.0) -> None:
    differential.run_case(case, source, ARCH, sq, sk, B, H, Hkv, key_growth)


@pytest.mark.parametrize("sq,sk", SIZES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_sm90a_kernel_equals_interpreter(case: str, sq: int, sk: int) -> None:
    run_case(case, sq, sk)


@pytest.mark.parametrize("case", ["gqa64", "paged128"])
def test_sm90a_grouped_heads_and_batches(case: str) -> None:
    run_case(case, 77, 333, B=3 if case == "paged128" else 2, H=8, Hkv=2)


@pytest.mark.parametrize("case, hkv", [("group_sum128_causal", 2), ("group_sum64_bm192", 1)])
def test_sm90a_reduce_store_sums_every_query_head_of_a_group(case: str, hkv: int) -> None:
    run_case(case, 333, 200, B=2, H=8, Hkv=hkv)


@pytest.mark.parametrize("case,hkv", [("mha128_persistent", None), ("mha128_causal_persistent", None),
                                      ("gqa128_3stage_causal_persistent", 6), ("mha_d256_persistent", None),
                                      ("gqa128_causal_static_tiles", 6), ("gqa64_bm192_causal_br_persistent", 6),
                                      ("gqa256_bn64_causal_l2_sections", 6), ("mha128_causal_br_l2_sections", None),
                                      ("gqa128_causal_l2_tail", 6)])
def test_sm90a_persistent_many_tiles_per_cta(case: str, hkv: int | None) -> None:
    """7 × 72 = 504 tiles: every CTA of a 132-SM grid runs three or four, so the carried ring
    position, the Q re-arm and (causal) tiles of different lengths in one CTA are exercised."""
    run_case(case, 777, 555, B=3, H=24, Hkv=hkv)


@pytest.mark.parametrize("case", ["gqa64_bm192_causal_prefetch_next", "gqa64_bm192_3stage_causal_prefetch_next",
                                  "gqa256_bn64_causal_l2_prefetch_next"])
def test_sm90a_prefetch_next_with_more_ctas_than_the_gpu_holds(case: str) -> None:
    """prefetch-next-tile prefetches only where a CTA p.resident_ctas places on exists: 360-504 CTAs on a
    132-SM GPU, so most CTAs prefetch (the interpreter cases above have too few CTAs for any to)."""
    run_case(case, 777, 555, B=3, H=24, Hkv=6)



@pytest.mark.parametrize("growth", [12.0, 0.1])
@pytest.mark.parametrize("case", ["mha128", "mha128_causal", "mha_d256_persistent", "softcap_causal"])
def test_sm90a_scores_whose_max_keeps_moving(case: str, growth: float) -> None:
    """lazy-rescale (the default): K's rows scaled 1 → 12 along the keys move every row's max tile after
    tile, often by more than its 2^8 threshold, so rows rescale at different trips within a warp;
    1 → 0.1 keeps the first tile's max (stale) throughout."""
    run_case(case, 777, 1000, key_growth=growth)


@pytest.mark.parametrize("d,causal", [(64, False), (64, True), (128, False), (128, True), (256, False)])
def test_sm90a_default_tiles_sass(d: int, causal: bool) -> None:
    """tlc.attention's sm_90a kernels: wgmma (HGMMA), TMA loads (UTMALDG), register reallocation, no local memory."""
    import tlc
    from bench.sass import sass_summary
    from tlc.attention.kernels import attention_spec

    if shutil.which("cuobjdump") is None and not Path("/usr/local/cuda/bin/cuobjdump").exists():
        pytest.skip("cuobjdump is not on the PATH")
    path, defines = attention_spec("bf16", d, d, causal, arch=ARCH)
    kernel = tlc.build(path, arch=ARCH, defines=defines)
    counts = sass_summary(kernel.compiled.cubin)
    assert counts["HGMMA"] and counts["UTMALDG"] and counts["USETMAXREG"], counts
    assert counts["LDL"] == counts["STL"] == 0, counts
    assert kernel.attributes()["local_bytes"] == 0
