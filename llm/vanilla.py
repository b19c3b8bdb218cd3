"""The paper's baseline: the LLM writes CUDA directly; we report whether it compiles and is correct.

Same endpoint, same round budget and the same NVRTC as the TL workflow, so the comparison
measures the language, not the plumbing.
"""
from __future__ import annotations

from typing import Callable

from tlc_llm.checker import Check, ToolchainError
from tlc_llm.code import extract_cpp
from tlc_llm.extract import Candidate
from tlc_llm.gpucheck import CorrectnessResult, check_vanilla_on_gpu
from tlc_llm.nvrtc import compile_cuda
from tlc_llm.output import write_output
from tlc_llm.prompts import PromptSet, no_code_cpp_prompt, repair_cpp_prompt, vanilla_abi
from tlc_llm.repair import Dialect, StageFailed, run_stage
from tlc_llm.run_tl import RunPlan, RunResult, sha256
from tlc_llm.session import Session

Log = Callable[[str], None]


def _cpp_candidates(answer: str) -> list[Candidate]:
    source = extract_cpp(answer)
    return [Candidate(source, "cpp", 0)] if source else []


def cpp_dialect() -> Dialect:
    return Dialect(_cpp_candidates, repair_cpp_prompt, no_code_cpp_prompt(), what="CUDA")


def run_vanilla(session: Session, plan: RunPlan, log: Log) -> RunResult:
    """Ask for CUDA, repair on NVRTC errors, write the source, check it on a GPU if there is one."""
    prompts = PromptSet(plan.request, plan.facts)
    cubins: dict[str, bytes] = {}

    def check(source: str) -> Check:
        compiled = compile_cuda(source, plan.facts.name, plan.filename)
        if compiled.unavailable:
            raise ToolchainError(f"cannot compile the vanilla kernel: {compiled.log.splitlines()[0]}")
        if compiled.ok:
            cubins[source] = compiled.cubin
        return Check(compiled.ok, 0 if compiled.ok else max(compiled.log.count("error"), 1), compiled.log)

    outcome = session.transcript.outcome
    try:
        stage = run_stage(
            session.client, prompts.system("cuda"), prompts.vanilla(vanilla_abi(plan.request)), check,
            label="vanilla", filename=plan.filename, max_rounds=plan.settings.max_rounds, dialect=cpp_dialect(),
        )
    except StageFailed as exc:
        outcome.update(status="failed", message=str(exc))
        log(f"error: vanilla baseline does not compile: {exc}")
        return RunResult(False, compiled=False)
    write_output(plan.out_path, stage.text, plan.force, session.secret)
    outcome.update(status="ok", sha256=sha256(stage.text), repair_rounds=stage.answers - 1)
    log(f"wrote {plan.out_path}: compiles for {plan.facts.name} after {stage.answers} answer(s)")
    result: CorrectnessResult = check_vanilla_on_gpu(stage.text, cubins[stage.text], plan.request)
    if result.correct is False:
        log(f"error: vanilla kernel compiles but is wrong: {result.summary}")
    else:
        log(f"vanilla baseline correctness: {result.summary}")
    return RunResult(True, compiled=True, correct=result.correct)
