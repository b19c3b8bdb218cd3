"""Fill the tlc kernel cache in parallel (NVRTC only, no GPU needed) before a GPU run: every kernel
the GPU tests build, and/or every kernel bench_attention.py times, each built from its shipped
`.tl` spec through `tlc.build` exactly as the tests and the benchmark build it.

    python3 bench/precompile.py --jobs 16 [--set tests|bench|bar|short|hopper|all] [--arch sm_90|sm_90a]
                                [--rows REGEX] [--variant "NAME=VALUE;NAME=VALUE" ...]

`--set bar` is what `bench_attention.py --bar --arch ARCH` times (its BAR_ROWS with the target's tiles),
`--set short` what `--short --arch ARCH` times (SHORT_ROWS);
`--set hopper` every sm_90a kernel of the GPU tests and of `--bar --arch sm_90a` (a Hopper-only change).
`--rows` keeps the bar rows whose name matches; each `--variant` builds every job once more with those
-D bindings added (what `TLC_BENCH_DEFINES` or `-D` will ask for in the same GPU call, e.g. `Trace=true`).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


Job = tuple  # (spec path or TL text, -D bindings[, a label for TL text[, a target that overrides --arch]])


def gpu_test_builds() -> list[Job]:
    """(spec path or TL text, -D bindings) for everything under tests/gpu that builds a kernel."""
    from tests.gpu import (test_api_gpu, test_attention_gpu, test_kvcache_gpu, test_sm90a_specs_gpu, test_tl_specs_gpu,
                           test_tlc_test_gpu, test_varlen_gpu)

    out: list[Job] = []
    for module in (test_attention_gpu, test_api_gpu, test_tlc_test_gpu, test_kvcache_gpu, test_varlen_gpu):
        out += module.builds()
    for case in test_tl_specs_gpu.CASES:
        data, name, defines = test_tl_specs_gpu.source(case)
        # built as TL text there (the variants have no file): the same text here, the same cache entry
        out.append((data.decode(), dict(defines), f"{case} ({Path(name).name})"))
    for case in test_sm90a_specs_gpu.CASES:  # built from TL text for sm_90a there
        data, name, defines = test_sm90a_specs_gpu.source(case)
        out.append((data.decode(), dict(defines), f"{case} ({Path(name).name})", test_sm90a_specs_gpu.ARCH))
    return out


def hopper_attention_builds() -> list[Job]:
    """What `tlc.attention` builds on an H100/H200 (sm_90a, tlc.attention.kernels.attention_target) for the head
    dims the GPU API tests call, for long and short key sequences (tlc.attention.tuning.short_keys); a refused head
    dim builds its sm_90 fallback, listed by gpu_test_builds."""
    from tlc.attention.kernels import attention_spec

    out: list[Job] = []
    widths = {"bf16": ((40, 40), (64, 64), (80, 80), (96, 96), (112, 112), (128, 128), (160, 160), (192, 128),
                       (224, 224), (256, 256)),
              "fp16": ((64, 64), (128, 128))}
    for dtype, dims in widths.items():
        for d, dv in dims:
            for causal in (False, True):
                for seq_k in (None, 1):
                    spec, defines = attention_spec(dtype, d, dv, causal, "sm_90a", seq_k)
                    out.append((spec, defines, spec.name, "sm_90a"))
    return out


def bench_builds(arch: str = "sm_90") -> list[Job]:
    """The rows of bench_attention.py (--extra) with `arch`'s default tiles and with every swept variant."""
    from bench.bench_attention import EXTRA_ROWS, ROWS, SWEEP, WIDE_SWEEP, row_build, row_tiles

    out: list[Job] = []
    for rows, sweep in ((ROWS, SWEEP), (EXTRA_ROWS, WIDE_SWEEP)):
        for row in rows:
            for tiles in (row_tiles(row, arch), *sweep):
                out.append(row_build(row, tiles, arch))
    return out


def bar_builds(arch: str = "sm_90", rows: str | None = None, short: bool = False) -> list[Job]:
    """What `bench_attention.py --bar --arch ARCH` builds: every BAR_ROWS row (whose name matches `rows`)
    with `arch`'s tiles; `short`: the SHORT_ROWS of `--short` instead."""
    from bench.bench_attention import BAR_ROWS, SHORT_ROWS, row_build, row_tiles

    return [(*row_build(row, row_tiles(row, arch), arch), row.get("name", ""), arch)
            for row in (SHORT_ROWS if short else BAR_ROWS)
            if rows is None or re.search(rows, row.get("name", ""))]


