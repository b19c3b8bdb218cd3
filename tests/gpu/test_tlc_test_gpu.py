"""`tlc test --gpu`: hypothesis shapes through the built kernel, on the GPU."""
from __future__ import annotations

from pathlib import Path

import pytest

from tlc.testing.runner import run_tl_test

SPECS = Path(__file__).resolve().parents[2] / "specs"
CASES = [("mha_fwd.tl", ["HeadDim=64", "BM=64", "BN=64", "Causal=true"]), ("b2b_gemm_relu.tl", [])]


@pytest.mark.gpu
@pytest.mark.parametrize("spec, defines", CASES, ids=[c[0] for c in CASES])
def test_tlc_test_gpu_passes(spec, defines) -> None:
    lines: list[str] = []
    code = run_tl_test(SPECS / spec, examples=20, seed=0, gpu=True, defines=defines, out=lines.append)
    assert code == 0, "\n".join(lines)
    assert "GPU kernel within" in lines[-1]


def builds() -> list[tuple[Path, dict]]:
    """Every (spec, -D bindings) these tests build, for bench/precompile.py and --precompile (no GPU)."""
    return [(SPECS / spec, dict(d.split("=") for d in defines)) for spec, defines in CASES]


def _precompile(job: tuple[Path, dict]) -> str:
    import tlc

    spec, defines = job
    tlc.build(spec, arch="sm_90", defines=defines)
    return f"built {spec.name}"


if __name__ == "__main__":
    import sys
    from concurrent.futures import ProcessPoolExecutor

    if "--precompile" in sys.argv:
        with ProcessPoolExecutor(max_workers=len(CASES)) as pool:
            for line in pool.map(_precompile, builds()):
                print(line, flush=True)
