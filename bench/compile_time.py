"""Compile latency of tlc kernels, cold and warm, per kernel (a benchmark, not a test; no GPU needed).

Cold: a fresh process and an empty cache folder (TLC_CACHE_DIR): TL parse + passes + lowering, CuTe
emit, NVRTC (its own `--time` split: C++ front end, NVVM optimizer, PTX translation, the rest is
ptxas), PTX and cubin size, and the cubin load when a GPU is visible. Warm: the same call again in
that process (tlc.build's dispatch dict, and the cache path without it), then a new process with
the filled cache (imports, which torch users pay anyway, are reported apart from the call).

    python3 bench/compile_time.py [--kernels mha_d128,attn_d64,attn_d128_causal] [--out FILE]
    python3 bench/compile_time.py --kernels attn_d128 --experiment=--split-compile=2 --experiment=--minimal
    python3 bench/compile_time.py --kernels attn_d128_sm90a -D SplitMasked=false   # a Param's compile cost

`--experiment` compiles the first kernel's CuTe source with changed NVRTC options (`~OPT` drops a
default option) next to the defaults and says whether the kernel's SASS (its .text section) is
byte-identical. The table is printed last; `--out` writes the JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def kernels() -> dict[str, tuple[str, dict]]:
    """name → (spec path, -D bindings): the README's `tlc build specs/mha_fwd.tl` kernel, and the
    specializations `tlc.attention` builds for d=64 and causal d=128 (tlc.attention.kernels.attention_spec) on the
    sm_80 family, and for d=128 on Hopper (attn_d128_sm90a: sm_90a, wgmma, its own tiles)."""
    from tlc.attention.kernels import attention_spec

    out = {"mha_d128": (str(ROOT / "specs" / "mha_fwd.tl"), {})}
    for name, (d, causal) in {"attn_d64": (64, False), "attn_d128_causal": (128, True),
                              "attn_d128": (128, False)}.items():
        spec, defines = attention_spec("bf16", d, d, causal)
        out[name] = (str(spec), defines)
    for name, arch in KERNEL_ARCH.items():  # the Hopper kernel tlc.attention builds for d=128 (its own tiles)
        spec, defines = attention_spec("bf16", 128, 128, False, arch)
        out[name] = (str(spec), defines)
    extra = dict(kv.split("=", 1) for kv in os.environ.get(_DEFINES_ENV, "").split(";") if "=" in kv)
    return {name: (spec, {**defines, **extra}) for name, (spec, defines) in out.items()}


_DEFINES_ENV = "TLC_COMPILE_TIME_DEFINES"   # -D bindings for every kernel, inherited by the child processes


KERNEL_ARCH = {"attn_d128_sm90a": "sm_90a"}  # kernels built for their own target whatever --arch says


def kernel_arch(name: str, arch: str) -> str:
    return KERNEL_ARCH.get(name, arch)


DEFAULT_KERNELS = ("mha_d128", "attn_d64", "attn_d128_causal")


# ---------------------------------------------------------------------- child processes
def _load_seconds(cubin: bytes) -> float | None:
    """cuModuleLoadData time, or None without a GPU."""
    try:
        import torch
        if not torch.cuda.is_available():
            return None
        torch.cuda.init()
        torch.empty(1, device="cuda")  # a current primary context
        from cuda.bindings import driver
    except Exception:
        return None
    start = time.perf_counter()
    err, module = driver.cuModuleLoadData(cubin)
    seconds = time.perf_counter() - start
    if err != driver.CUresult.CUDA_SUCCESS:
        return None
    driver.cuModuleUnload(module)
    return seconds


def child_cold(name: str, arch: str) -> dict:
    start = time.perf_counter()
    import tlc.backend_cute.launch  # noqa: F401  (what tlc.build imports; counted apart)
    import tlc.runtime
    imports = time.perf_counter() - start
    spec, defines = kernels()[name]
    start = time.perf_counter()
    compiled, _ = tlc.runtime.compile_spec(Path(spec), arch=arch, defines=defines)
    total = time.perf_counter() - start
    meta, t = compiled.metadata, compiled.timings
    cold = {"cached": compiled.cached, "total_s": total, "lower_s": t.get("lower"), "emit_s": t.get("emit"),
            "nvrtc_s": t.get("nvrtc"), "nvrtc_phases_ms": meta.get("nvrtc_phases_ms", {}),
            "ptx_bytes": meta.get("ptx_bytes"), "cubin_bytes": len(compiled.cubin),
            "source_bytes": len(compiled.source), "ptxas": meta.get("ptxas", {}), "imports_s": imports,
            "cubin_load_s": _load_seconds(compiled.cubin)}
    start = time.perf_counter()
    tlc.runtime.compile_spec(Path(spec), arch=arch, defines=defines)
    again = time.perf_counter() - start
    tlc.runtime.build(Path(spec), arch=arch, defines=defines)  # makes the Kernel, fills the dispatch dict
    start = time.perf_counter()
    tlc.runtime.build(Path(spec), arch=arch, defines=defines)
    dispatch = time.perf_counter() - start
    return {"cold": cold, "warm_same_process": {"compile_spec_ms": again * 1e3, "build_ms": dispatch * 1e3}}


def child_warm(name: str, arch: str) -> dict:
    start = time.perf_counter()
    import tlc.backend_cute.launch  # noqa: F401
    import tlc.runtime
    imports = time.perf_counter() - start
    spec, defines = kernels()[name]
    start = time.perf_counter()
    kernel = tlc.runtime.build(Path(spec), arch=arch, defines=defines)
    first = time.perf_counter() - start
    return {"imports_s": imports, "build_ms": first * 1e3, "cached": kernel.compiled.cached,
            "timings_ms": {k: v * 1e3 for k, v in kernel.compiled.timings.items()},
            "cubin_load_s": _load_seconds(kernel.compiled.cubin)}


def _run_child(mode: str, name: str, arch: str, cache: str) -> dict:
    env = dict(os.environ, TLC_CACHE_DIR=cache, TLC_QUIET="1", PYTHONPATH=str(ROOT))
    env.pop("TLC_ALWAYS_COMPILE", None)
    proc = subprocess.run([sys.executable, __file__, "--child", mode, "--kernels", name, "--arch", arch],
                          env=env, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise SystemExit(f"{mode} run of {name} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(name: str, arch: str) -> dict:
    spec, defines = kernels()[name]
    arch = kernel_arch(name, arch)
    with tempfile.TemporaryDirectory(prefix="tlc-compile-time-") as cache:
        print(f"{name}: cold compile (fresh cache {cache})...", file=sys.stderr, flush=True)
        row = {"kernel": name, "spec": os.path.relpath(spec, ROOT), "defines": defines, "arch": arch,
               "load_average_before": os.getloadavg()[0]}
        row.update(_run_child("cold", name, arch, cache))
        row["warm_fresh_process"] = _run_child("warm", name, arch, cache)
    return row


# ---------------------------------------------------------------------- NVRTC option experiments
def text_sections(cubin: bytes) -> dict[str, bytes]:
    """`.text.<kernel>` sections of an ELF64 cubin: the SASS, without symbols or metadata."""
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names_at = headers[shstrndx][4]

    def name(h) -> str:
        end = cubin.index(b"\0", names_at + h[0])
        return cubin[names_at + h[0]:end].decode()
    return {name(h): cubin[h[4]:h[4] + h[5]] for h in headers if name(h).startswith(".text.")}


def _experiment_child(source_file: str, arch: str, spec: str) -> dict:
    from tlc.backend_cute.nvrtc import BASE_OPTIONS, compile_cubin
    import tlc.backend_cute.nvrtc as nv

    words = spec.split()
    drop = {w[1:] for w in words if w.startswith("~")}
    nv.BASE_OPTIONS = tuple(o for o in BASE_OPTIONS if o not in drop)
    extra = tuple(w for w in words if not w.startswith("~"))
    result = compile_cubin(Path(source_file).read_text(), arch, "kernel.cu", extra)
    Path(source_file + ".cubin").write_bytes(result.cubin)
    return {"options": spec or "(defaults)", "seconds": result.seconds, "phases_ms": result.phases_ms,
            "ptx_bytes": result.ptx_bytes, "cubin_bytes": len(result.cubin), "ptxas": result.ptxas}


def experiments(name: str, arch: str, specs: list[str]) -> list[dict]:
    from tlc.backend_cute.emit import emit_program
    from tlc.builder import lower_to_kernel_ir
    from tlc.names import kernel_name
    from tlc.runtime import normal_defines

    spec, defines = kernels()[name]
    arch = kernel_arch(name, arch)
    state, _ = lower_to_kernel_ir(Path(spec).read_bytes(), spec, arch, normal_defines(defines), name=kernel_name(spec))
    out, base_text = [], None
    with tempfile.TemporaryDirectory(prefix="tlc-nvrtc-exp-") as tmp:
        for options in ["", *specs]:
            source = Path(tmp) / "kernel.cu"
            source.write_text(emit_program(state.kir, source=Path(spec).name, cu_name="kernel.cu"))
            print(f"{name}: NVRTC with {options or '(defaults)'}...", file=sys.stderr, flush=True)
            proc = subprocess.run([sys.executable, __file__, "--child", "experiment", "--arch", arch,
                                   f"--experiment={options}", "--kernels", str(source)],
                                  env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True)
            if proc.returncode:
                out.append({"options": options, "error": proc.stderr.strip().splitlines()[-1:]})
                continue
            row = json.loads(proc.stdout.strip().splitlines()[-1])
            text = text_sections((Path(tmp) / "kernel.cu.cubin").read_bytes())
            base_text = text if base_text is None else base_text
            row["sass_identical_to_defaults"] = text == base_text
            out.append(row)
    return out


# ---------------------------------------------------------------------- report
def _fmt(x, scale: float = 1.0, digits: int = 1) -> str:
    return "n/a" if x is None else f"{x * scale:.{digits}f}"


def table(rows: list[dict]) -> str:
    lines = ["| kernel | cold s | lower s | emit s | NVRTC s (front end / NVVM / PTX / ptxas+rest) | PTX MB | "
             "warm, same process ms (build / cache path) | warm, new process ms |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        c, w, f = r["cold"], r["warm_same_process"], r["warm_fresh_process"]
        ph = c["nvrtc_phases_ms"]
        split = " / ".join(_fmt(ph.get(k), 1e-3) for k in ("CUDA C++ Frontend", "NVVM Optimizer", "PTX Translation",
                                                            "ptxas and rest"))
        lines.append(f"| {r['kernel']} ({r['arch']}) | {_fmt(c['total_s'])} | {_fmt(c['lower_s'], digits=2)} | "
                     f"{_fmt(c['emit_s'], digits=3)} | {_fmt(c['nvrtc_s'])} ({split}) | "
                     f"{_fmt(c['ptx_bytes'], 1e-6, 2)} | {_fmt(w['build_ms'], digits=3)} / "
                     f"{_fmt(w['compile_spec_ms'])} | {_fmt(f['build_ms'])} |")
    return "\n".join(lines)


def experiment_table(rows: list[dict]) -> str:
    lines = ["| NVRTC options | s | front end / NVVM / PTX / ptxas+rest s | PTX MB | same SASS |", "| --- | --- | --- | --- | --- |"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['options']} | failed: {' '.join(r['error'])[:80]} | | | |")
            continue
        ph = r["phases_ms"]
        split = " / ".join(_fmt(ph.get(k), 1e-3) for k in ("CUDA C++ Frontend", "NVVM Optimizer", "PTX Translation",
                                                            "ptxas and rest"))
        lines.append(f"| {r['options']} | {_fmt(r['seconds'])} | {split} | {_fmt(r['ptx_bytes'], 1e-6, 2)} | "
                     f"{'yes' if r['sass_identical_to_defaults'] else 'no'} |")
    return "\n".join(lines)


def _machine() -> dict:
    from tlc.backend_cute.nvrtc import nvrtc_version

    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    return {"cpus": os.cpu_count(), "cpu": cpu, "python": platform.python_version(), "nvrtc": nvrtc_version(),
            "date": time.strftime("%Y-%m-%d %H:%M")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", default=",".join(DEFAULT_KERNELS),
                    help=f"comma-separated, from {', '.join(kernels())}")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--out", help="write the JSON here")
    ap.add_argument("--experiment", action="append", default=[], metavar="OPTIONS",
                    help="NVRTC options to try on the first kernel, written --experiment=OPTIONS "
                    "('~OPT' drops a default); repeatable")
    ap.add_argument("--no-fold", action="store_true",
                    help="lower without fold-partitions (TLC_FOLD_PARTITIONS=0, inherited by the child processes)")
    ap.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME=VALUE",
                    help="bind a Param in every kernel (e.g. SplitMasked=false); repeatable")
    ap.add_argument("--child", choices=("cold", "warm", "experiment"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if any("=" not in d for d in a.defines):
        ap.error("-D takes NAME=VALUE")
    if a.defines:
        os.environ[_DEFINES_ENV] = ";".join(a.defines)
    if a.no_fold:
        os.environ["TLC_FOLD_PARTITIONS"] = "0"
    if a.child == "experiment":
        print(json.dumps(_experiment_child(a.kernels, a.arch, a.experiment[0] if a.experiment else "")))
        return 0
    if a.child:
        print(json.dumps((child_cold if a.child == "cold" else child_warm)(a.kernels, a.arch)))
        return 0
    names = [n for n in a.kernels.split(",") if n]
    unknown = [n for n in names if n not in kernels()]
    if unknown:
        ap.error(f"unknown kernel(s) {', '.join(unknown)}; known: {', '.join(kernels())}")
    from tlc.lowering.switches import switches_key
    report: dict = {"machine": _machine(), "arch": a.arch,
                    "fold_partitions": os.environ.get("TLC_FOLD_PARTITIONS", "1").strip() != "0",
                    "switches": switches_key(), "defines": a.defines}
    if a.experiment:
        report["experiments"] = {"kernel": names[0], "rows": experiments(names[0], a.arch, a.experiment)}
    else:
        report["kernels"] = [measure(n, a.arch) for n in names]
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"{report['machine']['cpus']} CPUs ({report['machine']['cpu']}), NVRTC {report['machine']['nvrtc']}, "
          f"{a.arch}, {report['machine']['date']}, {report['switches']}")
    print(experiment_table(report["experiments"]["rows"]) if a.experiment else table(report["kernels"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
