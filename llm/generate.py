"""The paper's two-stage workflow: request → TL sketch → complete TL code, both checked by tlc."""
from __future__ import annotations

from dataclasses import dataclass

from tlc_llm.checker import Checker
from tlc_llm.prompts import PromptSet
from tlc_llm.repair import Completer, StageResult, run_stage


@dataclass(frozen=True)
class Generated:
    sketch: StageResult
    code: StageResult

    @property
    def text(self) -> str:
        return self.code.text

    @property
    def repair_rounds(self) -> int:
        return self.sketch.answers - 1 + self.code.answers - 1

    @property
    def remarks(self) -> tuple[str, ...]:
        return self.code.check.remarks


def generate_tl(client: Completer, prompts: PromptSet, checker: Checker, *, filename: str, max_rounds: int) -> Generated:
    """Stage 1 is checked as a sketch (`--sketch`), stage 2 as full TL with all passes."""
    system = prompts.system()
    sketch = run_stage(
        client, system, prompts.sketch(),
        lambda text: checker.check(text, "sketch.tl", sketch=True),
        label="sketch", filename="sketch.tl", max_rounds=max_rounds,
    )
    code = run_stage(
        client, system, prompts.parameters(sketch.text),
        lambda text: checker.check(text, filename),
        label="parameters", filename=filename, max_rounds=max_rounds,
    )
    return Generated(sketch, code)
