"""Build an accepted `.tl` with tlc's own backend, reporting in one line.

Uses `tlc.api.build_source` (the agreed entry point) when tlc has it, else `tlc.builder.build_one`
on the written file (what `tlc build` runs); either way the same passes, emitter and NVRTC.
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tlc_llm.checker import tlc_api

ARTIFACT_SUFFIXES = (".cu", ".cubin", ".json")


@dataclass(frozen=True)
class BuildOutcome:
    ok: bool
    message: str
    artifacts: dict[str, str] = field(default_factory=dict)


TRANSLATION_SUFFIXES = (".llm.cu", ".llm.cubin")  # what `--translate llm` writes beside them


def artifact_paths(out_dir: Path, stem: str, translated: bool = False) -> list[Path]:
    """Every file a build (and an LLM translation) of `stem` writes; without --force `tlc gen`
    refuses to start over any that exists."""
    suffixes = ARTIFACT_SUFFIXES + (TRANSLATION_SUFFIXES if translated else ())
    return [out_dir / f"{stem}{suffix}" for suffix in suffixes]


def _builder(text: str, path: Path, arch: str, out_dir: Path, defines: dict[str, str]) -> Callable[[], Any] | None:
    build_source = getattr(tlc_api(), "build_source", None)
    if build_source is not None:
        return lambda: build_source(text, path.name, arch, str(out_dir), defines or None)
    try:
        build_one = importlib.import_module("tlc.builder").build_one
    except (ImportError, AttributeError):
        return None
    return lambda: build_one(str(path), arch, str(out_dir), defines)


def build_tl(text: str, path: Path, arch: str, out_dir: Path, defines: dict[str, str] | None) -> BuildOutcome:
    """`path` is the written `.tl` (its stem names the artifacts); `text` is its content."""
    from tlc.diagnostics import TlcError

    run = _builder(text, path, arch, out_dir, dict(defines or {}))
    if run is None:
        return BuildOutcome(False, "this tlc has no build entry point (tlc.api.build_source or tlc.builder.build_one)")
    try:
        run()
    except TlcError as exc:
        lines = [line for line in exc.render().splitlines() if line.strip()]
        return BuildOutcome(False, lines[0] if lines else "build failed")
    except Exception as exc:  # noqa: BLE001 - a backend bug is reported, not a traceback
        if os.environ.get("TLC_DEBUG"):
            raise
        return BuildOutcome(False, f"tlc crashed while building ({type(exc).__name__}: {exc})")
    artifacts = {s.lstrip("."): str(out_dir / f"{path.stem}{s}") for s in ARTIFACT_SUFFIXES
                 if (out_dir / f"{path.stem}{s}").is_file()}
    names = ", ".join(Path(p).name for p in artifacts.values())
    return BuildOutcome(True, f"built {names} for {arch} in {out_dir}", artifacts)
