"""NVRTC wrapper: CuTe C++ source → cubin through `cuda.bindings.nvrtc`.

Always fetches the log; on failure maps `#line N "x.tl"` locations in it back to `.tl`
diagnostics; destroys the program in `finally`; measures compile time, and asks NVRTC (`--time`)
how it split between its phases (front end, NVVM optimizer, PTX translation; the rest is ptxas).
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field

from tlc.backend_cute.headers import include_dirs
from tlc.diagnostics import Diagnostic, Loc, Note, TlcError, error, fail

ARCHES = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a")
BASE_OPTIONS = ("-std=c++17", "-default-device", "-DNDEBUG", "--use_fast_math",
                "--ptxas-options=-v")

# `file(12): error: message` — NVRTC's (EDG's) log format.
_LOG_LINE = re.compile(r'^(?P<file>[^()\n]+)\((?P<line>\d+)\): (?P<sev>error|warning|catastrophic error)'
                       r'(?: #\w+-\w)?: (?P<msg>.*)$')
_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_PTXAS_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_STACK = re.compile(r"(\d+) bytes stack frame")


@dataclass
class NvrtcResult:
    cubin: bytes
    log: str
    seconds: float
    options: list[str]
    ptxas: dict[str, int] = field(default_factory=dict)
    phases_ms: dict[str, float] = field(default_factory=dict)  # NVRTC's --time table, plus "ptxas and rest"
    ptx_bytes: int = 0


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError:  # pragma: no cover - depends on the environment
        raise fail("NVRTC not available: install `cuda-python` and `nvidia-cuda-nvrtc`") from None
    return nvrtc


def _check(nvrtc, result, what: str) -> None:
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, text = nvrtc.nvrtcGetErrorString(result)
        raise fail(f"NVRTC {what} failed: {text.decode(errors='replace')}")


def nvrtc_version() -> str:
    try:
        nvrtc = _nvrtc()
        result, major, minor = nvrtc.nvrtcVersion()
    except (TlcError, RuntimeError, OSError) as exc:
        raise fail(f"NVRTC library could not be loaded ({exc}): install `nvidia-cuda-nvrtc`") from None
    _check(nvrtc, result, "version query")
    return f"{major}.{minor}"


def compile_options(arch: str) -> list[str]:
    if arch not in ARCHES:
        raise fail(f"unsupported arch '{arch}': expected one of {', '.join(ARCHES)}")
    return [f"-arch={arch}", *BASE_OPTIONS, *include_dirs().flags()]


def parse_ptxas_info(log: str) -> dict[str, int]:
    info: dict[str, int] = {}
    if m := _PTXAS_REGS.search(log):
        info["registers"] = int(m.group(1))
    if m := _PTXAS_SPILL.search(log):
        info["spill_store_bytes"], info["spill_load_bytes"] = int(m.group(1)), int(m.group(2))
    if m := _PTXAS_STACK.search(log):
        info["stack_frame_bytes"] = int(m.group(1))
    return info


def parse_time_table(text: str, total_seconds: float) -> dict[str, float]:
    """NVRTC's `--time` CSV (`file, phase, value, ms` rows) as {phase: ms}; what the table does not
    cover (ptxas, which NVRTC runs in process without a row of its own) is `ptxas and rest`."""
    phases: dict[str, float] = {}
    for row in text.splitlines()[1:]:
        cells = [c.strip() for c in row.split(",")]
        if len(cells) == 4 and cells[3] == "ms":
            try:
                phases[cells[1]] = phases.get(cells[1], 0.0) + float(cells[2])
            except ValueError:
                continue
    if phases:
        phases["ptxas and rest"] = max(0.0, round(total_seconds * 1000 - sum(phases.values()), 1))
    return phases


def _timed(options: list[str]) -> tuple[list[str], str | None]:
    """`options` plus `--time=<fresh temp file>` (it changes nothing in the output), or unchanged
    when the temp folder is not writable."""
    try:
        folder = tempfile.mkdtemp(prefix="tlc-nvrtc-time-")
    except OSError:
        return options, None
    path = os.path.join(folder, "time.csv")
    return options + [f"--time={path}"], path


def _read_time_table(path: str | None, seconds: float) -> dict[str, float]:
    if path is None:
        return {}
    try:
        with open(path) as f:
            return parse_time_table(f.read(), seconds)
    except OSError:
        return {}
    finally:
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def log_to_diagnostics(log: str, tl_suffix: str = ".tl") -> list[Diagnostic]:
    """Turn an NVRTC log into diagnostics; lines inside `.tl` files keep their `.tl` location."""
    diags: list[Diagnostic] = []
    for line in log.splitlines():
        m = _LOG_LINE.match(line.strip())
        if not m or m.group("sev") == "warning":
            continue
        file, lineno, msg = m.group("file"), int(m.group("line")), m.group("msg")
        if file.endswith(tl_suffix):
            diags.append(error(f"generated CuTe code failed to compile: {msg}", Loc(file, lineno, 1)))
        else:
            diags.append(error(f"generated CuTe code failed to compile: {msg}", None,
                               Note(f"in {file.rsplit('/', 1)[-1]}:{lineno}")))
    return diags


def compile_cubin(source: str, arch: str, name: str = "kernel.cu",
                  extra_options: tuple[str, ...] = ()) -> NvrtcResult:
    nvrtc = _nvrtc()
    options = compile_options(arch) + list(extra_options)
    passed, time_file = _timed(options)
    result, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    _check(nvrtc, result, "program creation")
    start = time.perf_counter()
    try:
        (status,) = nvrtc.nvrtcCompileProgram(prog, len(passed), [o.encode() for o in passed])
        seconds = time.perf_counter() - start
        phases = _read_time_table(time_file, seconds)
        result, size = nvrtc.nvrtcGetProgramLogSize(prog)
        _check(nvrtc, result, "log size query")
        buf = b" " * size
        (result,) = nvrtc.nvrtcGetProgramLog(prog, buf)
        log = buf.rstrip(b"\x00 ").decode(errors="replace")
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            diags = log_to_diagnostics(log)
            if not diags:
                first = next((ln for ln in log.splitlines() if ln.strip()), "no log")
                diags = [error(f"NVRTC failed for {arch}: {first}")]
            raise TlcError(diags[:10])
        result, size = nvrtc.nvrtcGetCUBINSize(prog)
        _check(nvrtc, result, "cubin size query")
        cubin = b" " * size
        (result,) = nvrtc.nvrtcGetCUBIN(prog, cubin)
        _check(nvrtc, result, "cubin fetch")
        result, ptx_bytes = nvrtc.nvrtcGetPTXSize(prog)
        return NvrtcResult(cubin, log, seconds, options, parse_ptxas_info(log), phases,
                           ptx_bytes if result == nvrtc.nvrtcResult.NVRTC_SUCCESS else 0)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
