"""Benchmarks and GPU probes (not tests): each prints a table last and writes JSON under $OUT."""
from __future__ import annotations

import sys


def require_cuda(script: str) -> None:
    """Exit with one line, not a traceback, where no CUDA GPU is visible."""
    import torch

    if not torch.cuda.is_available():
        sys.exit(f"{script}: needs a CUDA GPU (torch sees none); run it on the GPU machine (bench/README.md)")
