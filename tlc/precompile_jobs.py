"""`tlc precompile`: fill the kernel cache ahead of time, compiling the missing specializations in
parallel processes (processes, not threads: NVRTC runs long C++ work that gains nothing from sharing one).

Jobs come from TL files (`tlc precompile FILE…`) or from a shape list (`--shapes FILE`) mapped to
the specializations `tlc.attention` builds (tlc.runtime.attention_spec). A shape list has one call
per line: `key=value` words and the bare word `causal`; `#` starts a comment:

    b=4 hq=32 hkv=8 sq=4096 sk=4096 d=128 causal dtype=bf16
    hq=16 d=192 dv=128 causal            # MLA prefill

`d` is required; `dv` defaults to `d`, `dtype` to bf16 (or fp16), `causal` to false (`causal=true`
works too), `hkv` to `hq`, `sk` to `sq`. `b`, `hq`, `hkv` are checked as tlc.attention checks them but
do not choose the kernel; dtype, d, dv, causal and the key length do (`sk`: short sequences take a
persistent kernel on Hopper, tlc.tuning.short_keys; a line without `sk` or `sq` gets the long-sequence one). A file whose first character is `[` is JSON: a
list of objects with the same keys (`"causal": true`).

A target means what it means to `tlc build`: sm_90 is the sm_80-family kernel compiled for Hopper, sm_90a
the wgmma/TMA kernel, built as `tlc.attention` builds it (the sm_90 kernel where the sm_90a lowering refuses
a shape). Without a target, `tlc.precompile` builds what `tlc.attention` picks on the visible GPU (on an
H100/H200 sm_90a, or TLC_ATTENTION_ARCH), or on an H100 when none is visible.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from tlc.diagnostics import GLOBAL_SOURCES, Loc, TlcError, escape_controls, fail
from tlc.numbers import INT32_MAX, a_kind, check_int, parse_int, problem, shown


@dataclass(frozen=True)
class Job:
    """One specialization: a `.tl` path (or TL text), its -D bindings and the target."""

    spec: str
    defines: tuple[tuple[str, str], ...]
    arch: str
    label: str = ""
    fallback: "Job | None" = None  # built instead when this target's lowering refuses (tlc.attention's rule)

    @staticmethod
    def make(spec: str | Path, defines: Mapping[str, Any], arch: str, label: str = "",
             fallback: "Job | None" = None) -> "Job":
        from tlc.runtime import normal_defines

        return Job(str(spec), tuple(sorted(normal_defines(defines).items())), arch, label or Path(str(spec)).name,
                   fallback)

    def describe(self) -> str:
        return " ".join([self.label, *(f"{k}={v}" for k, v in self.defines)]) + f" [{self.arch}]"


@dataclass
class JobResult:
    job: Job
    ok: bool
    cached: bool = False
    seconds: float = 0.0
    message: str = ""
    ptxas: dict = field(default_factory=dict)


# ---------------------------------------------------------------------- shape lists
_INT_KEYS = ("b", "hq", "hkv", "sq", "sk", "d", "dv")
_KEYS = (*_INT_KEYS, "dtype", "causal")


def _shape_error(path: str, line: int, col: int, message: str) -> TlcError:
    return fail(f"{message}; a line reads like `b=4 hq=32 hkv=8 sq=4096 sk=4096 d=128 causal dtype=bf16`",
                Loc(path, line, col))


def _parse_word(word: str, path: str, line: int, col: int, shape: dict[str, Any]) -> None:
    key, eq, value = word.partition("=")
    if not eq:
        value = "true" if key == "causal" else ""
        if key != "causal":
            raise _shape_error(path, line, col, f"'{shown(word)}' is not key=value")
    if key not in _KEYS:
        raise _shape_error(path, line, col, f"unknown key '{shown(key)}' (keys: {', '.join(_KEYS)})")
    if key in shape:
        raise _shape_error(path, line, col, f"'{key}' given twice")
    if key in _INT_KEYS:
        if not (value.isascii() and value.isdigit()):
            raise _shape_error(path, line, col, f"{key} must be a non-negative integer, got '{shown(value)}'")
        try:
            shape[key] = parse_int(value, key, minimum=0, maximum=INT32_MAX)
        except TlcError as exc:
            raise _shape_error(path, line, col, problem(exc)) from None
    elif key == "causal":
        if value.lower() not in ("true", "false", "1", "0"):
            raise _shape_error(path, line, col, f"causal must be true or false, got '{shown(value)}'")
        shape[key] = value.lower() in ("true", "1")
    else:
        shape[key] = value


def parse_shapes(text: str, path: str = "<shapes>") -> list[tuple[int, dict[str, Any]]]:
    """(line number, shape) for each call in a shape list (text or JSON); TlcError with the line."""
    GLOBAL_SOURCES.add(path, text)
    if text.lstrip().startswith("["):
        return _parse_json_shapes(text, path)
    shapes = []
    for number, raw in enumerate(text.splitlines(), 1):
        body = raw.split("#", 1)[0]
        shape: dict[str, Any] = {}
        col = 1
        for word in body.split():
            col = body.index(word, col - 1) + 1
            _parse_word(word, path, number, col, shape)
            col += len(word)
        if shape:
            shapes.append((number, shape))
    return shapes


def _parse_json_shapes(text: str, path: str) -> list[tuple[int, dict[str, Any]]]:
    try:
        # Integers stay text until checked (tlc.numbers): Python refuses to read one of thousands of digits.
        items = json.loads(text, parse_int=lambda digits: digits if len(digits) > 20 else int(digits))
    except json.JSONDecodeError as exc:
        raise fail(f"not valid JSON: {exc.msg}", Loc(path, exc.lineno, exc.colno)) from None
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise fail("a JSON shape list is a list of objects such as {\"d\": 128, \"causal\": true}", Loc(path, 1, 1))
    return [(0, _shape_of(item, f"item {n}", path)) for n, item in enumerate(items, 1)]  # errors name the file only


def _shape_of(item: Mapping[str, Any], what: str, path: str) -> dict[str, Any]:
    """One call given as a mapping (a JSON object, a tlc.precompile dict), checked as a shape line is."""
    shape: dict[str, Any] = {}
    for key, value in item.items():
        if not isinstance(key, str):
            raise fail(f"{what}: a key is {a_kind(key)}; keys are strings such as 'd' or 'causal'",
                       Loc(path, 0, 0))
        if isinstance(value, int) and not isinstance(value, bool):
            try:
                check_int(value, f"{what}: {shown(key)}", minimum=-INT32_MAX, maximum=INT32_MAX)
            except TlcError as exc:  # before str(): Python refuses to print an int of thousands of digits
                raise fail(problem(exc), Loc(path, 0, 0)) from None
        value = str(value).lower() if isinstance(value, bool) else value
        try:
            _parse_word(f"{key}={value}", path, 0, 0, shape)
        except TlcError as exc:
            raise fail(f"{what}: {exc.diagnostics[0].message}", Loc(path, 0, 0)) from None
    return shape


def attention_jobs(shapes: Iterable[tuple[int, dict[str, Any]]], archs: list[str], path: str = "<shapes>") -> list[Job]:
    """The specializations `tlc.attention` builds for these calls on each target of `archs`, checked as it
    checks them. A target is taken as `tlc build --arch` takes it: sm_90 builds the sm_80-family kernel,
    sm_90a the Hopper one with the sm_90 kernel as its fallback (`default_targets` maps a GPU to targets)."""
    from tlc.runtime import _check_heads, attention_fallback, attention_spec, head_dim_problem

    jobs = []
    for line, shape in shapes:
        where = Loc(path, line, 1)
        if "d" not in shape:
            raise fail("the head dim d=… is required", where)
        d, dv, dtype = shape["d"], shape.get("dv", shape["d"]), shape.get("dtype", "bf16")
        if dtype not in ("bf16", "fp16"):
            raise fail(f"dtype must be bf16 or fp16, got '{dtype}'", where)
        problem = head_dim_problem(d, dv)
        hq = shape.get("hq", 1)
        try:
            _check_heads(hq, shape.get("hkv", hq), shape.get("hkv", hq), enable_gqa=True)
        except TlcError as exc:
            problem = problem or exc.diagnostics[0].message
        if problem:
            raise fail(problem, where)
        causal, seq_k = bool(shape.get("causal", False)), shape.get("sk", shape.get("sq"))
        for target in archs:
            fallback = attention_fallback(target)
            backup = Job.make(*attention_spec(dtype, d, dv, causal, fallback, seq_k), fallback) if fallback else None
            jobs.append(Job.make(*attention_spec(dtype, d, dv, causal, target, seq_k), target, fallback=backup))
    return jobs


def read_shape_file(path: str, archs: list[str]) -> list[Job]:
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise fail(f"cannot read '{path}': {getattr(exc, 'strerror', None) or exc}") from None
    return attention_jobs(parse_shapes(text, path), archs, path)


# ---------------------------------------------------------------------- compiling
def _compile(job: Job) -> JobResult:
    """In a worker: build through tlc.runtime.compile_spec, the path `tlc.build` takes."""
    from tlc.runtime import compile_spec

    start = time.perf_counter()
    try:
        compiled, _ = compile_spec(job.spec if "\n" in job.spec else Path(job.spec), arch=job.arch,
                                   defines=dict(job.defines))
    except TlcError as exc:
        if job.fallback is not None:  # tlc.attention builds the fallback then: so does precompile
            result = _compile(job.fallback)
            result.message = result.message or f"{job.arch} refused ({exc.diagnostics[0].message}): built {job.fallback.arch}"
            return result
        return JobResult(job, False, seconds=time.perf_counter() - start, message=exc.render(GLOBAL_SOURCES, file=_where(job)))
    except OSError as exc:
        return JobResult(job, False, seconds=time.perf_counter() - start,
                         message=f"{_where(job)}: error: {exc.strerror or exc}")
    return JobResult(job, True, compiled.cached, time.perf_counter() - start,
                     ptxas=dict(compiled.metadata.get("ptxas", {})))


def _where(job: Job) -> str:
    return job.label if "\n" in job.spec else job.spec


def _quiet_worker() -> None:
    os.environ["TLC_QUIET"] = "1"  # the parent prints one line per job


def is_cached(job: Job) -> bool:
    """Whether a warm start would find this job's kernel: see `cached_job`."""
    return cached_job(job) is not None


