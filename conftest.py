"""Repository-wide pytest setup: tests marked `gpu` skip cleanly without a CUDA device."""
from __future__ import annotations

import pytest

try:  # tiny tensors: thread start-up costs far more than the arithmetic on 2-core machines
    import torch

    torch.set_num_threads(1)
except Exception:  # pragma: no cover - torch is a hard dependency, but never fail collection
    pass


def _has_gpu() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run with -m gpu on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
