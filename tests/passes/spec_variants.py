"""Programs for the pass tests: every spec under -D variations, and broken variants made
from its text the way LLMs break them (a deleted Reshape line, a dropped or superfluous
`.T`), with the line where the repair's remark must point."""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

from tlc.diagnostics import TlcError
from tlc.frontend.ast import Program
from tlc.frontend.lower import lower_program
from tlc.frontend.parser import parse_text
from tlc.ir.graph import Graph
from tlc.passes.pipeline import DEFAULT_PIPELINE
from tlc.passes.registry import lookup
from tests.spec_files import ONE_KERNEL_SPECS

ROOT = Path(__file__).resolve().parents[2]
SPECS = ONE_KERNEL_SPECS
MY_PIPELINE = ["verify", "infer-shapes", "resolve-transpose", "insert-reshape", "verify-final"]

# Variants: name → the pass that must repair it (None: nothing to repair).
VARIANTS = {"orig": None, "no_reshape": "insert-reshape", "drop_T": "resolve-transpose",
            "extra_T": "resolve-transpose", "no_reshape_drop_T": "insert-reshape"}


def available_pipeline() -> list[str]:
    """DEFAULT_PIPELINE minus passes whose module is not written yet."""
    out = []
    for name in DEFAULT_PIPELINE:
        try:
            lookup(name)
        except ImportError:
            continue
        out.append(name)
    return out


@dataclass(frozen=True)
class Variant:
    spec: str
    kind: str
    text: str
    remark_lines: tuple[int, ...]  # lines the repairs' remarks must point at


def _lines(text: str) -> list[str]:
    return text.split("\n")


def _gemm_lines(lines: list[str]) -> list[int]:
    return [i for i, ln in enumerate(lines) if re.match(r"\s*Compute GEMM\b", ln)]


def make_variant(spec: Path, kind: str) -> Variant | None:
    """The spec's text broken as `kind` says, or None where that breakage does not apply."""
    lines = _lines(spec.read_text())
    gemms = _gemm_lines(lines)
    remarks: list[int] = []
    if "drop_T" in kind:
        first = next((i for i in gemms if ".T" in lines[i]), None)
        if first is None:
            return None
        lines[first] = lines[first].replace(".T", "", 1)
        remarks.append(first)
    if kind == "extra_T":
        acc = [i for i in gemms if "accumulate" in lines[i] and ".T" not in lines[i]]
        if not acc:
            return None
        lines[acc[0]] = re.sub(r"(GEMM\s+\w+,\s*\w+)", r"\1.T", lines[acc[0]], count=1)
        remarks.append(acc[0])
    if "no_reshape" in kind:
        reshape = [i for i, ln in enumerate(lines) if ln.strip().startswith("Reshape")]
        if not reshape:
            return None
        target = next(i for i in gemms if i > reshape[0])
        lines.pop(reshape[0])
        remarks = [r - (r > reshape[0]) for r in remarks] + [target - 1]
    return Variant(spec.stem, kind, "\n".join(lines), tuple(sorted(r + 1 for r in remarks)))


@functools.lru_cache(maxsize=None)
def parsed(text: str, name: str) -> Program:
    return parse_text(text, f"{name}.tl")


def lower(text: str, name: str, defines: dict[str, str] | None = None) -> Graph:
    """A fresh graph each call (passes mutate it); parsing is cached."""
    return lower_program(parsed(text, name), defines=defines)


def spec_params(spec: Path) -> dict[str, str]:
    return dict(re.findall(r"^Param\s+(\w+)\s*=\s*(\S+)", spec.read_text(), re.M))


def small_defines(spec: Path, choice: dict[str, int | bool | str]) -> dict[str, str]:
    """-D values for tiny runs; `choice` maps BM/BN/dims/Causal/Align to picks."""
    params = spec_params(spec)
    out: dict[str, str] = {}
    for name in params:
        if name in choice:
            v = choice[name]
            out[name] = ("true" if v else "false") if isinstance(v, bool) else str(v)
    return out


def try_lower(text: str, name: str, defines: dict[str, str]) -> Graph | None:
    try:
        return lower(text, name, defines)
    except TlcError:
        return None
