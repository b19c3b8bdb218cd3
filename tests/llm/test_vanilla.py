"""`tlc gen --vanilla`: CUDA straight from the model, compiled by tlc's NVRTC path, checked on a GPU."""
from __future__ import annotations

import importlib.util

import pytest
from kernels import naive_kernel
from loopback import answer, fenced, one_error_line

from tlc_llm.gpucheck import gpu_available, launch_constants

needs_nvrtc = pytest.mark.skipif(importlib.util.find_spec("cuda") is None, reason="cuda-python (NVRTC) not installed")


def test_launch_constants():
    assert launch_constants(naive_kernel()) == {"BLOCK_M": 64, "NUM_THREADS": 64, "SMEM_BYTES": 0}
    assert launch_constants("#define BLOCK_M 2*64\nconstexpr int NUM_THREADS = 128;\n"
                            "static constexpr int SMEM_BYTES = 96 * 1024;") == {
        "BLOCK_M": 128, "NUM_THREADS": 128, "SMEM_BYTES": 98304}
    assert "BLOCK_M" in launch_constants("constexpr int NUM_THREADS = 1;")
    assert "NUM_THREADS in 1..1024" in launch_constants(
        "constexpr int BLOCK_M = 1; constexpr int NUM_THREADS = 4096; constexpr int SMEM_BYTES = 0;")


@needs_nvrtc
def test_vanilla_compiles_after_a_repair_round(endpoint_env, gen, tmp_path):
    endpoint_env.script = [fenced(naive_kernel(bug="syntax"), "cuda"), fenced(naive_kernel(), "cpp")]
    out = tmp_path / "mha.vanilla.cu"
    status, output = gen("MHA, head dim 128, bf16", "--vanilla", "-o", str(out))
    assert "Traceback" not in output
    if gpu_available():
        assert status == 0 and "correct on 3 shapes" in output, output
    else:
        assert status == 0 and "not checked (no CUDA GPU here)" in output, output
    assert out.read_text() == naive_kernel()
    first = endpoint_env.received[0].body["messages"]
    assert "CUDA" in first[0]["content"] and "extern \"C\" __global__ void attention_fwd" in first[1]["content"]
    repair = endpoint_env.received[1].body["messages"][3]["content"]
    assert "NVRTC rejected your code" in repair and "error" in repair


@needs_nvrtc
def test_vanilla_never_compiling_is_one_line(endpoint_env, gen, tmp_path):
    endpoint_env.script = [fenced(naive_kernel(bug="syntax"), "cpp"), answer("no code, sorry")]
    out = tmp_path / "v.cu"
    status, output = gen("MHA", "--vanilla", "-o", str(out), "--max-rounds", "1")
    assert status == 1 and not out.exists()
    assert "vanilla: no valid CUDA after 2 answer(s)" in one_error_line(output)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(
    "request_text, kwargs",
    [
        ("MHA, head dim 128, bf16", dict()),
        ("GQA 4/2, causal, head dim 64, fp16", dict(d_qk=64, d_v=64, dtype="fp16", causal=True)),
        ("MLA prefill, causal bottom-right", dict(d_qk=192, d_v=128, causal=True, bottom_right=True)),
    ],
)
def test_vanilla_correctness_on_gpu(endpoint_env, gen, tmp_path, request_text, kwargs):
    endpoint_env.script = [fenced(naive_kernel(**kwargs), "cpp")]
    status, output = gen(request_text, "--vanilla", "-o", str(tmp_path / "ok.cu"))
    assert status == 0 and "correct on 3 shapes" in output, output
    endpoint_env.script = [fenced(naive_kernel(**kwargs, bug="no-scale"), "cpp")]
    status, output = gen(request_text, "--vanilla", "-o", str(tmp_path / "bad.cu"))
    assert status == 1 and "compiles but is wrong: wrong at" in one_error_line(output)
