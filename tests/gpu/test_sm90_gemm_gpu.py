"""The hand-built Hopper tile GEMM (tests/nvrtc/sm90_programs.py) on an sm_90 GPU: TMA descriptors encoded
at launch, the mbarrier ring, wgmma and warp roles against torch.matmul in float32, into a NaN-poisoned
output; and its SASS (HGMMA, UTMALDG, no local memory) when cuobjdump is on the PATH.

Run with `pytest -m gpu tests/gpu/test_sm90_gemm_gpu.py` on an H100/H200 (skipped without a GPU, and
on GPUs that are not sm_90). The cubin is built here with NVRTC (~15 s on a CPU, cached after).
"""
from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.nvrtc.sm90_programs import tile_gemm_sm90

torch = pytest.importorskip("torch")

BM, BN, BK = 128, 128, 64


def _hopper() -> None:
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip(f"needs an sm_90 GPU (H100/H200), found sm_{''.join(map(str, torch.cuda.get_device_capability()))}")


@pytest.fixture(scope="module")
def kernel():
    from tlc.backend_cute.compile import compile_kir
    from tlc.backend_cute.launch import Kernel
    from tlc.lowering.abi import LaunchABI

    compiled = compile_kir(tile_gemm_sm90(), "sm_90a", source_name="sm90_programs.py")
    # A hand-built program has no TL tensors: it is launched through `launch` with its fields by name.
    return Kernel(compiled, LaunchABI("tile_gemm_sm90", (), (), "1", 1))


def _gemm(kernel, a, b):
    m, k = a.shape
    n = b.shape[0]
    c = torch.full((m, n), float("nan"), dtype=torch.float32, device=a.device)   # poisoned: every element is written
    values = {"A_ptr": a.data_ptr(), "B_ptr": b.data_ptr(), "C_ptr": c.data_ptr(), "M": m, "N": n, "K": k}
    kernel.launch(values, a.device, torch.cuda.current_stream(a.device).cuda_stream, tensors={"A_ptr": a, "B_ptr": b})
    return c


@pytest.mark.gpu
@pytest.mark.parametrize("m_tiles, n_tiles, k_tiles", [(1, 1, 1), (1, 1, 2), (3, 5, 7), (5, 3, 9), (2, 7, 33)])
def test_tile_gemm_matches_torch(kernel, m_tiles: int, n_tiles: int, k_tiles: int) -> None:
    _hopper()
    g = torch.Generator(device="cuda").manual_seed(m_tiles * 1000 + n_tiles * 10 + k_tiles)
    a = torch.randn(m_tiles * BM, k_tiles * BK, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(n_tiles * BN, k_tiles * BK, device="cuda", dtype=torch.bfloat16, generator=g)
    c = _gemm(kernel, a, b)
    torch.cuda.synchronize()
    ref = a.float() @ b.float().T
    assert not torch.isnan(c).any(), "some output elements were never written"
    # bf16 products are exact in fp32; only the summation order differs from torch's.
    torch.testing.assert_close(c, ref, atol=1e-2 * (k_tiles * BK) ** 0.5 / 8, rtol=1e-3)


@pytest.mark.gpu
def test_tile_gemm_reads_strided_rows(kernel) -> None:
    """A and B as row slices of wider tensors: the descriptors take the row stride from the tensors."""
    _hopper()
    g = torch.Generator(device="cuda").manual_seed(7)
    wide_a = torch.randn(BM * 2, BK * 5, device="cuda", dtype=torch.bfloat16, generator=g)
    wide_b = torch.randn(BN * 3, BK * 5, device="cuda", dtype=torch.bfloat16, generator=g)
    a, b = wide_a[:, : BK * 3], wide_b[:, : BK * 3]
    c = _gemm(kernel, a, b)
    torch.cuda.synchronize()
    torch.testing.assert_close(c, a.float() @ b.float().T, atol=2e-2, rtol=1e-3)


@pytest.mark.gpu
def test_tile_gemm_sass(kernel, tmp_path) -> None:
    _hopper()
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump is None:
        pytest.skip("cuobjdump is not on the PATH")
    cubin = tmp_path / "tile_gemm_sm90.cubin"
    cubin.write_bytes(kernel.compiled.cubin)
    sass = subprocess.run([cuobjdump, "--dump-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    assert "HGMMA" in sass and "UTMALDG" in sass, sass[:2000]
    assert "LDL" not in sass and "STL" not in sass, "local memory (spills or a dynamically indexed array)"
    assert kernel.attributes()["local_bytes"] == 0
