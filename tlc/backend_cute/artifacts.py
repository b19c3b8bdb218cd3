"""`tlc build` outputs: `<stem>.cu`, `<stem>.cubin`, `<stem>.json` (versioned schema), written atomically."""
from __future__ import annotations

import json
from pathlib import Path

from tlc.backend_cute.cache import atomic_write
from tlc.backend_cute.compile import CompiledKernel


def artifact_json(compiled: CompiledKernel, extra: dict | None = None) -> dict:
    meta = dict(compiled.metadata)
    meta["compile_seconds"] = round(compiled.compile_seconds, 3)
    meta["from_cache"] = compiled.cached
    ptxas = meta.get("ptxas", {})
    meta["resources"] = {
        "registers": ptxas.get("registers"), "spill_store_bytes": ptxas.get("spill_store_bytes"),
        "spill_load_bytes": ptxas.get("spill_load_bytes"), "stack_frame_bytes": ptxas.get("stack_frame_bytes"),
        "source": "ptxas -v via NVRTC"}
    if extra:
        meta.update(extra)
    return meta


def write_artifacts(compiled: CompiledKernel, out_dir: str | Path, stem: str, extra: dict | None = None) -> list[Path]:
    out = Path(out_dir)
    paths = [out / f"{stem}.cu", out / f"{stem}.cubin", out / f"{stem}.json"]
    atomic_write(paths[0], compiled.source.encode())
    atomic_write(paths[1], compiled.cubin)
    atomic_write(paths[2], (json.dumps(artifact_json(compiled, extra), indent=2, sort_keys=True) + "\n").encode())
    return paths
