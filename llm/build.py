"""Build an accepted `.tl` with tlc's own backend (`tlc.api.build_source`), reporting in one line."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from tlc_llm.checker import tlc_api

ARTIFACT_SUFFIXES = (".cu", ".cubin", ".json")


@dataclass(frozen=True)
class BuildOutcome:
    ok: bool
    message: str
    artifacts: dict[str, str] = field(default_factory=dict)


def existing_artifacts(out_dir: Path, stem: str) -> list[Path]:
    """Artifacts a build would replace; without --force `tlc gen` refuses to start over them."""
    return [out_dir / f"{stem}{s}" for s in ARTIFACT_SUFFIXES if (out_dir / f"{stem}{s}").exists()]


def build_tl(text: str, filename: str, arch: str, out_dir: Path, defines: dict[str, str] | None) -> BuildOutcome:
    from tlc.diagnostics import TlcError

    api = tlc_api()
    build_source = getattr(api, "build_source", None)
    if build_source is None:
        return BuildOutcome(False, "tlc.api.build_source is not available in this tlc")
    try:
        artifacts = build_source(text, filename, arch, str(out_dir), defines or None)
    except TlcError as exc:
        lines = [line for line in exc.render().splitlines() if line.strip()]
        return BuildOutcome(False, lines[0] if lines else "build failed")
    except Exception as exc:  # noqa: BLE001 - a backend bug is reported, not a traceback
        if os.environ.get("TLC_DEBUG"):
            raise
        return BuildOutcome(False, f"tlc crashed while building ({type(exc).__name__}: {exc})")
    paths = {str(k): str(v) for k, v in dict(artifacts or {}).items()}
    return BuildOutcome(True, "built " + ", ".join(sorted(Path(p).name for p in paths.values())), paths)