def cached_job(job: Job) -> Job | None:
    """The job whose kernel a warm start would find (the build index and its cubin): `job`, or its
    fallback where `job`'s target refuses the program (checked by lowering only, no NVRTC)."""
    if _cached(job):
        return job
    if job.fallback is not None and _cached(job.fallback) and _refused(job):
        return job.fallback
    return None


def _cached(job: Job) -> bool:
    from tlc.backend_cute import cache
    from tlc.runtime import _build_inputs_key, _read

    data, name = _read(job.spec if "\n" in job.spec else Path(job.spec))
    record = cache.lookup_build(_build_inputs_key(data, name, dict(job.defines), job.arch, False))
    return record is not None and cache.lookup(record["cubin_key"]) is not None


def _refused(job: Job) -> bool:
    from tlc.builder import lower_to_kernel_ir
    from tlc.names import kernel_name
    from tlc.runtime import _read

    data, name = _read(job.spec if "\n" in job.spec else Path(job.spec))
    try:
        lower_to_kernel_ir(data, name, job.arch, dict(job.defines), name=kernel_name(name))
    except TlcError:
        return True
    return False


def compile_jobs(jobs: Iterable[Job], workers: int = 0, on_result=None) -> list[JobResult]:
    """Compile every job not cached yet, `workers` at a time (default: CPU count) in spawned processes;
    `on_result(result)` runs in the caller as each finishes. Duplicates are compiled once."""
    unique = list(dict.fromkeys(jobs))
    results: list[JobResult] = []

    def done(result: JobResult) -> None:
        results.append(result)
        if on_result is not None:
            on_result(result)

    missing = []
    for job in unique:
        try:
            hit = cached_job(job)
        except TlcError:
            hit = None  # the worker reports why
        if hit is not None:
            done(JobResult(hit, True, cached=True, message="" if hit is job else f"{job.arch} refuses it"))
        else:
            missing.append(job)
    workers = max(1, min(workers or os.cpu_count() or 1, len(missing)))
    if workers == 1:
        for job in missing:
            done(_compile(job))
        return results
    context = multiprocessing.get_context("spawn")  # the caller may have CUDA or threads: never fork them
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_quiet_worker) as pool:
        for future in as_completed([pool.submit(_compile, job) for job in missing]):
            done(future.result())
    return results


