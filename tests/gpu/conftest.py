"""A kernel that faults (illegal instruction or address, a launch failure) loses the process's CUDA
context: every later GPU test then fails with the same error at its first allocation, and the one
kernel at fault is hard to find among them. After such a failure the later tests of the run fail at
once, naming the test that lost the context, instead of running.

A kernel that hangs (a barrier nobody arrives at) would stall the run until something outside kills it,
with no word of which test: a test that runs longer than TLC_GPU_TEST_TIMEOUT seconds (300; 0: no limit)
ends the process with one line naming it."""
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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    from bench import watchdog

    capture = item.config.pluginmanager.getplugin("capturemanager")
    try:
        guard = watchdog(item.nodeid, "TLC_GPU_TEST_TIMEOUT", 300,
                         before=lambda: capture and capture.suspend_global_capture(in_=True))
    except SystemExit as bad:
        raise pytest.UsageError(str(bad)) from None
    with guard:
        yield
