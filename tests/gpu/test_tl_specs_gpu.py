"""GPU correctness through the TL path: `.tl` → TL passes → select-atoms (the score program read
from the graph) → kernel IR → NVRTC → launch. Softcap, a back-to-back GEMM relu(A·Bᵀ)·C and the
attention specs at odd sizes; outputs NaN-poisoned; DESIGN §8's rule (tlc.testing_tolerance) for
attention, the same rule shape against tlc.reference.b2b_gemm_reference for the GEMM chain.

Run with `pytest -m gpu tests/gpu/test_tl_specs_gpu.py`. Fill the cache first, in parallel:
`python tests/gpu/test_tl_specs_gpu.py --precompile --jobs 16` (no GPU needed for that step).
Last run: 2026-11-22, NVIDIA H200, torch 2.11: 40 passed (the 8 kernels compiled in 41-54 s each,
8 in parallel, NVRTC 13.0 on the device's CPU).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPECS = ROOT / "specs"
ARCH = "sm_90"

# (spec, defines): one kernel each. Attention specs at their shipped or small tiles.
CASES: dict[str, tuple[str, dict[str, str]]] = {
    "softcap": ("softcap_fwd", {}),
    "softcap_causal": ("softcap_fwd", {"Causal": "true"}),
    "b2b": ("b2b_gemm_relu", {}),
    "mha64": ("mha_fwd", {"HeadDim": "64"}),
    "mha64_causal_br": ("mha_fwd", {"HeadDim": "64", "Causal": "true", "Align": "bottom_right"}),
    "gqa": ("gqa_fwd", {}),
    "mqa_causal": ("mqa_fwd", {"Causal": "true"}),
    "mla_prefill": ("mla_prefill_fwd", {"BM": "64", "BN": "64"}),
}


def lower_case(case: str):
    """The TL path up to the kernel IR: (FlashFwdConfig, ProgramOp, .tl file name)."""
    from tlc.api import compile_graph
    from tlc.kir.flash_fwd import build_flash_fwd_kir
    from tlc.lowering.select_atoms import flash_config, select_attention

    spec, defines = CASES[case]
    path = SPECS / f"{spec}.tl"
    graph, _ = compile_graph(path.read_bytes(), str(path), defines=defines)
    cfg = flash_config(select_attention(graph, ARCH), name=spec)
    return cfg, build_flash_fwd_kir(cfg), path.name


def compile_case(case: str):
    from tlc.backend_cute.compile import compile_kir

    cfg, program, source_name = lower_case(case)
    return cfg, compile_kir(program, ARCH, source_name=source_name)


def _precompile(case: str) -> str:
    _, compiled = compile_case(case)
    return f"{case}: {compiled.program.name} {'cached' if compiled.cached else f'{compiled.compile_seconds:.1f} s'}"


if __name__ == "__main__" and "--precompile" in sys.argv:
    from concurrent.futures import ProcessPoolExecutor

    jobs = int(sys.argv[sys.argv.index("--jobs") + 1]) if "--jobs" in sys.argv else 4
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for line in pool.map(_precompile, CASES):
            print(line, flush=True)
    raise SystemExit(0)

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from tlc.diagnostics import TlcError  # noqa: E402
from tlc.reference import b2b_gemm_reference  # noqa: E402
from tlc.testing_tolerance import check_attention  # noqa: E402

_KERNELS: dict = {}
SIZES = [(1, 1), (17, 17), (1000, 1000), (17, 1000), (1000, 17)]


def kernel(case: str):
    from tlc.backend_cute.attention import spec_of
    from tlc.backend_cute.launch import Kernel

    if case not in _KERNELS:
        cfg, compiled = compile_case(case)
        _KERNELS[case] = (cfg, Kernel(compiled, spec_of(cfg)))
    return _KERNELS[case]


def run_attention(case: str, B: int, Hq: int, Hkv: int, sq: int, sk: int, softcap: float | None = None):
    cfg, kern = kernel(case)
    q = torch.randn(B, Hq, sq, cfg.d_qk, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, sk, cfg.d_qk, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, Hkv, sk, cfg.d_v, device="cuda", dtype=torch.bfloat16)
    out = torch.full((B, Hq, sq, cfg.d_v), float("nan"), device="cuda", dtype=torch.bfloat16)
    o = kern(q, k, v, out=out)
    torch.cuda.synchronize()
    report = check_attention(o, q, k, v, causal=cfg.causal, alignment=cfg.alignment, softcap=softcap)
    assert report.passed, f"{case} B{B} H{Hq}/{Hkv} {sq}x{sk}: {report}"
    return o


@pytest.mark.parametrize("sq,sk", SIZES)
@pytest.mark.parametrize("case", ["softcap", "softcap_causal"])
def test_softcap_from_tl_computes(case, sq, sk):
    run_attention(case, 2, 4, 2, sq, sk, softcap=30.0)


def test_softcap_custom_scale_reaches_the_score_scalar():
    cfg, kern = kernel("softcap")
    q, k, v = (torch.randn(1, 2, 300, cfg.d_qk, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o = kern(q, k, v, scale=0.3)
    torch.cuda.synchronize()
    report = check_attention(o, q, k, v, scale=0.3, softcap=30.0)
    assert report.passed, str(report)


def _b2b_check(o, a, b, c):
    """DESIGN §8's rule, for relu(A·Bᵀ)·C: ref in float64 (tlc.reference); lowp = the same in bf16
    (intermediate rounded to bf16, as the kernel's P is); pass iff max|o−ref| ≤ 2·max|lowp−ref| + 2·noise."""
    ref = b2b_gemm_reference(a, b, c).float()
    lowp = (torch.relu(a @ b.transpose(-1, -2)) @ c).float()
    noise = ((ref + 0.3 - 0.3) - ref).abs().max().item()
    err = (o.float() - ref).abs().max().item()
    bound = 2 * (lowp - ref).abs().max().item() + 2 * noise
    assert torch.isfinite(o).all().item(), "non-finite output (a NaN-poisoned element was not written?)"
    assert err <= bound, f"max|o-ref|={err:.3e} > bound {bound:.3e}"


@pytest.mark.parametrize("m,n1", SIZES + [(129, 4096)])
def test_b2b_gemm_relu(m, n1):
    cfg, kern = kernel("b2b")
    assert not cfg.softmax and kern.spec.tensor_names == ("A", "B", "C", "O")
    B, H = 2, 3
    a = torch.randn(B, H, m, cfg.d_qk, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(B, H, n1, cfg.d_qk, device="cuda", dtype=torch.bfloat16)
    c = torch.randn(B, H, n1, cfg.d_v, device="cuda", dtype=torch.bfloat16)
    out = torch.full((B, H, m, cfg.d_v), float("nan"), device="cuda", dtype=torch.bfloat16)
    o = kern(a, b, c, out=out)
    torch.cuda.synchronize()
    _b2b_check(o, a, b, c)


def test_b2b_argument_errors_name_the_programs_tensors():
    cfg, kern = kernel("b2b")
    a = torch.randn(1, 2, 64, cfg.d_qk, device="cuda", dtype=torch.bfloat16)
    c = torch.randn(1, 2, 64, cfg.d_v + 8, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(TlcError, match="head dim of C"):
        kern(a, a, c)


@pytest.mark.parametrize("sq,sk", SIZES)
@pytest.mark.parametrize("case", ["mha64", "mha64_causal_br"])
def test_mha_through_tl(case, sq, sk):
    run_attention(case, 2, 3, 3, sq, sk)


@pytest.mark.parametrize("sq,sk", [(1, 1), (17, 1000), (1000, 17), (333, 517)])
@pytest.mark.parametrize("case,hq,hkv", [("gqa", 8, 2), ("mqa_causal", 8, 1)])
def test_gqa_mqa_through_tl(case, hq, hkv, sq, sk):
    run_attention(case, 1, hq, hkv, sq, sk)


@pytest.mark.parametrize("sq,sk", [(1, 1), (17, 300), (1000, 1000), (300, 17)])
def test_mla_prefill_through_tl(sq, sk):
    o = run_attention("mla_prefill", 1, 4, 2, sq, sk)
    if sq > sk:  # bottom-right causal: the first sq - sk rows see no key and must be 0
        assert (o[:, :, : sq - sk] == 0).all()