def precompile_calls(calls: Iterable[Mapping[str, Any]], *, arch: str | list[str] | None = None,
                     jobs: int = 0) -> list[JobResult]:
    """`tlc.precompile`: shape dicts → the jobs `tlc.attention` needs → compiled where missing."""
    if isinstance(calls, Mapping):
        raise fail("tlc.precompile takes a list of calls, e.g. [{'d': 128, 'causal': True}], not one dict")
    if isinstance(calls, (str, bytes)) or not isinstance(calls, Iterable):
        raise fail(f"tlc.precompile: calls must be a list of dicts such as [{{'d': 128, 'causal': True}}], not "
                   f"{a_kind(calls)}")
    jobs = check_int(jobs, "tlc.precompile: jobs", maximum=1024)
    archs = _targets(arch) or default_targets()
    shapes = []
    for n, call in enumerate(calls, 1):
        if not isinstance(call, Mapping):
            raise fail(f"tlc.precompile: call {n} is a {type(call).__name__}; each call is a dict such as "
                       "{'d': 128, 'causal': True}")
        shapes.append((0, _shape_of(call, f"tlc.precompile: call {n}", "<tlc.precompile>")))
    results = compile_jobs(attention_jobs(shapes, archs, "<tlc.precompile>"), jobs)
    failed = [r for r in results if not r.ok]
    if failed:
        raise fail(f"tlc.precompile: {len(failed)} kernel(s) failed to compile; first: {failed[0].message}")
    return results


