"""Header discovery for NVRTC: CuTe/CUTLASS, CUDA runtime and CCCL include folders.

Looks in the pip wheels first (nvidia-cutlass, nvidia-cuda-runtime, nvidia-cuda-cccl), then
in `CUDA_HOME`; raises a one-line `TlcError` naming the package to install when one is missing.
"""
from __future__ import annotations

import functools
import importlib.metadata as md
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from tlc.diagnostics import fail


@dataclass(frozen=True)
class IncludeDirs:
    cutlass: Path
    cuda: Path
    cccl: Path

    def flags(self) -> list[str]:
        # CCCL goes before the CUDA include so the pinned libcu++ wins over any older copy.
        flags = [f"-I{self.cutlass}", f"-I{self.cccl}"]
        if self.cccl.name == "cccl":  # CUTLASS on CUDA 13 also spells `#include <cccl/cuda/std/...>`
            flags.append(f"-I{self.cccl.parent}")
        return flags + [f"-I{self.cuda}"]


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None:
        return None
    if spec.origin and spec.origin != "namespace":
        return Path(spec.origin).parent
    locations = list(spec.submodule_search_locations or [])
    return Path(locations[0]) if locations else None


def _cutlass_include() -> Path | None:
    env = os.environ.get("CUTLASS_PATH")
    if env and (Path(env) / "include" / "cute" / "tensor.hpp").is_file():
        return Path(env) / "include"
    pkg = _package_dir("cutlass_library")
    if pkg is not None and (pkg / "source" / "include" / "cute" / "tensor.hpp").is_file():
        return pkg / "source" / "include"
    return None


def _cuda_include() -> Path | None:
    nvidia = _package_dir("nvidia")
    candidates = []
    if nvidia is not None:
        candidates += [nvidia / "cu13" / "include", nvidia / "cuda_runtime" / "include"]
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home:
        candidates.append(Path(home) / "include")
    candidates.append(Path("/usr/local/cuda/include"))
    for cand in candidates:
        if (cand / "cuda_bf16.h").is_file():
            return cand
    return None


def _cccl_include(cuda: Path) -> Path | None:
    candidates = []
    if env := os.environ.get("CCCL_PATH"):
        candidates.append(Path(env))
    candidates += [cuda / "cccl", cuda]
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    candidates += [Path(home) / "include" / "cccl", Path(home) / "include",
                   Path(home) / "targets" / "x86_64-linux" / "include" / "cccl",
                   Path(home) / "targets" / "x86_64-linux" / "include"]
    for cand in candidates:
        if (cand / "cuda" / "std" / "cstdint").is_file():
            return cand
    return None


@functools.lru_cache(maxsize=1)
def include_dirs() -> IncludeDirs:
    cutlass = _cutlass_include()
    if cutlass is None:
        raise fail("CuTe headers not found: install `nvidia-cutlass==4.2.0.0` or set CUTLASS_PATH "
                   "to a CUTLASS checkout")
    cuda = _cuda_include()
    if cuda is None:
        raise fail("CUDA headers (cuda_bf16.h) not found: install `nvidia-cuda-runtime` or set CUDA_HOME")
    cccl = _cccl_include(cuda)
    if cccl is None:
        raise fail("CCCL headers (cuda/std) not found: install `nvidia-cuda-cccl<13.2` or set CUDA_HOME")
    return IncludeDirs(cutlass, cuda, cccl)


def versions() -> dict[str, str]:
    """Versions of the header packages, for cache keys and the `.json` artifact."""
    out = {}
    for dist in ("nvidia-cutlass", "nvidia-cuda-cccl", "nvidia-cuda-runtime", "nvidia-cuda-nvrtc", "cuda-python"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = "absent"
    return out
