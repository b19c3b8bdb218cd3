"""Prompt templates render for every request shape, carry the language and the target's facts."""
from __future__ import annotations

import re

import pytest

from tlc_llm.prompts import PROMPT_DIR, PromptSet, language_reference, repair_prompt, specs_dir, vanilla_abi
from tlc_llm.request import VARIANTS, parse_request
from tlc_llm.targets import TABLE, TargetError, target_facts

REQUESTS = [f"{v.replace('_', ' ')}{c}" for v in VARIANTS for c in ("", ", causal", ", causal bottom-right")]


def no_placeholders(text: str) -> None:
    assert not re.search(r"\$\{?[A-Za-z_]", text), "an unsubstituted template field"


@pytest.mark.parametrize("text", REQUESTS)
def test_every_stage_renders(text):
    request = parse_request(text, "sm_90")
    prompts = PromptSet(request, target_facts("sm_90"))
    sketch = prompts.sketch()
    params = prompts.parameters("Copy Q from global to shared\n")
    for rendered in (sketch, params, prompts.vanilla(vanilla_abi(request)), prompts.translate("x", "abi", "4.2")):
        no_placeholders(rendered)
        assert request.describe() in rendered or rendered.startswith("# Task: translate")
    algorithm = (PROMPT_DIR / f"algorithm_{request.variant}.txt").read_text().strip()
    assert algorithm in sketch
    assert "Copy Q from global to shared" in params and "streaming multiprocessors: 132" in params
    if request.causal:
        assert f"Param Align = {request.alignment}" in params
    else:
        assert "Param Causal = false" in params


def test_language_is_the_repository_reference_when_present():
    specs = specs_dir()
    if specs is None or not (specs / "LANGUAGE.md").is_file():
        pytest.skip("no specs/LANGUAGE.md beside this tlc")
    assert language_reference() == (specs / "LANGUAGE.md").read_text().strip()
    sketch = PromptSet(parse_request("GQA", "sm_90"), target_facts("sm_90")).sketch()
    assert (specs / "mha_fwd.tl").read_text().strip() in sketch  # an example of another variant


def test_target_facts_come_from_the_table():
    facts = target_facts("sm_80")
    text = facts.render("fp16")
    assert "A100" in text and "166912 bytes" in text and "SM80_16x8x16_F32F16F16F32_TN" in text
    assert "BF16" not in text.split("MMA atoms")[1].split("\n")[0]  # only the dtype's atoms
    assert "no cp.async" in target_facts("sm_75").render("fp16")
    assert "wgmma" in target_facts("sm_90a").render("bf16")
    assert set(TABLE) >= {"sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"}
    with pytest.raises(TargetError, match="unknown target 'sm_99'"):
        target_facts("sm_99")


def test_repair_prompt_carries_the_diagnostics():
    rendered = repair_prompt("out.tl", "out.tl:3:5: error: expected ')'\n  Copy Q (BM\n      ^")
    assert "out.tl:3:5: error: expected ')'" in rendered and "```tl" in rendered
    no_placeholders(rendered)


def test_templates_are_flat_files_for_package_data():
    """setup.cfg ships `prompts/*`: a subdirectory would be left out of an installed wheel."""
    assert all(p.is_file() for p in PROMPT_DIR.iterdir())
