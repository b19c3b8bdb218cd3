"""Differential test across targets: structurally varied TL programs (tlc.testing.structural_program, named
by seed) built for every target that accepts them, each kernel run against the TL interpreter of the program
as written (float64 on the CPU, the same bf16/fp16 inputs, NaN-poisoned outputs) at SIZES:

    python3 bench/differential_gpu.py --seeds 0:200 --arch sm_90 --arch sm_90a --jobs 16 --out $OUT/differential
    python3 bench/differential_gpu.py --seeds 0:3 --build-only --jobs 2 --out /tmp/differential   # no GPU needed
    python3 bench/differential_gpu.py --paged --seeds 0:150 …   # K and V read from pages (a row map)
    python3 bench/differential_gpu.py --windowed --seeds 0:150 …   # scores also masked outside a key window

1. Build, in `--jobs` processes: each (seed, target) is built (NVRTC; the kernel lands in the disk cache),
   refused at a line, refused without a line, a crash (an exception other than tlc's one-line error), or
   an NVRTC error (CuTe that tlc emitted and NVRTC refused). Each seed that built somewhere gets its
   inputs and expected outputs from the interpreter in the same pool. `--build-only` stops here.
2. Run: one worker subprocess launches the kernels and reports each case as it finishes. A case still
   running after `--timeout` seconds is a HANG: a hung kernel cannot be stopped from inside its process, so
   the worker is killed and a new one takes the cases left. A case that loses the CUDA context (an illegal
   address) ends its worker the same way. A kernel passes when it writes exactly the elements the program
   writes and max |kernel - interpreter| <= 2e-2 · max(1, max |interpreter|) (tests/gpu/differential.py).

Prints a table last (per target: built, refused at a line, refused without one, crash, NVRTC error, ok,
unchecked: no size where the program has a meaning, WRONG, HANG, ERROR) and writes differential_gpu.json
under --out (per case: seed, target, status, max error, message, and the TL text of every failure). On a
machine without network access see bench/README.md for carrying lark, pycute and the CuTe headers.
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SIZES = [(17, 33, 2), (333, 77, 1), (77, 333, 1)]   # (seqlen_q, seqlen_k, batch): odd, q < k and q > k
RTOL = 2e-2
BUILD_TIMEOUT = 900.0   # seconds a worker may spend in tlc.build (a cache miss compiles with NVRTC)
SCALE = 0.125
NAME = "generated.tl"
FAILED = ("refused-no-line", "crash", "nvrtc-error", "WRONG", "HANG", "ERROR")
COLUMNS = ("built", "refused", "refused-no-line", "crash", "nvrtc-error", "ok", "unchecked", "WRONG", "HANG", "ERROR")
_PROTOCOL = "@@ "
PAGED_ENV = "TLC_DIFFERENTIAL_PAGED"   # `--paged`, for every process of the run (pool and worker inherit it)
WINDOWED_ENV = "TLC_DIFFERENTIAL_WINDOWED"   # `--windowed`, likewise


def _paged() -> bool:
    return os.environ.get(PAGED_ENV) == "1"


def _windowed() -> bool:
    return os.environ.get(WINDOWED_ENV) == "1"


def _program(seed: int):
    """(TL text, -D bindings, description) of seed's program: structural_program, with K and V from pages under
    `--paged`, masked outside a key window under `--windowed`."""
    from tlc.testing.structural import choices_of_seed

    c = choices_of_seed(seed, paged=_paged(), windowed=_windowed())
    return c.render(), c.defines_dict(), c.describe()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0:200", help="A:B (the seeds A … B-1), N, or a comma list of both")
    ap.add_argument("--arch", action="append", choices=["sm_90", "sm_90a"], help="a target (repeatable)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel NVRTC compiles")
    ap.add_argument("--out", required=True, help="folder for differential_gpu.json")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds one case may run before it is a HANG")
    ap.add_argument("--build-only", action="store_true", help="build and compute the references; no GPU")
    ap.add_argument("--paged", action="store_true", help="the programs with K and V read from pages through a block "
                    "table (tlc.testing.structural's paged choice)")
    ap.add_argument("--windowed", action="store_true", help="the programs with their scores also masked outside a "
                    "window of keys around the row (tlc.testing.structural's windowed choice: a predicate mask)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.arch = list(dict.fromkeys(args.arch or ["sm_90", "sm_90a"]))
    try:
        seeds: list[int] = []
        for item in args.seeds.split(","):
            first, _, last = item.partition(":")
            seeds += range(int(first), int(last)) if last else [int(first)]
        args.seed_list = sorted(set(seeds))
    except ValueError:
        ap.error(f"--seeds {args.seeds!r}: write A:B (seeds A to B-1), N, or a comma list such as 0:40,97")
    return args


# ------------------------------------------------------------------ phase 1: build (a process pool)


def heads_of(kv_offset: str) -> tuple[int, int]:
    """(query heads, KV heads): a group of 2 for GQA, 3 query heads on one KV head for MQA."""
    return {"0": (3, 1), "head_idx": (2, 2)}.get(kv_offset, (4, 2))


def build_case(seed: int, target: str) -> dict:
    """Lower, then compile with NVRTC (into the disk cache that tlc.build reads later)."""
    from tlc.builder import lower_to_kernel_ir
    from tlc.diagnostics import TlcError
    from tlc.names import kernel_name
    from tlc.runtime import compile_spec
    text, defines, _ = _program(seed)
    row: dict = {"seed": seed, "target": target}
    start = time.perf_counter()
    try:
        lower_to_kernel_ir(text.encode(), NAME, target, defines or {}, name=kernel_name(NAME))
    except TlcError as exc:
        line = exc.diagnostics[0].loc.line if exc.diagnostics[0].loc else 0
        return dict(row, status="refused" if line > 0 else "refused-no-line", line=line,
                    message=exc.diagnostics[0].message)
    except Exception as exc:  # noqa: BLE001 - a traceback in the compiler is a finding to record
        return dict(row, status="crash", message=_traceback(exc))
    try:
        compile_spec(text, arch=target, defines=defines or {})
    except TlcError as exc:
        return dict(row, status="nvrtc-error", message=exc.render()[:2000])
    except Exception as exc:  # noqa: BLE001
        return dict(row, status="crash", message=_traceback(exc))
    return dict(row, status="built", build_seconds=round(time.perf_counter() - start, 1))


def _traceback(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-4:])[-2000:]


def reference_case(seed: int, work: str) -> str:
    """Inputs and the interpreter's outputs of the program as written at SIZES, saved for the worker;
    a size where the program has no meaning (a loop of no trips leaves its softmax undefined) keeps None."""
    import torch

    from tlc.ir.interpreter import InterpError, run_program
    from tlc.testing.checks import Shapes, make_inputs
    from tlc.testing.structural import choices_of_seed, reference_graph

    torch.set_num_threads(1)
    choices = choices_of_seed(seed, paged=_paged(), windowed=_windowed())
    graph = reference_graph(choices.render(), choices.defines_dict(), NAME,
                            meaningful_as_written=choices.as_written_meaningful)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[choices.dtype]
    heads, kv_heads = heads_of(choices.kv_offset)
    sizes = []
    for sq, sk, batch in SIZES:
        floats = {"scale": SCALE} if "scale" in graph.inputs else {}
        shapes = Shapes(batch, heads, kv_heads, {"seqlen_q": sq, "seqlen_k": sk}, floats)
        tensors, _, scalars = make_inputs(graph, shapes, seed, dtype)
        try:
            expected = run_program(graph, tensors, scalars)["O"].float()
        except InterpError:
            expected = None
        inputs = {k: v.to(dtype) for k, v in tensors.items() if k != "O"}
        # the tensor Inputs (a block table) and the lengths, by keyword: a pool does not give seqlen_k
        runtime = {k: v for k, v in scalars.items() if k in graph.tensor_inputs or k in ("seqlen_q", "seqlen_k")}
        sizes.append({"size": f"{sq}x{sk}", "inputs": inputs, "expected": expected, "floats": floats,
                      "runtime": runtime})
    path = Path(work) / f"seed{seed}.pt"
    torch.save({"sizes": sizes}, path)
    return str(path)


def _quiet() -> None:
    os.environ.setdefault("TLC_QUIET", "1")   # no per-compile progress lines from hundreds of compiles


def build_all(seeds: list[int], targets: list[str], jobs: int, work: str) -> list[dict]:
    """Every (seed, target) built in parallel; each seed with a built target gets its references."""
    rows: list[dict] = []
    with ProcessPoolExecutor(max_workers=max(1, jobs), initializer=_quiet) as pool:
        pending: dict[Future, tuple] = {pool.submit(build_case, s, t): ("build", s, t)
                                        for s in seeds for t in targets}
        referenced: set[int] = set()
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                kind, seed, target = pending.pop(fut)
                if kind == "reference":
                    try:
                        fut.result()
                    except Exception as exc:  # noqa: BLE001 - the seed's built cases cannot run
                        for row in rows:
                            if row["seed"] == seed and row["status"] == "built":
                                row.update(status="ERROR", message=f"reference: {_traceback(exc)}")
                    continue
                try:
                    row = fut.result()
                except Exception as exc:  # noqa: BLE001 - a build process that died
                    row = {"seed": seed, "target": target, "status": "crash", "message": _traceback(exc)}
                rows.append(row)
                if row["status"] in FAILED:
                    print(f"build seed {seed} {target}: {row['status']}: {row.get('message', '')[:160]}", flush=True)
                if len(rows) % 50 == 0:
                    print(f"{len(rows)} of {len(seeds) * len(targets)} builds done", flush=True)
                if row["status"] == "built" and seed not in referenced:
                    referenced.add(seed)
                    pending[pool.submit(reference_case, seed, work)] = ("reference", seed, None)
    return sorted(rows, key=lambda r: (r["seed"], r["target"]))


# ------------------------------------------------------------------ phase 2: run (a watched worker)


def worker_main(work: str) -> None:
    """Reads cases (JSON lines) from stdin, in order; writes `@@ {...}` lines: ready, then per case `building`
    (tlc.build: a cache hit, or NVRTC), `start` (the launches, watched) and its result."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)   # anything else the process prints goes to stderr, not into the protocol

    def say(**msg) -> None:
        proto.write(_PROTOCOL + json.dumps(msg) + "\n")

    import torch
    torch.cuda.init()
    say(ready=True)
    for line in sys.stdin:
        case = json.loads(line)
        say(building=[case["seed"], case["target"]])
        result = run_case(case["seed"], case["target"], work, started=lambda: say(start=[case["seed"], case["target"]]))
        say(result=result)
        if result.get("lost_context"):
            sys.exit(3)


