"""A kernel that faults (illegal instruction or address, a launch failure) loses the process's CUDA
context: every later GPU test then fails with the same error at its first allocation, and the one
kernel at fault is hard to find among them. After such a failure the later tests of the run fail at
once, naming the test that lost the context, instead of running."""
from __future__ import annotations

import pytest

_STICKY = ("illegal instruction", "illegal memory access", "unspecified launch failure", "misaligned address",
           "an illegal", "device-side assert")
_lost: list[str] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed and call.excinfo is not None and not _lost:
        text = str(call.excinfo.value).lower()
        if "cuda error" in text and any(s in text for s in _STICKY):
            _lost.append(f"{item.nodeid}: {str(call.excinfo.value).splitlines()[0]}")


@pytest.fixture(autouse=True)
def _cuda_context_intact() -> None:
    if _lost:
        pytest.fail(f"not run: the CUDA context was lost earlier, in {_lost[0]}", pytrace=False)