def default_targets() -> list[str]:
    """What `tlc.attention` builds for on the visible GPU (tlc.runtime.attention_target_for: sm_90a on an
    H100/H200 unless TLC_ATTENTION_ARCH says sm_90), or on an H100 when no GPU is visible."""
    from tlc.runtime import attention_target_for, device_arch

    try:
        gpu = device_arch()
    except TlcError:
        gpu = "sm_90"
    return [attention_target_for(gpu)]


def _targets(arch: Any) -> list[str]:
    """`tlc.precompile`'s arch: None, a target name or a list of them, each checked (tlc.builder.check_target)."""
    from tlc.builder import check_target

    if arch is None:
        return []
    if isinstance(arch, str):
        return [check_target(arch, "tlc.precompile: arch")]
    if not isinstance(arch, (list, tuple)):
        raise fail(f"tlc.precompile: arch must be a target name such as 'sm_90a' or a list of them, not "
                   f"{a_kind(arch)}")
    return [check_target(a, "tlc.precompile: arch") for a in arch]


def report_line(result: JobResult) -> str:
    what = result.job.describe()
    if not result.ok:
        return f"{what}: failed\n{result.message}"
    if result.cached:
        return f"{what}: already cached" + (f"; {result.message}" if result.message else "")
    regs = result.ptxas.get("registers")
    line = f"{what}: compiled in {result.seconds:.1f} s" + (f" ({regs} registers)" if regs is not None else "")
    return line + (f"; {result.message}" if result.message else "")


def precompile(jobs: list[Job], workers: int = 0) -> int:
    """`tlc precompile`'s body: one line per job on stdout (failures on stderr); exit status."""
    unique = list(dict.fromkeys(jobs))
    print(f"tlc: precompiling {len(unique)} kernel(s); NVRTC runs only for those not cached "
          f"(cache: {_cache_dir()})", file=sys.stderr, flush=True)
    start = time.perf_counter()
    results = compile_jobs(unique, workers, on_result=lambda r: print(
        escape_controls(report_line(r)), file=sys.stdout if r.ok else sys.stderr, flush=True))
    built = sum(r.ok and not r.cached for r in results)
    failed = sum(not r.ok for r in results)
    print(f"tlc: {built} compiled, {len(results) - built - failed} already cached, {failed} failed "
          f"in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    return 1 if failed else 0


def _cache_dir() -> Path:
    from tlc.backend_cute.cache import cache_dir

    return cache_dir()


__all__ = ["Job", "JobResult", "attention_jobs", "compile_jobs", "default_targets", "parse_shapes", "precompile",
           "precompile_calls", "read_shape_file"]
