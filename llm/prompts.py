"""Render the prompt templates in llm/prompts/ for each stage of the workflow.

Templates are `string.Template` files (strict `substitute`: a missing key is a bug here, not
a silently empty prompt). The language reference is specs/LANGUAGE.md when the checkout has
it, so the model is taught the language tlc actually parses; the packaged summary is only a
fallback for installs without specs/.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from string import Template

from tlc_llm.request import GenRequest
from tlc_llm.targets import TargetFacts

PROMPT_DIR = Path(__file__).resolve().parent / "prompts"
_DTYPE_BYTES = {"bf16": 2, "fp16": 2}


def template(name: str) -> Template:
    return Template((PROMPT_DIR / name).read_text(encoding="utf-8"))


def specs_dir() -> Path | None:
    """specs/ beside the tlc package (a checkout), or $TLC_SPECS_DIR."""
    env = os.environ.get("TLC_SPECS_DIR")
    if env:
        return Path(env)
    try:
        import tlc
    except ImportError:
        return None
    candidate = Path(tlc.__file__).resolve().parent.parent / "specs"
    return candidate if candidate.is_dir() else None


def language_reference() -> str:
    specs = specs_dir()
    if specs is not None and (specs / "LANGUAGE.md").is_file():
        return (specs / "LANGUAGE.md").read_text(encoding="utf-8").strip()
    return (PROMPT_DIR / "language_fallback.txt").read_text(encoding="utf-8").strip()


def example_program(variant: str) -> str:
    """A spec of another variant (teaching by example without handing over the answer)."""
    specs = specs_dir()
    if specs is not None:
        preferred = ["mha_fwd.tl", "gqa_fwd.tl"] if variant != "mha" else ["gqa_fwd.tl", "mqa_fwd.tl"]
        for name in preferred:
            if (specs / name).is_file():
                return (specs / name).read_text(encoding="utf-8").strip()
    return (PROMPT_DIR / "example_fallback.tl").read_text(encoding="utf-8").strip()


def _causal_rule(request: GenRequest) -> str:
    """Phrased with the Params the specs use (`Causal`, `Align`), so one file keeps serving -D overrides."""
    if not request.causal:
        return "- The kernel is not causal: `Param Causal = false` (a `... when Causal` mask stays off).\n"
    align = request.alignment or "top_left"
    meaning = (
        "query i sees keys j <= i, as PyTorch SDPA" if align == "top_left"
        else "query i sees keys j <= i + seqlen_k - seqlen_q, as FlashAttention >= 2.1"
    )
    return (f"- The kernel is causal: `Param Causal = true`, `Param Align = {align}` ({meaning}), and mask S\n"
            "  before the softmax: `Compute Mask S causal Align and get new S when Causal`.\n")


@dataclass(frozen=True)
class PromptSet:
    """The fixed parts of one run's prompts: request, target facts, language, example."""

    request: GenRequest
    facts: TargetFacts

    def system(self, language: str = "tl") -> str:
        """`tl` for the two TL stages, `cuda` for vanilla and translation."""
        name = "system.txt" if language == "tl" else "system_cuda.txt"
        return (PROMPT_DIR / name).read_text(encoding="utf-8").strip()

    def _common(self) -> dict[str, str]:
        return {
            "request_text": self.request.text,
            "request_summary": self.request.describe(),
            "d_qk": str(self.request.d_qk),
            "d_v": str(self.request.d_v),
            "dtype": self.request.dtype,
            "arch": self.facts.name,
            "target_facts": self.facts.render(self.request.dtype),
        }

    def sketch(self) -> str:
        algorithm = (PROMPT_DIR / f"algorithm_{self.request.variant}.txt").read_text(encoding="utf-8").strip()
        return template("sketch.txt").substitute(
            self._common(), algorithm=algorithm, language=language_reference(),
            example=example_program(self.request.variant),
        ).strip()

    def parameters(self, sketch: str) -> str:
        return template("parameters.txt").substitute(
            self._common(), sketch=sketch.strip(), language=language_reference(),
            smem_per_block=str(self.facts.smem_per_block),
            dtype_bytes=str(_DTYPE_BYTES[self.request.dtype]), causal_rule=_causal_rule(self.request),
        ).strip()

    def translate(self, tl_code: str, launch_abi: str, cutlass_version: str) -> str:
        return template("translate.txt").substitute(
            self._common(), tl_code=tl_code.strip(), launch_abi=launch_abi.strip(), cutlass_version=cutlass_version,
        ).strip()

    def vanilla(self, vanilla_abi: str) -> str:
        return template("vanilla.txt").substitute(self._common(), vanilla_abi=vanilla_abi.strip()).strip()


def repair_prompt(filename: str, diagnostics: str) -> str:
    return template("repair.txt").substitute(filename=filename, diagnostics=diagnostics.strip()).strip()


def no_code_prompt() -> str:
    return (PROMPT_DIR / "no_code.txt").read_text(encoding="utf-8").strip()


def repair_cpp_prompt(filename: str, diagnostics: str) -> str:
    lines = diagnostics.strip().splitlines()
    if len(lines) > 60:  # an NVRTC log can run to thousands of lines of template noise
        lines = lines[:60] + [f"... ({len(lines) - 60} more lines)"]
    return template("repair_cpp.txt").substitute(filename=filename, diagnostics="\n".join(lines)).strip()


def no_code_cpp_prompt() -> str:
    return (PROMPT_DIR / "no_code_cpp.txt").read_text(encoding="utf-8").strip()


def vanilla_abi(request: GenRequest) -> str:
    elem = "__nv_bfloat16" if request.dtype == "bf16" else "__half"
    if not request.causal:
        mask = "Not causal: every query attends to every key."
    elif (request.alignment or "top_left") == "top_left":
        mask = "Causal, top-left aligned: query i attends to keys j <= i (as torch SDPA)."
    else:
        mask = "Causal, bottom-right aligned: query i attends to keys j <= i + seqlen_k - seqlen_q; a row with no key gives 0."
    return template("vanilla_abi.txt").substitute(
        elem=elem, d_qk=str(request.d_qk), d_v=str(request.d_v), mask_rule=mask,
    ).strip()
