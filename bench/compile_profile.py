"""Where NVRTC's C++ front end spends a kernel's compile: its time trace, summed per kernel-IR op kind.

    python3 bench/compile_profile.py specs/mha_fwd.tl [-D NAME=VALUE ...] [--arch sm_90] [--out FILE]

Compiles the spec's emitted CuTe to PTX only (`-arch=compute_XX`: ptxas is not part of the question)
with `-fdevice-time-trace`, streams the trace (about 1 GB for the default d=128 kernel; the trace
itself makes the compile several times slower, so the seconds here are for comparing, not the cold
compile time: bench/compile_time.py measures that) and reports
- NVRTC's phases (front end, NVVM) and the PTX split into code and `.global` constants (every
  `static constexpr` member CuTe instantiates becomes one under `-default-device`),
- the front end's time per kernel-IR op kind: each CuTe call the kernel body makes (and each
  instantiation deferred to the end of the translation unit) is charged to the op whose emitter
  handler writes that call (PartitionOp → partition_S/D/retile, FragmentOp → partition_fragment_*,
  CopyOp → cute::copy, MmaOp → cute::gemm, ...),
- the templates with the most self time (CuTe's tuple machinery: tuple_element, get).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

_EVENT = re.compile(r'\{"args":\{"detail":"((?:[^"\\]|\\.)*)"\},"dur":(\d+),"name":"([^"]+)","ph":"X",'
                    r'"pid":\d+,"tid":\d+,"ts":(\d+)\}')

# CuTe / tlc call → the kernel-IR op whose emitter handler writes it (first match wins)
OP_OF_CALL = [
    (r"ThrCopy::partition_[SD]|ThrCopy::retile_[SD]|TiledCopy::retile|ThrMMA::partition_[ABC]\b", "PartitionOp"),
    (r"partition_fragment_[ABC]|ThrMMA::partition_fragment|make_fragment_like", "FragmentOp"),
    (r"make_tiled_copy|TiledCopy::|Copy_Atom<.*>::Copy_Atom|get_thread_slice", "TiledCopyOp"),
    (r"make_tiled_mma|TiledMMA::|get_slice", "TiledMmaOp"),
    (r"^cute::copy\b|copy_if|cp_async|Copy_Atom::call", "CopyOp"),
    (r"^cute::gemm\b|MMA_Atom::call", "MmaOp"),
    (r"tile_to_shape|composition|get_nonswizzle_portion|Swizzle", "SmemLayoutOp / SmemTransposeLayoutOp"),
    (r"local_tile|make_gmem_ptr|make_shape|make_stride", "GlobalTensorOp / GlobalTileOp"),
    (r"make_identity_tensor", "IdentityTileOp"),
    (r"make_inttuple_iter|make_tensor|make_layout", "fold-partitions views (ThreadViewOp, CoordViewOp, ...)"),
    (r"tlc::rowcol|tlc::acc_to_a|tlc::convert_type", "preamble helpers (row/col views, regroup, convert)"),
    (r"^cute::(clear|fill)\b", "fill/clear"),
]


def op_of(call: str) -> str:
    for pattern, op in OP_OF_CALL:
        if re.search(pattern, call):
            return op
    return "other"


def read_events(path: str) -> list[tuple[int, int, str, str]]:
    """(start µs, duration µs, event name, detail), sorted by start then longest first."""
    text = Path(path).read_text(errors="replace")
    events = [(int(m.group(4)), int(m.group(2)), m.group(3), m.group(1)) for m in _EVENT.finditer(text)]
    events.sort(key=lambda e: (e[0], -e[1]))
    return events


def summarize(events: list[tuple[int, int, str, str]], kernel: str, source_name: str) -> dict:
    """Charge each outermost instantiation to an op kind; self time per template; headers apart."""
    self_time = [e[1] for e in events]
    parent: dict[int, int] = {}
    stack: list[int] = []
    for i, (ts, dur, _, _) in enumerate(events):
        while stack and events[stack[-1]][0] + events[stack[-1]][1] <= ts:
            stack.pop()
        if stack:
            parent[i] = stack[-1]
            self_time[stack[-1]] -= dur
        stack.append(i)

    def chain(i: int) -> list[int]:
        out = [i]
        while out[-1] in parent:
            out.append(parent[out[-1]])
        return out

    per_op: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[tuple[str, str]] = collections.Counter()
    headers = 0.0
    for i, (_, dur, name, detail) in enumerate(events):
        if not name.startswith("Instantiating"):
            if name == "Processing Header File" and detail != source_name and i in parent \
                    and events[parent[i]][2] == "CUDA C++ Front-End":
                headers += dur
            continue
        up = [events[j] for j in chain(i)[1:]]
        # outermost instantiation: its parent is the kernel body, the .cu itself, or the front end
        if up and not any(u[2].startswith("Instantiating") for u in up):
            call = detail.split(" [with")[0].split(" [")[0]
            op = op_of(call)
            per_op[op] += dur
            calls[(op, re.split(r"<", call, 1)[0])] += dur
    by_template: collections.Counter[str] = collections.Counter()
    for i, (_, _, name, detail) in enumerate(events):
        if name.startswith("Instantiating"):
            by_template[re.split(r"[<(\[]", detail.split(" [with")[0])[0][:90]] += self_time[i]
    phases = {name: dur for _, dur, name, _ in events if name in ("CUDA C++ Front-End", "LibNVVM")}
    return {"phases_s": {k: v / 1e6 for k, v in phases.items()}, "headers_s": headers / 1e6,
            "front_end_by_op_s": {k: v / 1e6 for k, v in per_op.most_common()},
            "top_calls_s": [[op, call, v / 1e6] for (op, call), v in calls.most_common(15)],
            "top_self_s": [[t, v / 1e6] for t, v in by_template.most_common(10)],
            "events": len(events), "kernel": kernel}


def ptx_split(ptx: bytes) -> dict:
    text = ptx.rstrip(b"\0").decode(errors="replace")
    globals_ = [ln for ln in text.splitlines() if ln.startswith(".global")]
    return {"ptx_bytes": len(text), "global_constants": len(globals_),
            "global_constant_bytes": sum(len(ln) + 1 for ln in globals_)}


def compile_traced(source: str, arch: str, name: str, trace_dir: str) -> tuple[bytes, str, float]:
    from cuda.bindings import nvrtc

    from tlc.backend_cute.nvrtc import compile_options

    options = [o for o in compile_options(arch) if not o.startswith(("-arch", "--ptxas-options"))]
    trace = os.path.join(trace_dir, "trace")
    options += [f"-arch=compute_{arch.removeprefix('sm_')}", f"-fdevice-time-trace={trace}"]
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    try:
        start = time.perf_counter()
        (status,) = nvrtc.nvrtcCompileProgram(prog, len(options), [o.encode() for o in options])
        seconds = time.perf_counter() - start
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise SystemExit(f"NVRTC failed ({status}); build the spec with `tlc build` to see why")
        _, size = nvrtc.nvrtcGetPTXSize(prog)
        ptx = b" " * size
        nvrtc.nvrtcGetPTX(prog, ptx)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    found = [p for p in Path(trace_dir).iterdir() if p.name.startswith("trace")]
    if not found:
        raise SystemExit("NVRTC wrote no time trace (needs NVRTC 12.8 or newer)")
    return ptx, str(found[0]), seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec")
    ap.add_argument("-D", dest="define", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--out", help="write the JSON here")
    ap.add_argument("--no-fold", action="store_true", help="lower without fold-partitions (TLC_FOLD_PARTITIONS=0)")
    a = ap.parse_args()
    if a.no_fold:
        os.environ["TLC_FOLD_PARTITIONS"] = "0"
    from tlc.backend_cute.emit import emit_program
    from tlc.builder import lower_to_kernel_ir
    from tlc.names import kernel_name

    from tlc.diagnostics import GLOBAL_SOURCES, TlcError

    bad = [d for d in a.define if "=" not in d]
    if bad:
        ap.error(f"-D {bad[0]}: write NAME=VALUE")
    defines = dict(d.split("=", 1) for d in a.define)
    try:
        state, _ = lower_to_kernel_ir(Path(a.spec).read_bytes(), a.spec, a.arch, defines, name=kernel_name(a.spec))
    except TlcError as exc:
        print(exc.render(GLOBAL_SOURCES), file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"{a.spec}: error: {exc.strerror or exc}", file=sys.stderr)
        return 1
    cu = f"{Path(a.spec).stem}.cu"
    source = emit_program(state.kir, source=Path(a.spec).name, cu_name=cu)
    print(f"compiling {a.spec} to PTX with a time trace (minutes)...", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="tlc-trace-") as tmp:
        ptx, trace, seconds = compile_traced(source, a.arch, cu, tmp)
        report = summarize(read_events(trace), state.kir.name, cu)
    report.update(ptx_split(ptx), spec=a.spec, defines=defines, arch=a.arch, traced_compile_s=seconds)
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1) + "\n")
    total = report["phases_s"].get("CUDA C++ Front-End", 0.0)
    print(f"{a.spec} {defines or ''} {a.arch}: traced front end {total:.1f} s, NVVM "
          f"{report['phases_s'].get('LibNVVM', 0.0):.1f} s; PTX {report['ptx_bytes'] / 1e6:.2f} MB of which "
          f"{report['global_constant_bytes'] / 1e6:.2f} MB are {report['global_constants']} .global constants")
    print(f"  {'headers':45s} {report['headers_s']:6.1f} s")
    for op, s in report["front_end_by_op_s"].items():
        print(f"  {op:45s} {s:6.1f} s  {100 * s / total if total else 0:4.0f}%")
    print("  top calls:")
    for op, call, s in report["top_calls_s"][:10]:
        print(f"    {s:6.1f} s  {call}  ({op})")
    print("  most self time:", ", ".join(f"{t} {s:.1f} s" for t, s in report["top_self_s"][:5]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