def run_case(seed: int, target: str, work: str, started=lambda: None) -> dict:
    """Builds the case's kernel (a cache hit after phase 1), calls `started()`, then launches and compares."""
    import torch

    import tlc

    text, defines, _ = _program(seed)
    out: dict = {"seed": seed, "target": target, "status": "ok", "max_error": 0.0}
    try:
        kern = tlc.build(text, arch=target, defines=defines)
        saved = torch.load(Path(work) / f"seed{seed}.pt")

        def launch(inputs: dict, poisoned, floats: dict, runtime: dict):
            extra = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in runtime.items()
                     if k in kern._input_names or isinstance(v, torch.Tensor)}
            got = kern(*[inputs[a.name].cuda() for a in kern.inputs], out=poisoned.cuda(), **floats, **extra)
            return got.cpu()   # waits for the kernel

        started()
        out.update(compare_sizes(saved, launch))
    except Exception as exc:  # noqa: BLE001 - a launch that raises is a finding; the context may be gone
        out.update(status="ERROR", message=_traceback(exc))
        try:
            torch.cuda.synchronize()
        except Exception:  # noqa: BLE001
            out["lost_context"] = True
    return out


def compare_sizes(saved: dict, launch) -> dict:
    """`launch(inputs, poisoned output, float Inputs)` at every saved size where the program has a meaning,
    against the interpreter: status ok or WRONG (first failing size), the max error, what differs."""
    import torch

    from tlc.testing.structural import output_difference

    out: dict = {"status": "unchecked", "max_error": 0.0,
                 "message": "the program has a meaning at none of the sizes (a loop of no trips?)"}
    for size in saved["sizes"]:
        expected = size["expected"]
        if expected is None:
            continue
        out.update(status="ok", message="")
        dtype = next(iter(size["inputs"].values())).dtype
        got = launch(size["inputs"], torch.full(expected.shape, float("nan"), dtype=dtype), size["floats"],
                     size.get("runtime", {}))
        why, err = output_difference(got.double(), expected.double())
        out["max_error"] = max(out["max_error"], err)
        if why or not err <= RTOL:
            return dict(out, status="WRONG", size=size["size"],
                        message=why or f"max |kernel - interpreter| / max(1, |interpreter|) = {err:.3e} > {RTOL}")
    return out


