"""`tlc precompile` and `tlc.precompile`: fill the kernel cache ahead of time, compiling the missing
specializations in parallel processes (processes, not threads: NVRTC runs long C++ work that gains nothing
from sharing one).

Jobs come from TL files (`tlc precompile FILE…`) or from a shape list (`--shapes FILE`, tlc.attention.shapes
says its format) mapped to the specializations `tlc.attention` builds (tlc.attention.kernels.attention_spec).

A target means what it means to `tlc build`: sm_90 is the sm_80-family kernel compiled for Hopper, sm_90a
the wgmma/TMA kernel, built as `tlc.attention` builds it (the sm_90 kernel where the sm_90a lowering refuses
a shape). Without a target, `tlc.precompile` builds what `tlc.attention` picks on the visible GPU (on an
H100/H200 sm_90a, or TLC_ATTENTION_ARCH), or on an H100 when none is visible.
"""
from __future__ import annotations

import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from tlc.attention.shapes import parse_shapes, shape_of
from tlc.diagnostics import GLOBAL_SOURCES, Loc, TlcError, escape_controls, fail
from tlc.numbers import a_kind, check_int


@dataclass(frozen=True)
class Job:
    """One specialization: a `.tl` path (or TL text), its -D bindings and the target."""

    spec: str
    defines: tuple[tuple[str, str], ...]
    arch: str
    label: str = ""
    fallback: "Job | None" = None  # built instead when this target's lowering refuses (tlc.attention's rule)
    kernel: str | None = None      # which kernel of a program of several (`Kernel NAME` lines)

    @staticmethod
    def make(spec: str | Path, defines: Mapping[str, Any], arch: str, label: str = "",
             fallback: "Job | None" = None) -> "Job":
        from tlc.runtime import normal_defines

        return Job(str(spec), tuple(sorted(normal_defines(defines).items())), arch, label or Path(str(spec)).name,
                   fallback)

    def describe(self) -> str:
        label = self.label + (f" ({self.kernel})" if self.kernel else "")
        return " ".join([label, *(f"{k}={v}" for k, v in self.defines)]) + f" [{self.arch}]"

    def per_kernel(self) -> list["Job"]:
        """This job, or one per kernel of a program of several: each is built (and cached) as tlc.build builds it."""
        from dataclasses import replace

        from tlc.api import kernel_names
        try:
            data = self.spec.encode() if "\n" in self.spec else Path(self.spec).read_bytes()
            names = kernel_names(data, self.label or self.spec)
        except (OSError, TlcError):
            return [self]   # its build says what is wrong
        return [replace(self, kernel=k) for k in names] or [self]


@dataclass
class JobResult:
    job: Job
    ok: bool
    cached: bool = False
    seconds: float = 0.0
    message: str = ""
    ptxas: dict = field(default_factory=dict)


def attention_jobs(shapes: Iterable[tuple[int, dict[str, Any]]], archs: list[str], path: str = "<shapes>") -> list[Job]:
    """The specializations `tlc.attention` builds for these calls on each target of `archs`, checked as it
    checks them. A target is taken as `tlc build --arch` takes it: sm_90 builds the sm_80-family kernel,
    sm_90a the Hopper one with the sm_90 kernel as its fallback (`default_targets` maps a GPU to targets)."""
    from tlc.attention.kernels import attention_fallback, attention_spec
    from tlc.attention.sdpa import check_heads, head_dim_problem

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
            check_heads(hq, shape.get("hkv", hq), shape.get("hkv", hq), enable_gqa=True)
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
                                   defines=dict(job.defines), **({"kernel": job.kernel} if job.kernel else {}))
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
    from tlc.builder import read_program
    from tlc.runtime import build_inputs_key

    data, name = read_program(job.spec if "\n" in job.spec else Path(job.spec))
    record = cache.lookup_build(build_inputs_key(data, name, dict(job.defines), job.arch, False))
    return record is not None and cache.lookup(record["cubin_key"]) is not None


def _refused(job: Job) -> bool:
    from tlc.builder import lower_to_kernel_ir, read_program
    from tlc.names import kernel_name

    data, name = read_program(job.spec if "\n" in job.spec else Path(job.spec))
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
        shapes.append((0, shape_of(call, f"tlc.precompile: call {n}", "<tlc.precompile>")))
    results = compile_jobs(attention_jobs(shapes, archs, "<tlc.precompile>"), jobs)
    failed = [r for r in results if not r.ok]
    if failed:
        raise fail(f"tlc.precompile: {len(failed)} kernel(s) failed to compile; first: {failed[0].message}")
    return results


def default_targets() -> list[str]:
    """What `tlc.attention` builds for on the visible GPU (tlc.attention.kernels.attention_target_for: sm_90a on an
    H100/H200 unless TLC_ATTENTION_ARCH says sm_90), or on an H100 when no GPU is visible."""
    from tlc import runtime
    from tlc.attention.kernels import attention_target_for

    try:
        gpu = runtime.device_arch()
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


__all__ = ["Job", "JobResult", "attention_jobs", "compile_jobs", "default_targets", "precompile",
           "precompile_calls", "read_shape_file"]
