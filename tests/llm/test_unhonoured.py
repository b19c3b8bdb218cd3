"""`tlc gen` names every part of a request it cannot honour (a window, ALiBi, softcap, dropout, a paged
cache, varlen, decode, fp8, the backward pass, masks, …), one line each, before its first model call; a
request it can honour gets no such line."""
from __future__ import annotations

import pytest
from loopback import fenced
from scripts import sketch_of, spec_text

from tlc_llm.request import parse_request, unhonoured


@pytest.mark.parametrize("text, words, feature", [
    ("sliding window attention, window 256, head dim 64", "'sliding window', 'window 256'", "a sliding window"),
    ("MHA with ALiBi", "'alibi'", "ALiBi"),
    ("GQA causal, softcap 30", "'softcap'", "a logit softcap"),
    ("MHA, dropout 0.1", "'dropout'", "dropout"),
    ("GQA over a paged KV cache with a block table", "'paged kv cache', 'block table'", "a paged KV cache"),
    ("varlen MHA, head dim 128", "'varlen'", "variable-length sequences"),
    ("GQA decode, head dim 128", "'decode'", "split-KV decode"),
    ("fp8 MHA", "'fp8'", "an fp8, int8 or fp32 element type"),
    ("MHA backward", "'backward'", "the backward pass"),
    ("causal MHA with a padding mask", "'padding mask'", "a mask other than causal"),
    ("attention with a relative position bias", "'relative position bias'", "an attention bias"),
])
def test_each_unhonoured_feature_is_one_line_quoting_the_request(text, words, feature) -> None:
    (line,) = unhonoured(parse_request(text))
    assert line.startswith(f"{words} asks for {feature}, which tlc gen cannot write yet; the kernel goes without: ")


@pytest.mark.parametrize("text", ["GQA, causal, head dim 128, bf16", "MLA decode, bf16", "causal mask, MQA 32/1 heads",
                                  "MHA, no dropout, fp32 accumulation", "mha causal top-left sm_90a"])
def test_a_request_tlc_gen_honours_has_no_such_line(text) -> None:
    assert unhonoured(parse_request(text)) == []


def test_every_variants_description_is_honoured() -> None:
    """eval re-reads each sample's request from its description: that must not warn."""
    from tlc_llm.request import VARIANTS, GenRequest

    for variant in VARIANTS:
        assert unhonoured(parse_request(GenRequest("x", variant, True, "bottom_right", 64, 32, "fp16", "sm_90a")
                                        .describe())) == []


def test_gen_says_what_it_drops_before_its_first_model_call(endpoint_env, tmp_path) -> None:
    """Before: the window was dropped without a word and plain MHA written."""
    from tlc_llm.cli import run

    program = spec_text()
    endpoint_env.script = [fenced(sketch_of(program)), fenced(program)]
    said: list[tuple[str, int]] = []
    out = tmp_path / "w.tl"
    status = run(["--timeout", "2", "--backoff", "0", "sliding window attention, window 256, head dim 64",
                  "-o", str(out), "--no-build"], lambda line: said.append((line, len(endpoint_env.received))))
    assert status == 0
    warnings = [(line, calls) for line, calls in said if line.startswith("warning: ")]
    assert warnings == [("warning: 'sliding window', 'window 256' asks for a sliding window, which tlc gen cannot "
                         "write yet; the kernel goes without: every query attends to every key (with causal, to "
                         "every earlier key)", 0)]
    assert ("note: what tlc gen writes: mha, non-causal, d_qk=64, d_v=64, bf16, sm_90", 0) in said


def test_gen_of_an_honoured_request_warns_of_nothing(endpoint_env, gen, tmp_path) -> None:
    program = spec_text()
    endpoint_env.script = [fenced(sketch_of(program)), fenced(program)]
    status, output = gen("MHA, head dim 128, bf16", "-o", str(tmp_path / "m.tl"), "--no-build")
    assert status == 0 and "warning:" not in output and "what tlc gen writes" not in output
