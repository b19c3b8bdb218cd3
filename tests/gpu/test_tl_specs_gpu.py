"""GPU correctness through the per-op lowering: every shipped spec and every structural variant
(tests/lowering/variants.py), built from its `.tl`, equals the TL interpreter (float64, CPU) on
the same inputs at odd sizes; outputs NaN-poisoned first.

Run with `pytest -m gpu tests/gpu/test_tl_specs_gpu.py`. Fill the cache first, in parallel (no
GPU needed): `python tests/gpu/test_tl_specs_gpu.py --precompile --jobs 16`.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.gpu import differential  # noqa: E402
from tests.gpu.differential import precompile_main  # noqa: E402
from tests.lowering.variants import BUILDS  # noqa: E402

SPECS = ROOT / "specs"
ARCH = "sm_90"
CASES: dict[str, tuple[str, dict[str, str]]] = {
    "mha64": ("mha_fwd", {"HeadDim": "64"}),
    "mha128": ("mha_fwd", {"BN": "48"}),
    "mha64_causal": ("mha_fwd", {"HeadDim": "64", "Causal": "true"}),
    "mha64_causal_br": ("mha_fwd", {"HeadDim": "64", "Causal": "true", "Align": "bottom_right"}),
    "gqa": ("gqa_fwd", {"BN": "48"}),
    "mqa_causal": ("mqa_fwd", {"Causal": "true", "BN": "48"}),
    "mla_prefill": ("mla_prefill_fwd", {"BM": "64", "BN": "64"}),
    "softcap_causal": ("softcap_fwd", {"Causal": "true"}),
    "b2b": ("b2b_gemm_relu", {}),
    "chain3": ("chain3_fwd", {}),
    **{f"variant_{k}": (f"variant:{k}", {"HeadDim": "64"}) for k in BUILDS},
    # head dims that are multiples of 8, not of 32: padded inside the kernel (FlashAttention's rule)
    **{f"mha_d{d}": ("mha_fwd", {"HeadDim": str(d), "BM": "128" if d <= 128 else "64"})
       for d in (40, 80, 96, 112, 160, 224)},
    "mha_d40_causal": ("mha_fwd", {"HeadDim": "40", "Causal": "true"}),
    # 16 rows on 4 warps: scores replicated per warp, O split by columns (tlc/lowering/warps.py)
    "mla_decode": ("mla_decode_fwd", {}),
    "mla_decode_causal": ("mla_decode_fwd", {"Causal": "true"}),
    "mla_decode_32x8": ("mla_decode_fwd", {"BM": "32", "Warps": "8"}),   # 2 warps of rows, O split 4 ways
    # reduction-chains on the mma.sync path; trace-phases' stamps change no value
    "mha64_causal_chains2_traced": ("mha_fwd", {"HeadDim": "64", "Causal": "true", "ReduceChains": "2",
                                                "Trace": "true"}),
    # predicate masks: the window's key tiles classified (empty cut, full unmasked, partial masked per score)
    "sliding_window64": ("sliding_window_fwd", {"HeadDim": "64", "Window": "100"}),
    # tensor Inputs read by element: document ids per row and per key, a key length per sequence
    "documents64": ("document_mask_fwd", {"HeadDim": "64"}),
    "documents64_causal_br": ("document_mask_fwd", {"HeadDim": "64", "Causal": "true", "Align": "bottom_right"}),
    # a key length per sequence as the row extent of K and V: the rows past it NaN, never read
    "kv_lengths64": ("kv_lengths_fwd", {"HeadDim": "64"}),
    "kv_lengths64_causal": ("kv_lengths_fwd", {"HeadDim": "64", "Causal": "true"}),
    # a row vector output: each row's log-sum-exp, fp32 (batch, heads, rows)
    "lse64": ("mha_lse_fwd", {"HeadDim": "64"}),
    "lse64_causal_br": ("mha_lse_fwd", {"HeadDim": "64", "Causal": "true", "Align": "bottom_right"}),
    # a reduce-store: each query head's output added (atomically) into its KV head's rows of an fp32 tensor
    "group_sum64": ("group_sum_fwd", {"HeadDim": "64"}),
    "group_sum64_causal": ("group_sum_fwd", {"HeadDim": "64", "Causal": "true"}),
    # a kernel without GEMMs: fp32 tiles and vectors loaded straight into registers (the split-KV combine)
    "merge64": ("merge_states", {"HeadDim": "64"}),
    # a program of three kernels: two halves of the keys into fp32 workspaces, then their merge
    "split_kv64": ("split_kv_fwd", {}),
    # a paged KV cache: each row of K and V gathered from its page of a pool the batch shares (a row map), pages of
    # 16 rows (four per key tile), 64 (one) and 128 (half of one); unread pool rows NaN
    "paged64": ("paged_kv_fwd", {"HeadDim": "64"}),
    "paged64_page64": ("paged_kv_fwd", {"HeadDim": "64", "PageSize": "64"}),
    "paged64_page128_bn32": ("paged_kv_fwd", {"HeadDim": "64", "PageSize": "128", "BN": "32"}),
    # serving decode: split-KV with each sequence's length (tlc.flash_attn_with_kvcache's programs), paged too
    "decode64": ("decode_fwd", {"HeadDim": "64"}),
    "paged_decode64_causal": ("paged_decode_fwd", {"HeadDim": "64", "Causal": "true"}),
}


def source(case: str) -> tuple[bytes, str, dict[str, str]]:
    spec, defines = CASES[case]
    if spec.startswith("variant:"):
        name = spec.split(":")[1]
        return BUILDS[name].encode(), f"mha_{name}.tl", defines
    path = SPECS / f"{spec}.tl"
    return path.read_bytes(), str(path), defines


if __name__ == "__main__" and "--precompile" in sys.argv:
    precompile_main(CASES, source, ARCH)

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SIZES = [(1, 1), (17, 33), (333, 77), (1000, 1000)]


def run_case(case: str, sq: int, sk: int, B: int = 1, H: int = 2, Hkv: int | None = None) -> None:
    differential.run_case(case, source, ARCH, sq, sk, B, H, Hkv)


@pytest.mark.parametrize("sq,sk", SIZES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_kernel_equals_interpreter(case, sq, sk):
    run_case(case, sq, sk)


@pytest.mark.parametrize("case", ["gqa", "mqa_causal", "documents64", "kv_lengths64_causal", "group_sum64_causal",
                                  "split_kv64", "paged64"])
def test_grouped_heads(case):
    run_case(case, 77, 333, B=2 if case in ("gqa", "mqa_causal") else 3, H=8, Hkv=2 if case != "mqa_causal" else 1)


@pytest.mark.parametrize("hkv", [1, 4])
def test_reduce_store_sums_every_query_head_of_a_group(hkv):
    """8 query heads added into 1 (MQA) or 4 KV heads' rows: blocks of several heads add into the same rows."""
    run_case("group_sum64", 333, 200, B=2, H=8, Hkv=hkv)


@pytest.mark.parametrize("sq,sk", [(1, 1000), (2, 4097), (16, 300), (5, 1)])
@pytest.mark.parametrize("case", ["mla_decode", "mla_decode_causal", "mla_decode_32x8"])
def test_decode_lengths(case, sq, sk):
    """A few new tokens against a long latent cache, every query head reading KV head 0."""
    run_case(case, sq, sk, B=2, H=4, Hkv=1)
