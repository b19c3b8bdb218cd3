"""`tlc gen` in TL mode: two stages → checked `.tl` → tlc build → optional LLM translation."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tlc_llm.build import build_tl
from tlc_llm.checker import Checker
from tlc_llm.generate import generate_tl
from tlc_llm.gpucheck import check_tl_on_gpu
from tlc_llm.output import write_output
from tlc_llm.prompts import PromptSet
from tlc_llm.repair import StageFailed
from tlc_llm.request import GenRequest
from tlc_llm.session import RunSettings, Session
from tlc_llm.targets import TargetFacts

Log = Callable[[str], None]


@dataclass(frozen=True)
class RunPlan:
    settings: RunSettings
    request: GenRequest
    facts: TargetFacts
    out_path: Path
    build_dir: Path | None  # None: do not build
    force: bool

    @property
    def filename(self) -> str:
        """The name the model sees in diagnostics: the recorded one, so a replay asks the same."""
        return self.settings.filename or self.out_path.name


@dataclass(frozen=True)
class RunResult:
    """What one run achieved; `None` means "not attempted" (--no-build, no GPU), not failure."""

    written: bool
    compiled: bool | None = None
    correct: bool | None = None

    @property
    def ok(self) -> bool:
        return self.written and self.compiled is not False and self.correct is not False


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def run_tl(session: Session, plan: RunPlan, log: Log) -> RunResult:
    """Generate, write, build (unless --no-build) and optionally translate; messages go to `log`."""
    checker = Checker()
    prompts = PromptSet(plan.request, plan.facts)
    outcome = session.transcript.outcome
    try:
        generated = generate_tl(session.client, prompts, checker, filename=plan.filename,
                                max_rounds=plan.settings.max_rounds)
    except StageFailed as exc:
        outcome.update(status="failed", message=str(exc))
        log(f"error: {exc}")
        return RunResult(False)
    write_output(plan.out_path, generated.text, plan.force, session.secret)
    outcome.update(
        status="ok", sha256=sha256(generated.text),
        repair_rounds=generated.repair_rounds, remarks=list(generated.remarks),
    )
    for remark in generated.remarks:
        log(remark.splitlines()[0])
    log(f"wrote {plan.out_path} ({session.client.calls} LLM call(s), {generated.repair_rounds} repair round(s))")
    if plan.build_dir is None:
        return RunResult(True)
    built = build_tl(generated.text, plan.out_path, plan.facts.name, plan.build_dir, plan.settings.defines)
    if not built.ok:
        log(f"error: {plan.out_path} passes tlc check, but tlc build failed: {built.message}")
        return RunResult(True, compiled=False)
    log(built.message)
    correct = check_tl_on_gpu(plan.out_path, Path(built.artifacts["cubin"]).read_bytes(), plan.facts.name,
                              plan.settings.defines, plan.request)
    if correct.correct is False:
        log(f"error: tlc's kernel for {plan.out_path} is wrong for the request: {correct.summary}")
    else:
        log(f"correctness: {correct.summary}")
    if plan.settings.translate == "llm":
        from tlc_llm.translate import translate_with_llm

        translated = translate_with_llm(session, plan, prompts, generated.text, built.artifacts)
        log(translated.message)
    return RunResult(True, compiled=True, correct=correct.correct)
