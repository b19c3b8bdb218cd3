"""Scripted model answers built from the real specs/*.tl, read at test time (never copied)."""
from __future__ import annotations

import re
from pathlib import Path

SPECS = Path(__file__).resolve().parents[2] / "specs"


def spec_files() -> list[Path]:
    from tests.spec_files import ONE_KERNEL_SPECS
    return list(ONE_KERNEL_SPECS)   # the LLM workflow writes one-kernel programs


def spec_text(name: str = "mha_fwd.tl") -> str:
    return (SPECS / name).read_text(encoding="utf-8")


def request_for(spec: Path) -> str:
    """`mla_decode_fwd.tl` → "mla decode": what a user would type for that spec."""
    stem = re.sub(r"_(fwd|forward)$", "", spec.stem)
    return stem.replace("_", " ")


def sketch_of(program: str) -> str:
    """A stage-1 answer: no comments, no shared-memory Allocates, no numeric Params (tile sizes,
    head dims) unless a Compute uses them as a value (LANGUAGE.md §2: what a sketch leaves open)."""
    lines = [ln for ln in program.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    computes = " ".join(ln for ln in lines if re.match(r"\s*compute\b", ln, re.IGNORECASE))

    def open_param(line: str) -> bool:
        m = re.match(r"\s*param\s+(\w+)\s*=\s*\d", line, re.IGNORECASE)
        return bool(m) and not re.search(rf"\b{m.group(1)}\b", computes)

    keep = [ln for ln in lines if not open_param(ln)
            and not re.match(r"\s*allocate\s+\w+\s+in\s+shared\b", ln, re.IGNORECASE)]
    assert len(keep) < len(lines), "the spec has nothing a sketch leaves open"
    return "\n".join(keep) + "\n"


def without_reshape(program: str) -> str:
    out = [ln for ln in program.splitlines() if not re.match(r"\s*reshape\b", ln, re.IGNORECASE)]
    assert len(out) < len(program.splitlines()), "the spec has no Reshape to drop"
    return "\n".join(out) + "\n"


def wrong_transpose(program: str) -> str:
    bad, n = re.subn(r"^(\s*Compute GEMM \w+, )(\w+)\.T\b", r"\1\2", program, count=1,
                     flags=re.IGNORECASE | re.MULTILINE)
    assert n == 1, "the spec has no `X, K.T` GEMM"
    return bad


def syntax_error(program: str) -> tuple[str, int]:
    """Break the first tile shape of a Copy (drop its `)`); returns the text and the 1-based line."""
    lines = program.splitlines()
    for i, line in enumerate(lines):
        if re.match(r"\s*copy\s+\w+\s*\(", line, re.IGNORECASE):
            lines[i] = line.replace(")", "", 1)
            return "\n".join(lines) + "\n", i + 1
    raise AssertionError("the spec has no Copy with a tile shape")
