"""Request parsing: the variant, causal and alignment, head dims, dtype and target."""
from __future__ import annotations

import pytest

from tlc_llm.request import VARIANTS, GenRequest, RequestError, parse_request


@pytest.mark.parametrize(
    "text, expect",
    [
        ("GQA, causal, head dim 128, bf16", dict(variant="gqa", causal=True, alignment="top_left", d_qk=128, dtype="bf16")),
        ("MQA 32/1 heads, d=64, fp16", dict(variant="mqa", causal=False, d_qk=64, d_v=64, dtype="fp16", group="32/1")),
        ("multi-head attention, non-causal, hdim 256", dict(variant="mha", causal=False, d_qk=256)),
        ("MLA prefill causal bottom-right", dict(variant="mla_prefill", causal=True, alignment="bottom_right",
                                                 d_qk=192, d_v=128)),
        ("MLA decode, bf16", dict(variant="mla_decode", d_qk=576, d_v=512)),
        ("attention d_qk=192, d_v=128 half precision", dict(variant="mha", d_qk=192, d_v=128, dtype="fp16")),
        ("grouped-query attention, head dims 64/32 on an A100", dict(variant="gqa", d_qk=64, d_v=32, target="sm_80")),
        ("mha causal top-left sm_90a", dict(causal=True, alignment="top_left", target="sm_90a")),
    ],
)
def test_parse(text, expect):
    request = parse_request(text)
    for key, value in expect.items():
        assert getattr(request, key) == value, key


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("causal, alignment", [(False, None), (True, "top_left"), (True, "bottom_right")])
def test_describe_round_trips(variant, causal, alignment):
    """eval turns requests into their description and back, so the two must agree."""
    original = GenRequest("x", variant, causal, alignment, 64, 32, "fp16", "sm_80")
    again = parse_request(original.describe())
    assert (again.variant, again.causal, again.alignment, again.d_qk, again.d_v, again.dtype, again.target) == (
        variant, causal, alignment, 64, 32, "fp16", "sm_80")


@pytest.mark.parametrize(
    "text, target, message",
    [
        ("", None, "empty request"),
        ("mha bf16 fp16", None, "both bf16 and fp16"),
        ("mha head dim 100", None, "multiple of 8"),
        ("mha on sm_80", "sm_90", "names target sm_80 but --target is sm_90"),
    ],
)
def test_errors(text, target, message):
    with pytest.raises(RequestError, match=message):
        parse_request(text, target)


def test_slug_names_the_specialisation():
    assert parse_request("GQA causal d=128 bf16").slug() == "gqa_causal_d128_bf16"
    assert parse_request("MLA decode").slug() == "mla_decode_full_d576x512_bf16"