def _reader(stream, sink: queue.Queue) -> None:
    for line in stream:
        if line.startswith(_PROTOCOL):
            sink.put(json.loads(line[len(_PROTOCOL):]))
    sink.put(None)


def run_all(cases: list[tuple[int, str]], work: str, timeout: float, log: Path,
            worker: list[str] | None = None) -> dict[tuple[int, str], dict]:
    """Every case in a watched worker (default: this script's `--worker`), which takes them in order; a new
    worker after a HANG, a lost context or a death. A worker speaks `worker_main`'s protocol on its stdout."""
    command = worker or [sys.executable, str(Path(__file__).resolve()), "--worker", work, "--out", work]
    results: dict[tuple[int, str], dict] = {}
    pending = list(cases)
    with open(log, "a") as err:
        while pending:
            outcome = _one_worker(command, pending, results, timeout, err)
            if outcome:   # the worker could not run at all: neither can the cases left
                results.update({c: {"status": "ERROR", "message": f"{outcome}; see {log}"}
                                for c in pending if c not in results})
            pending = [c for c in pending if c not in results]
    return results


def _one_worker(command: list[str], pending: list[tuple[int, str]], results: dict, timeout: float, err) -> str:
    """Runs `pending` in one worker until it ends or hangs; records what it finished and what hung or died.
    '' when it ran at least one case, else why it could not start."""
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
                            cwd=ROOT, start_new_session=True)
    inbox: queue.Queue = queue.Queue()
    threading.Thread(target=_reader, args=(proc.stdout, inbox), daemon=True).start()
    try:
        proc.stdin.write("".join(json.dumps({"seed": s, "target": t}) + "\n" for s, t in pending))
        proc.stdin.close()
    except OSError:   # the worker is gone already: its end shows below
        pass
    ready, phase, wait_s, finished = False, "starting", max(timeout, BUILD_TIMEOUT), 0   # CUDA's start-up
    while True:
        left = [c for c in pending if c not in results]
        try:
            msg = inbox.get(timeout=wait_s)
        except queue.Empty:
            _kill(proc)
            if not ready:
                return f"the GPU worker did not start in {wait_s:g} s"
            results[left[0]] = {"status": "HANG", "message": f"still {phase} after {wait_s:g} s"}
            print(f"run seed {left[0][0]} {left[0][1]}: HANG ({phase})", flush=True)
            return ""
        if msg is None:   # the worker ended: after a lost context, or it died in a case
            code = proc.wait()
            if not ready:
                return f"the GPU worker exited ({code}) before its first case"
            if left and (phase != "between cases" or not finished):   # a worker that finished nothing blames its first
                results[left[0]] = {"status": "ERROR", "message": f"the worker died while {phase} (exit status {code})"}
            return ""
        if msg.get("ready"):
            ready, phase, wait_s = True, "between cases", timeout
        elif msg.get("building"):
            phase, wait_s = "building", max(timeout, BUILD_TIMEOUT)
        elif msg.get("start"):
            phase, wait_s = "running", timeout
        elif msg.get("result"):
            result = msg["result"]
            results[left[0]] = result
            phase, wait_s, finished = "between cases", timeout, finished + 1
            if result["status"] != "ok":
                print(f"run seed {left[0][0]} {left[0][1]}: {result['status']}", flush=True)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


