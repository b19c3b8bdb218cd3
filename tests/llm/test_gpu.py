"""On a GPU: `tlc gen` builds, launches through tlc's launcher and checks against the request;
`--translate llm` is accepted only when its kernel is correct. Needs NVRTC builds (minutes)."""
from __future__ import annotations

import re

import pytest
from loopback import fenced, one_error_line
from scripts import sketch_of, spec_text

from tlc_llm.gpucheck import gpu_available

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU")]
pytest.importorskip("tlc.api")


def causal(program: str) -> str:
    out, n = re.subn(r"^Param Causal = false$", "Param Causal = true", program, flags=re.MULTILINE)
    assert n == 1
    return out


def test_correct_kernels_for_the_request(endpoint_env, gen, tmp_path):
    for name, request, program in [("mha", "MHA, head dim 128, bf16", spec_text()),
                                   ("gqa", "GQA, causal, head dim 128, bf16", causal(spec_text("gqa_fwd.tl")))]:
        endpoint_env.script = [fenced(sketch_of(program)), fenced(program)]
        status, output = gen(request, "-o", str(tmp_path / f"{name}.tl"), "--target", "sm_90")
        assert status == 0 and "correctness: correct on 3 shapes" in output, output


def test_a_kernel_for_another_request_is_wrong(endpoint_env, gen, tmp_path):
    program = spec_text("gqa_fwd.tl")  # Causal = false
    endpoint_env.script = [fenced(sketch_of(program)), fenced(program)]
    status, output = gen("GQA, causal", "-o", str(tmp_path / "g.tl"), "--target", "sm_90")
    assert status == 1
    assert "is wrong for the request: the kernel was built with causal=False" in one_error_line(output)


def test_translation_is_checked_through_tlcs_launcher(endpoint_env, gen, tmp_path):
    program = spec_text()
    out = tmp_path / "mha.tl"

    def tlcs_own_source(body: dict):
        """A 'translation' that is tlc's emitted kernel: it must pass the same check."""
        return fenced((tmp_path / "mha.cu").read_text(), "cpp")

    def does_nothing(body: dict):
        prompt = body["messages"][1]["content"]
        kernel = re.search(r"void (\w+)\(const FlashParams p\)", prompt).group(1)
        struct = re.search(r"struct FlashParams \{.*?\};", prompt, re.DOTALL).group(0)
        return fenced(f"#include <cute/tensor.hpp>\n{struct}\n"
                      f'extern "C" __global__ void {kernel}(const FlashParams p) {{}}\n', "cpp")

    endpoint_env.script = [fenced(sketch_of(program)), fenced(program), tlcs_own_source]
    status, output = gen("MHA", "-o", str(out), "--translate", "llm", "--target", "sm_90")
    assert status == 0 and "LLM translation accepted: compiles for sm_90 (correct on the GPU)" in output, output
    endpoint_env.script = [fenced(sketch_of(program)), fenced(program), does_nothing]
    status, output = gen("MHA", "-o", str(out), "--translate", "llm", "--target", "sm_90", "--force")
    assert status == 0 and "but is wrong: wrong at" in output and "using tlc's emitter" in output, output
