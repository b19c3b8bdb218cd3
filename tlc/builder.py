"""`tlc build`: TL file → TL passes → lowering passes (kernel IR) → CuTe → NVRTC → artifacts.

Writes `<stem>.cu`, `<stem>.cubin` and `<stem>.json` (versioned schema: launch ABI, grid
formula, shared memory, registers and spills, arch, versions). Needs no GPU. Several files
build in parallel processes; an existing artifact is replaced atomically.
"""
from __future__ import annotations

import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Mapping

from tlc.diagnostics import GLOBAL_SOURCES, TlcError
from tlc.names import kernel_name

__version__ = "0.1.0"


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def lower_to_kernel_ir(data: bytes, path: str, arch: str, defines: Mapping[str, str], *, name: str,
                       lse: bool = False):
    """TL text → TL passes → the lowering passes (tlc.lowering.passes); (state, remarks)."""
    from tlc.api import compile_graph
    from tlc.lowering.passes import run_lowering

    graph, remarks = compile_graph(data, path, defines=defines)
    state, ctx = run_lowering(graph, arch, name=name, lse=lse)
    return state, remarks + [d for d in ctx.sink.items if d.severity != "error"]


def build_one(path: str, arch: str, out_dir: str, defines: Mapping[str, str]) -> dict[str, Any]:
    """Build one file; returns the artifact metadata (also written as JSON)."""
    from tlc.backend_cute.compile import compile_kir

    src_path = Path(path)
    data = src_path.read_bytes()
    stem = src_path.stem  # the artifacts keep the user's file name; the kernel gets a C++-safe one
    state, remarks = lower_to_kernel_ir(data, path, arch, defines, name=kernel_name(path))
    compiled = compile_kir(state.kir, arch, source_name=src_path.name, cu_name=f"{stem}.cu")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = dict(compiled.metadata)
    meta.update({
        "tlc": __version__,
        "source": str(src_path),
        "defines": dict(defines),
        "launch": state.abi.to_json(),
        "schedule": list(state.schedule),
        "compile_seconds": round(compiled.compile_seconds, 2),
        "cached": compiled.cached,
        "remarks": [d.render(GLOBAL_SOURCES) for d in remarks],
    })
    _atomic_write(out / f"{stem}.cu", compiled.source.encode())
    _atomic_write(out / f"{stem}.cubin", compiled.cubin)
    _atomic_write(out / f"{stem}.json", (json.dumps(meta, indent=2) + "\n").encode())
    return meta


def _build_reporting(args: tuple[str, str, str, dict[str, str]]) -> tuple[str, str, int]:
    path, arch, out_dir, defines = args
    try:
        meta = build_one(path, arch, out_dir, defines)
    except TlcError as exc:
        return path, exc.render(GLOBAL_SOURCES, file=path), 1
    except OSError as exc:
        return path, f"{path}: error: {exc.strerror or exc}", 1
    res = meta.get("ptxas", {})
    regs = f", {res['registers']} registers" if "registers" in res else ""
    spills = f", {res.get('spill_store_bytes', 0)} B spilled" if "spill_store_bytes" in res else ""
    how = "cached" if meta["cached"] else f"in {meta['compile_seconds']} s"
    return path, (f"{path}: built {meta['program']} for {arch} {how}"
                  f"{regs}{spills} → {Path(out_dir) / Path(path).stem}.{{cu,cubin,json}}"), 0


def _run_reporting(fn, tasks: list, jobs: int) -> int:
    """Run `fn` over `tasks` in parallel processes; print each (path, message, code); OR the codes."""
    jobs = jobs or min(len(tasks), os.cpu_count() or 1)
    status = 0
    with ProcessPoolExecutor(max_workers=jobs) if jobs > 1 and len(tasks) > 1 else nullcontext() as pool:
        for _, message, code in (pool.map(fn, tasks) if pool else map(fn, tasks)):
            print(message, file=sys.stderr if code else sys.stdout, flush=True)  # as each finishes, in order
            status |= code
    return status


def _distinct(files: list[str]) -> list[str]:
    """Each input file once, in the order given: `x.tl` and `./x.tl` are one build, not a collision."""
    first: dict[str, str] = {}
    for f in files:
        first.setdefault(os.path.realpath(f), f)
    return list(first.values())


def output_collisions(files: list[str]) -> list[str]:
    """One error line per artifact stem that two inputs would both write (`a/x.tl`, `b/x.tl` → x.cu)."""
    by_stem: dict[str, list[str]] = {}
    for f in files:
        by_stem.setdefault(Path(f).stem, []).append(f)
    return [f"error: {' and '.join(paths)} would both write {stem}.{{cu,cubin,json}}; build them into "
            f"separate -o directories" for stem, paths in by_stem.items() if len(paths) > 1]


def build_files(files: list[str], *, arch: str, out_dir: str, defines: Mapping[str, str], jobs: int = 0) -> int:
    """Build every file into `out_dir`; nothing is compiled when two inputs would share artifacts.
    A compile that takes more than a few seconds announces itself (tlc.backend_cute.compile)."""
    files = _distinct(files)
    if problems := output_collisions(files):
        print("\n".join(f"tlc build: {p}" for p in problems), file=sys.stderr)
        return 1
    return _run_reporting(_build_reporting, [(f, arch, out_dir, dict(defines)) for f in files], jobs)
