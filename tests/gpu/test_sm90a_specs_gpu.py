"""GPU correctness of the sm_90a lowering (wgmma SS/RS fed by cp.async, docs/hopper.md): specs built
from their `.tl` for sm_90a equal the TL interpreter (float64, CPU) on the same bf16 inputs at odd
sizes, q ≠ k lengths, causal both alignments; outputs NaN-poisoned first (unwritten rows show).

Run on an H100/H200: `pytest -m gpu tests/gpu/test_sm90a_specs_gpu.py` (skipped without an sm_90 GPU).
Fill the cache first on a CPU machine or the GPU host (no GPU needed):
`python tests/gpu/test_sm90a_specs_gpu.py --precompile --jobs 8`.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

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
    "gqa64": ("gqa_fwd", {"HeadDim": "64", "Warps": "8"}),
    "b2b": ("b2b_gemm_relu", {}),
    "softcap_causal": ("softcap_fwd", {"Causal": "true"}),
}


def source(case: str) -> tuple[bytes, str, dict[str, str]]:
    spec, defines = CASES[case]
    path = SPECS / f"{spec}.tl"
    return path.read_bytes(), str(path), defines


def _precompile(case: str) -> str:
    import tlc
    data, _, defines = source(case)
    try:
        tlc.build(data.decode(), arch=ARCH, defines=defines)
    except Exception as exc:  # noqa: BLE001 - report and continue
        return f"{case}: ERROR {exc}"
    return f"{case}: ok"


if __name__ == "__main__" and "--precompile" in sys.argv:
    from concurrent.futures import ProcessPoolExecutor

    jobs = int(sys.argv[sys.argv.index("--jobs") + 1]) if "--jobs" in sys.argv else 4
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for line in pool.map(_precompile, CASES):
            print(line, flush=True)
    raise SystemExit(0)

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# (seqlen_q, seqlen_k): a single row and key, odd lengths inside one tile and across tiles, q ≠ k both ways
SIZES = [(1, 1), (17, 17), (17, 33), (333, 77), (77, 333), (1000, 1000), (1, 1000)]
_BUILT: dict = {}


@pytest.fixture(autouse=True)
def _hopper() -> None:
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90a kernels need an sm_90 GPU (H100/H200)")


def built(case: str):
    import tlc
    from tlc.api import compile_graph
    if case not in _BUILT:
        data, name, defines = source(case)
        graph, _ = compile_graph(data, name, defines=defines)
        _BUILT[case] = (graph, tlc.build(data.decode(), arch=ARCH, defines=defines))
    return _BUILT[case]


def run_case(case: str, sq: int, sk: int, B: int = 1, H: int = 2, Hkv: int | None = None) -> None:
    from tlc.ir.interpreter import run_program
    graph, kern = built(case)
    gen = torch.Generator().manual_seed(sq * 1000 + sk)
    rows = {"seqlen_q": sq, "seqlen_k": sk}
    tensors = {}
    for arg in kern.inputs:
        heads = H if arg.head == "head_idx" else (Hkv or H)
        n = rows.get(arg.rows, int(arg.rows) if arg.rows.isdigit() else 0)
        tensors[arg.name] = torch.randn(B, heads, n, arg.cols, generator=gen).to(torch.bfloat16)
    scalars = {k: v for k, v in rows.items() if k in graph.inputs}
    if "scale" in graph.inputs:
        scalars["scale"] = 1.0 / math.sqrt(kern.inputs[0].cols)
    ref_in = {k: v.double() for k, v in tensors.items()}
    for arg in kern.outputs:
        ref_in[arg.name] = torch.full((B, H, rows.get(arg.rows, 0), arg.cols), float("nan"), dtype=torch.float64)
    ref = run_program(graph, ref_in, scalars)
    args = [tensors[a.name].cuda() for a in kern.inputs]
    out_name = kern.outputs[0].name
    poisoned = torch.full(ref[out_name].shape, float("nan"), device="cuda", dtype=torch.bfloat16)
    extra = {k: v for k, v in scalars.items() if k not in rows and k != "group"}
    o = kern(*args, out=poisoned, **extra)
    torch.cuda.synchronize()
    o, r = o.double().cpu(), ref[out_name]
    assert torch.isfinite(o).all(), f"{case} {sq}x{sk}: non-finite output (unwritten rows?)"
    err = (o - r).abs().max().item() if r.numel() else 0.0
    bound = 2e-2 * max(1.0, r.abs().max().item() if r.numel() else 1.0)
    assert err <= bound, f"{case} {sq}x{sk}: max|kernel - interpreter| = {err:.3e} > {bound:.3e}"


@pytest.mark.parametrize("sq,sk", SIZES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_sm90a_kernel_equals_interpreter(case: str, sq: int, sk: int) -> None:
    run_case(case, sq, sk)


def test_sm90a_grouped_heads_and_batches() -> None:
    run_case("gqa64", 77, 333, B=2, H=8, Hkv=2)

