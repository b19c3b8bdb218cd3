"""`--translate llm`: the LLM writes the CuTe for an accepted `.tl` (the paper's translation step).

Its source goes through tlc's NVRTC path against tlc's launch ABI (the build's `.json` and
the parameter struct of tlc's own emitted source), with NVRTC logs fed back for the same
bounded rounds. It is accepted only if it compiles and, where a GPU is present, passes the
correctness check in a child process; otherwise tlc says why and keeps its own emitter's kernel.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from tlc_llm.build import TRANSLATION_SUFFIXES
from tlc_llm.checker import Check, ToolchainError
from tlc_llm.client import ProviderError
from tlc_llm.gpucheck import check_tl_on_gpu
from tlc_llm.nvrtc import compile_cuda
from tlc_llm.output import OutputError, write_output
from tlc_llm.prompts import PromptSet
from tlc_llm.repair import StageFailed, run_stage
from tlc_llm.run_tl import RunPlan
from tlc_llm.session import Session
from tlc_llm.transcript import ReplayDivergence
from tlc_llm.vanilla import cpp_dialect


@dataclass(frozen=True)
class Translation:
    accepted: bool
    message: str


def _artifact(artifacts: dict[str, str], suffix: str) -> Path | None:
    for path in artifacts.values():
        if str(path).endswith(suffix) and Path(path).is_file():
            return Path(path)
    return None


@dataclass(frozen=True)
class LaunchAbi:
    kernel: str  # the extern "C" symbol tlc's launcher looks up
    text: str  # what the prompt shows


def _struct_source(source_path: Path | None, name: str) -> str | None:
    if source_path is None:
        return None
    found = re.search(rf"^struct\s+{re.escape(name)}\s*\{{.*?^\}};", source_path.read_text(encoding="utf-8"),
                      re.MULTILINE | re.DOTALL)
    return found.group(0) if found else None


def launch_abi(artifacts: dict[str, str]) -> LaunchAbi | None:
    """Kernel symbol, block/grid/shared memory and the parameter struct, from tlc build's outputs.

    Reads the build record's `kernels` entry (what tlc's launcher uses) and the struct of that
    name from tlc's own emitted source, so the translation binds exactly like tlc's kernel.
    """
    meta_path = _artifact(artifacts, ".json")
    if meta_path is None:
        return None
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    kernels = meta.get("kernels") or []
    if len(kernels) != 1 or not kernels[0].get("name") or not kernels[0].get("params"):
        return None
    kernel = kernels[0]
    struct_name = str(kernel["params"])
    struct = _struct_source(_artifact(artifacts, ".cu"), struct_name)
    grid = ", ".join(str(g) for g in kernel.get("grid", []))
    lines = [
        f'- kernel: `extern "C" __global__ void {kernel["name"]}(const {struct_name} p)` (this exact name)',
        f"- grid: ({grid}); block: ({kernel.get('threads', 0)}, 1, 1); "
        f"dynamic shared memory: {kernel.get('smem_bytes', 0)} bytes",
        f"- specialization: {json.dumps(meta.get('defines', {}), sort_keys=True)}",
    ]
    tensors = (meta.get("launch") or {}).get("tensors", [])
    if tensors:
        lines.append("- tensors (`X_ptr` + `X_batch_stride`/`X_head_stride`/`X_row_stride` in elements, "
                     "columns contiguous): " + "; ".join(
                         f"{t['name']} {t['dtype']} ({t['rows']}, {t['cols']}) at head {t['head']}"
                         + (" (output)" if t.get("output") else "") for t in tensors))
    if struct:
        lines += ["- the parameter struct, passed by value (define it identically, same field order):",
                  "```cpp", struct, "```"]
    else:
        fields = ", ".join(f"{f['name']}: {f['type']}"
                           for f in (meta.get("abi") or {}).get(struct_name, {}).get("fields", []))
        lines.append(f"- parameter struct `{struct_name}` fields, in order: {fields}")
    return LaunchAbi(str(kernel["name"]), "\n".join(lines))


def _cutlass_version() -> str:
    try:
        return metadata.version("nvidia-cutlass")
    except metadata.PackageNotFoundError:
        return "4.2"


def translate_with_llm(session: Session, plan: RunPlan, prompts: PromptSet, tl_text: str,
                       artifacts: dict[str, str]) -> Translation:
    abi = launch_abi(artifacts)
    if abi is None:
        return Translation(False, "LLM translation skipped: tlc build gave no launch ABI (.json); using tlc's emitter")
    cubins: dict[str, bytes] = {}
    name = f"{Path(plan.filename).stem}.llm.cu"  # NVRTC's messages name it: stable under replay

    def check(source: str) -> Check:
        if not re.search(rf'extern\s+"C"[^;{{]*\b{re.escape(abi.kernel)}\s*\(', source):
            return Check(False, 1, f'error: the source must define extern "C" __global__ void {abi.kernel}(...) '
                                   "with the parameter struct given in the launch ABI")
        compiled = compile_cuda(source, plan.facts.name, name)
        if compiled.unavailable:
            raise ToolchainError(f"cannot compile the LLM translation: {compiled.log.splitlines()[0]}")
        if compiled.ok:
            cubins[source] = compiled.cubin
        return Check(compiled.ok, 0 if compiled.ok else 1, compiled.log)

    try:
        stage = run_stage(
            session.client, prompts.system("cuda"), prompts.translate(tl_text, abi.text, _cutlass_version()), check,
            label="translate", filename=name, max_rounds=plan.settings.max_rounds, dialect=cpp_dialect(),
        )
    except StageFailed as exc:
        return Translation(False, f"LLM translation rejected ({exc}); using tlc's emitter")
    except ReplayDivergence:
        raise  # a replay that asks something new is an error of the replay, not of the translation
    except ProviderError as exc:
        return Translation(False, f"LLM translation failed ({exc}); using tlc's emitter")
    out_dir = plan.build_dir or plan.out_path.parent
    written = out_dir / f"{plan.out_path.stem}{TRANSLATION_SUFFIXES[0]}"
    try:
        write_output(written, stage.text, plan.force, session.secret)
        write_output(out_dir / f"{plan.out_path.stem}{TRANSLATION_SUFFIXES[1]}", cubins[stage.text], plan.force)
    except OutputError as exc:
        return Translation(False, f"LLM translation not written ({exc}); using tlc's emitter")
    result = check_tl_on_gpu(plan.out_path, cubins[stage.text], plan.facts.name, plan.settings.defines, plan.request)
    if result.correct is False:
        return Translation(False, f"LLM translation compiles ({written}) but is wrong: {result.summary}; "
                                  "using tlc's emitter")
    checked = "correct on the GPU" if result.correct else "no GPU here to check correctness"
    return Translation(True, f"LLM translation accepted: compiles for {plan.facts.name} ({checked}); "
                             f"wrote {written}")
