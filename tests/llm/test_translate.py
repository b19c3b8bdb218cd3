"""`--translate llm`: the LLM's CuTe goes through tlc's NVRTC path and launch ABI, or tlc falls back."""
from __future__ import annotations

import importlib.util
import json
import re

import pytest
from conftest import SECRET
from loopback import Reply, answer, fenced
from scripts import sketch_of, spec_text

from tlc_llm.gpucheck import gpu_available
from tlc_llm.prompts import PromptSet
from tlc_llm.request import parse_request
from tlc_llm.run_tl import RunPlan
from tlc_llm.session import Endpoint, RunSettings, live_session
from tlc_llm.targets import target_facts
from tlc_llm.translate import launch_abi, translate_with_llm

pytestmark = pytest.mark.skipif(importlib.util.find_spec("cuda") is None, reason="cuda-python (NVRTC) not installed")

STRUCT = "struct FlashParams {\n  float* o;\n  int sq;\n  float scale;\n};"
KERNEL = "k_mha_test"


def translation(name: str = KERNEL, broken: bool = False) -> str:
    body = "p.o[threadIdx.x] = p.scale" + ("" if broken else ";")
    return f'{STRUCT}\n\nextern "C" __global__ void {name}(const FlashParams p) {{\n  {body}\n}}\n'


@pytest.fixture
def setup(tmp_path, server):
    """A fake build (the .json/.cu tlc build writes) and a live session against the loopback server."""
    meta = {"kernels": [{"name": KERNEL, "params": "FlashParams", "threads": 128, "min_blocks": 1,
                         "grid": ["ceil_div(sq, 128)", "hq", "b"], "smem_bytes": 65536}],
            "defines": {"BM": "128"},
            "launch": {"tensors": [{"name": "O", "dtype": "f32", "rows": "sq", "cols": 128, "head": "head_idx",
                                    "output": True}]}}
    (tmp_path / "mha.json").write_text(json.dumps(meta))
    (tmp_path / "mha.cu").write_text(f"// emitted\n{STRUCT}\nextern \"C\" __global__ void {KERNEL}(const FlashParams p) {{}}\n")
    artifacts = {"json": str(tmp_path / "mha.json"), "cu": str(tmp_path / "mha.cu")}
    request = parse_request("MHA, head dim 128, bf16", "sm_90")
    settings = RunSettings(request=request.text, target="sm_90", translate="llm", max_rounds=1)
    plan = RunPlan(settings, request, target_facts("sm_90"), tmp_path / "mha.tl", tmp_path, False)
    plan.out_path.write_text(spec_text())  # the accepted .tl, written before any translation
    session = live_session(settings, Endpoint(server.base_url, "m", SECRET, 2.0), 0.0)
    return server, session, plan, artifacts


def test_launch_abi_names_kernel_grid_and_struct(setup):
    _, _, _, artifacts = setup
    abi = launch_abi(artifacts)
    assert abi.kernel == KERNEL
    assert f'extern "C" __global__ void {KERNEL}(const FlashParams p)' in abi.text
    assert "grid: (ceil_div(sq, 128), hq, b); block: (128, 1, 1); dynamic shared memory: 65536 bytes" in abi.text
    assert STRUCT in abi.text
    assert '"BM": "128"' in abi.text and "O f32 (sq, 128) at head head_idx (output)" in abi.text


def test_launch_abi_of_a_record_without_one_kernel_is_none(tmp_path):
    (tmp_path / "x.json").write_text(json.dumps({"kernels": []}))
    assert launch_abi({"json": str(tmp_path / "x.json")}) is None


def test_translation_compiles_and_is_accepted_or_gated(setup):
    server, session, plan, artifacts = setup
    server.script = [fenced(translation(name="wrong_name"), "cpp"), fenced(translation(), "cpp")]
    result = translate_with_llm(session, plan, PromptSet(plan.request, plan.facts), spec_text(), artifacts)
    prompt = server.received[0].body["messages"][1]["content"]
    assert spec_text().strip() in prompt and STRUCT in prompt and "SM80_16x8x16_F32BF16BF16F32_TN" in prompt
    assert "must define extern \"C\" __global__ void k_mha_test" in server.received[1].body["messages"][3]["content"]
    assert (plan.out_path.parent / "mha.llm.cu").read_text() == translation()
    assert (plan.out_path.parent / "mha.llm.cubin").stat().st_size > 100
    if gpu_available():
        assert not result.accepted and "using tlc's emitter" in result.message
    else:
        assert result.accepted and "LLM translation accepted: compiles for sm_90" in result.message