def with_variants(jobs: list[Job], variants: list[str]) -> list[Job]:
    """Each job as it is, then once per variant ("NAME=VALUE;NAME=VALUE") with those bindings added."""
    out = list(jobs)
    for text in variants:
        pairs = [kv for kv in text.split(";") if kv.strip()]
        if not pairs or any("=" not in kv for kv in pairs):
            raise SystemExit(f"--variant {text!r}: write NAME=VALUE;NAME=VALUE")
        extra = dict(kv.strip().split("=", 1) for kv in pairs)
        out += [(job[0], {**job[1], **extra}, *job[2:]) for job in jobs]
    return out


def job_set(name: str, arch: str, rows: str | None = None, variants: list[str] = ()) -> list[Job]:
    """The jobs of `--set name` for `--arch arch` (bar rows matching `rows`, each variant too),
    deduplicated (one per cache entry)."""
    tests = lambda: gpu_test_builds() + (hopper_attention_builds() if arch == "sm_90" else [])  # noqa: E731
    hopper = lambda: ([j for j in gpu_test_builds() if len(j) > 3 and j[3] == "sm_90a"]  # noqa: E731
                      + hopper_attention_builds() + bar_builds("sm_90a") + bar_builds("sm_90a", short=True))
    if rows is not None and name not in ("bar", "short"):
        raise SystemExit("--rows selects bar rows: use it with --set bar or short")
    jobs = {"tests": tests, "bench": lambda: bench_builds(arch), "bar": lambda: bar_builds(arch, rows),
            "short": lambda: bar_builds(arch, rows, short=True), "hopper": hopper,
            "all": lambda: tests() + bench_builds(arch) + bar_builds(arch)}[name]()
    jobs = with_variants(jobs, list(variants))
    return list({_key(j): j for j in jobs}.values())


def _key(job: Job) -> tuple:
    source, defines = job[:2]
    return (str(source), tuple(sorted((k, str(v).lower() if isinstance(v, bool) else str(v))
                                      for k, v in defines.items())), job[3] if len(job) > 3 else "")


def _build(args: tuple[Job, str]) -> tuple[str, float, dict, bool, str | None]:
    job, arch = args
    source, defines = job[:2]
    arch = job[3] if len(job) > 3 else arch  # a job that names its target (sm_90a) keeps it
    import tlc

    name = Path(source).name if isinstance(source, Path) else (job[2] if len(job) > 2 else "<TL text>")
    label = f"{name} " + " ".join(f"{k}={v}" for k, v in defines.items())
    start = time.perf_counter()
    try:
        kernel = tlc.build(source, arch=arch, defines=defines)
    except Exception as exc:  # report and continue: one bad build should not hide the others
        return label, time.perf_counter() - start, {}, False, str(exc)[:2000]
    parts = [k for _, k in kernel.kernels] if hasattr(kernel, "kernels") else [kernel]   # a program of several
    return (label, time.perf_counter() - start, parts[0].compiled.metadata.get("ptxas", {}),
            all(p.compiled.cached for p in parts), None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--set", default="all", choices=["tests", "bench", "bar", "short", "hopper", "all"])
    ap.add_argument("--rows", help="with --set bar: only the rows whose name matches this regex")
    ap.add_argument("--variant", action="append", default=[], help="NAME=VALUE;NAME=VALUE: build each job with these too")
    a = ap.parse_args()
    jobs = job_set(a.set, a.arch, a.rows, a.variant)
    print(f"precompiling {len(jobs)} kernel(s) for {a.arch} with {a.jobs} job(s)", flush=True)
    failed = 0
    with ProcessPoolExecutor(a.jobs) as pool:
        for label, secs, ptxas, cached, err in pool.map(_build, [(j, a.arch) for j in jobs]):
            status = "cached" if cached else f"{secs:6.1f} s"
            print(f"{label:90s} {status}  regs={ptxas.get('registers')} spill={ptxas.get('spill_store_bytes')}"
                  + (f"\n  ERROR {err}" if err else ""), flush=True)
            failed += err is not None
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