# ------------------------------------------------------------------ report


def table(rows: list[dict], targets: list[str]) -> str:
    """Counts per target; `built` counts every case NVRTC compiled, whatever its run gave."""
    counts = {t: Counter() for t in targets}
    for row in rows:
        built = row["status"] not in ("refused", "refused-no-line", "crash", "nvrtc-error")
        counts[row["target"]]["built"] += built
        if row["status"] != "built":
            counts[row["target"]][row["status"]] += 1
    heads = [("refused@line" if c == "refused" else c) for c in COLUMNS]
    lines = ["target  " + " ".join(heads)]
    lines += [f"{t:<7} " + " ".join(f"{counts[t][c]:>{len(h)}}" for c, h in zip(COLUMNS, heads)) for t in targets]
    return "\n".join(lines)


def differential(seeds: list[int], targets: list[str], out: Path, *, jobs: int, timeout: float = 60.0,
                 build_only: bool = False) -> dict:
    """Build every (seed, target), then (unless `build_only`) run what built; the report, also written to
    out/differential_gpu.json."""

    out.mkdir(parents=True, exist_ok=True)
    work = tempfile.mkdtemp(prefix="tlc-differential-")
    started = time.perf_counter()
    try:
        rows = build_all(seeds, targets, jobs, work)
        built = [(r["seed"], r["target"]) for r in rows if r["status"] == "built"]
        print(f"built {len(built)} of {len(rows)} cases in {time.perf_counter() - started:.0f} s", flush=True)
        if not build_only and built:
            results = run_all(built, work, timeout, out / "worker.log")
            for row in rows:
                found = results.get((row["seed"], row["target"]), {})
                row.update({k: v for k, v in found.items() if k not in ("seed", "target")})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for row in rows:
        text, defines, description = _program(row["seed"])
        row["description"] = description
        if row["status"] in FAILED:
            row["tl"], row["defines"] = text, defines
    report = {"seeds": seeds, "targets": targets, "sizes": SIZES,
              "rtol": RTOL, "build_only": build_only, "seconds": round(time.perf_counter() - started, 1),
              "summary": table(rows, targets), "cases": rows}
    (out / "differential_gpu.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.paged:
        os.environ[PAGED_ENV] = "1"
    if args.windowed:
        os.environ[WINDOWED_ENV] = "1"
    if args.worker:
        worker_main(args.worker)
        return 0
    if not args.build_only:
        from bench import require_cuda
        require_cuda("bench/differential_gpu.py (--build-only builds without a GPU)")
    out = Path(args.out)
    report = differential(args.seed_list, args.arch, out, jobs=args.jobs, timeout=args.timeout,
                          build_only=args.build_only)
    failed = [r for r in report["cases"] if r["status"] in FAILED]
    for row in failed:
        print(f"seed {row['seed']} {row['target']}: {row['status']}: {str(row.get('message', ''))[:200]}")
    print(f"{len(args.seed_list)} seeds, {report['seconds']:.0f} s; {out / 'differential_gpu.json'}")
    print(report["summary"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