def test_translation_that_never_compiles_falls_back(setup):
    server, session, plan, artifacts = setup
    server.script = [fenced(translation(broken=True), "cpp"), answer("no idea")]
    result = translate_with_llm(session, plan, PromptSet(plan.request, plan.facts), spec_text(), artifacts)
    assert not result.accepted
    assert re.match(r"LLM translation rejected \(translate: no valid CUDA after 2 answer\(s\).*; using tlc's emitter$",
                    result.message)
    assert "NVRTC rejected your code" in server.received[1].body["messages"][3]["content"]
    assert not (plan.out_path.parent / "mha.llm.cu").exists()


def test_endpoint_failure_during_translation_falls_back(setup):
    server, session, plan, artifacts = setup
    server.script = [Reply(500, "down")] * 4
    result = translate_with_llm(session, plan, PromptSet(plan.request, plan.facts), spec_text(), artifacts)
    assert not result.accepted
    assert result.message.startswith("LLM translation failed (translate/round-0: no usable answer after 4 attempt(s)")
    assert result.message.endswith("using tlc's emitter")


def test_translation_without_launch_abi_is_skipped(setup):
    server, session, plan, _ = setup
    result = translate_with_llm(session, plan, PromptSet(plan.request, plan.facts), spec_text(), {})
    assert not result.accepted and "no launch ABI" in result.message and server.received == []


def test_build_refusal_is_one_line_after_writing_the_tl(endpoint_env, gen, tmp_path):
    """The backend refuses MLA decode with 64-row blocks (O alone needs 256 registers per thread) quickly
    and clearly; the checked .tl stays."""
    pytest.importorskip("tlc.api")
    program = spec_text("mla_decode_fwd.tl").replace("Param BM = 16", "Param BM = 64")
    endpoint_env.script = [fenced(sketch_of(program)), fenced(program)]
    out = tmp_path / "mla_decode.tl"
    status, output = gen("MLA decode", "-o", str(out), "--target", "sm_90")
    assert status == 1 and out.exists()
    errors = [ln for ln in output.splitlines() if "error:" in ln]
    assert len(errors) == 1 and "passes tlc check, but tlc build failed: " in errors[0], output
    assert "Traceback" not in output


@pytest.mark.slow
def test_gen_build_and_translate_end_to_end(endpoint_env, gen, tmp_path):
    """Real build (NVRTC, ~1-2 min on 2 cores), then the LLM translation against tlc's launch ABI."""
    pytest.importorskip("tlc.api")
    program = spec_text()

    def translate_reply(body: dict):
        prompt = body["messages"][1]["content"]
        kernel, params = re.search(r'void (\w+)\(const (\w+) p\)', prompt).groups()
        struct = re.search(r"struct " + params + r" \{.*?\};", prompt, re.DOTALL).group(0)
        src = (f"#include <cute/tensor.hpp>\n{struct}\n"
               f'extern "C" __global__ void {kernel}(const {params} p) '
               '{ if (p.seqlen_q < 0) p.O_ptr[0] = p.O_ptr[1]; }\n')
        return fenced(src, "cpp")

    endpoint_env.script = [fenced(sketch_of(program)), fenced(program), translate_reply]
    out = tmp_path / "mha.tl"
    status, output = gen("MHA, head dim 128, bf16", "-o", str(out), "--target", "sm_90", "--translate", "llm")
    assert status == 0, output
    assert (tmp_path / "mha.cubin").exists() and (tmp_path / "mha.llm.cubin").exists()
    # the scripted kernel computes nothing: accepted only where no GPU can show that
    expected = "but is wrong" if gpu_available() else "LLM translation accepted"
    assert expected in output, output
    record = json.loads((tmp_path / "mha.tl.transcript.json").read_text())
    assert [e["label"] for e in record["exchanges"]][-1] == "translate/round-0"
