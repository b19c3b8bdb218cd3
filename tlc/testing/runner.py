"""`tlc test FILE.tl`: hypothesis-driven property test of one TL program.

For each generated shape it interprets the program before and after the TL pass pipeline and
compares both with the program's oracle (tlc.testing.oracle): the user's `--reference`, else the
float64 reference of its `Param Variant`, else the program as written (so what is tested is that the
passes keep its meaning). A failure is shrunk, printed with its max error and where (batch, head,
row), blamed on the first pass after which the result is wrong, and given a one-line replay
command. Deterministic for a seed.
"""
from __future__ import annotations

import argparse
import math
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from tlc.diagnostics import GLOBAL_SOURCES, TlcError, escape_controls, fail
from tlc.frontend import ast as A
from tlc.frontend.lower import lower_program
from tlc.frontend.parser import parse_file
from tlc.ir.graph import Graph
from tlc.numbers import INT32_MAX, int_option, parse_float, parse_int
from tlc.testing.checks import CheckResult, Shapes, check_against
from tlc.testing.oracle import Oracle, Reference, ReferenceProblem, oracle_for
from tlc.testing.strategies import attention_shapes, default_max_len

MAX_LEN = 4096  # the CPU interpreter's float64 scores grow as Q·K per head: longer lengths take minutes
GPU_VARIANTS = ("attention", "b2b_gemm")  # the references tlc.testing.gpu_check compares a kernel with

Out = Callable[[str], None]


@dataclass
class Stage:
    """The program after `passes` (the first N of the pipeline) — rebuilt from the AST on
    demand, since passes rewrite the graph and refine value types in place."""

    passes: tuple[str, ...]
    graph: Graph


@dataclass
class Plan:
    ast: A.Program
    defines: dict[str, str]
    pipeline: list[str]
    available: list[str] = field(default_factory=list)   # the prefix of the pipeline that could run
    notes: list[str] = field(default_factory=list)
    oracle: Oracle | None = None                          # what every stage is compared with

    def lower(self) -> Graph:
        return lower_program(self.ast, dict(self.defines))

    def stage(self, n: int) -> Stage:
        graph = self.lower()
        names = self.available[:n]
        if names:
            from tlc.passes.pipeline import run_pipeline

            run_pipeline(graph, list(names))
        return Stage(tuple(names), graph)


def _normalise_defines(defines: Mapping[str, Any] | Sequence[str] | None) -> dict[str, str]:
    """A mapping (checked as tlc.build checks it) or `NAME=VALUE` words (checked as -D is)."""
    if not defines:
        return {}
    if isinstance(defines, Mapping):
        from tlc.runtime import normal_defines

        return normal_defines(defines)
    from tlc.frontend.params import define_items

    return define_items([str(item) for item in defines])


def _print(text: str) -> None:
    print(escape_controls(text), flush=True)


def _default_pipeline() -> list[str]:
    try:
        from tlc.passes.pipeline import DEFAULT_PIPELINE
    except ImportError:
        return []
    return list(DEFAULT_PIPELINE)


def _probe_passes(plan: Plan, out: Out) -> int | None:
    """Find the runnable prefix of the pipeline; a pass that rejects or crashes on the
    program is a failure (exit code 1), a pass not written yet only shortens the prefix."""
    from tlc.passes.registry import lookup

    for name in plan.pipeline:
        try:
            cls = lookup(name)
        except (ImportError, AttributeError) as exc:
            plan.notes.append(f"pass '{name}' is not available ({type(exc).__name__}: {exc}); checking the "
                              f"program before passes and after [{', '.join(plan.available) or 'no passes'}] only")
            return None
        if cls is None:
            plan.notes.append(f"pass '{name}' is not registered; checked up to the pass before it")
            return None
        plan.available.append(name)
        try:
            plan.stage(len(plan.available))
        except TlcError as exc:
            out(f"{plan.ast.file}: error: pass '{name}' rejected the program:\n{exc.render(GLOBAL_SOURCES)}")
            return 1
        except Exception as exc:  # a crashing pass is a bug to name, not a traceback to show
            out(f"{plan.ast.file}: error: pass '{name}' crashed: {type(exc).__name__}: {exc}")
            return 1
    return None


def _replay_command(plan: Plan, shapes: Shapes, seed: int) -> str:
    defs = " ".join(f"-D {k}={v}" for k, v in plan.defines.items())
    parts = ["python -m tlc.testing.runner", shlex.quote(plan.ast.file)]
    if defs:
        parts.append(defs)
    oracle = plan.oracle
    if oracle is not None and oracle.function is not None:  # the same oracle, or the replay checks something else
        parts += ["--reference", shlex.quote(oracle.replay) if oracle.replay else "MODULE:FUNCTION"]
    parts += ["--replay", shlex.quote(f"{shapes.replay_text()},seed={seed}")]
    return " ".join(parts)


def check_all_stages(plan: Plan, shapes: Shapes, seed: int) -> tuple[str | None, CheckResult, list[str]]:
    """Check the program before the passes and after each against the plan's oracle; returns (blamed
    stage, result, log).

    The verdict is the last stage's: that is what tlc builds, so a program as written that the passes
    repair is not a failure. A wrong last stage is blamed on the pass after the last right stage, or on
    the program itself when no stage was right. A fault of the user's reference is raised."""
    assert plan.oracle is not None
    log, results = [], []
    for n in range(len(plan.available) + 1):
        stage = plan.stage(n)
        label = "before passes" if n == 0 else f"after {stage.passes[-1]}"
        layouts = None if n < len(plan.available) or "insert-reshape" not in stage.passes else True
        result = check_against(stage.graph, plan.oracle, shapes, seed, check_layouts=layouts)
        log.append(f"{label}: {'ok' if result.ok else result.describe()}")
        results.append(result)
    built = results[-1]
    if built.ok:
        return None, built, log
    right = [n for n, r in enumerate(results) if r.ok]
    return (f"pass '{plan.available[right[-1]]}'" if right else "the program itself"), built, log


@dataclass
class _Failure:
    shapes: Shapes
    seed: int
    gpu: CheckResult | None = None              # the kernel's result, when it is the kernel that failed
    reference: ReferenceProblem | None = None   # the user's reference could not be compared with


class _Counterexample(Exception):
    """Raised from one place for every kind of failure, so hypothesis shrinks them as one."""


def run_tl_test(path: str | Path, examples: int = 100, seed: int = 0, gpu: bool = False, arch: str | None = None,
                defines: Mapping[str, Any] | Sequence[str] | None = None, *, out: Out | None = None,
                pipeline: Sequence[str] | None = None, reference: Reference | str | None = None,
                max_len: int | None = None) -> int:
    """Property-test the TL program at `path`; returns the exit code (0 pass, 1 fail).

    `reference`: a callable or `module:function` (tlc.testing.oracle) to check against instead of the
    Variant's reference or the program as written; `max_len`: the longest sequence length drawn
    (default: tlc.testing.strategies.default_max_len, eight tiles of the largest tile and one more)."""
    say: Out = out or _print
    try:
        defs = _normalise_defines(defines)
        ast = parse_file(path)
        as_written = lower_program(ast, dict(defs))
        oracle = oracle_for(lambda: lower_program(ast, dict(defs)), reference)
    except TlcError as exc:
        say(exc.render(GLOBAL_SOURCES, file=str(path)))
        return 1
    if max_len is not None and not 1 <= max_len <= MAX_LEN:
        say(f"{ast.file}: error: --max-len {max_len} is out of range; it must be from 1 to {MAX_LEN}")
        return 1
    longest = max_len if max_len is not None else min(default_max_len(as_written), MAX_LEN)
    plan = Plan(ast, defs, list(pipeline) if pipeline is not None else _default_pipeline(), oracle=oracle)
    code = _probe_passes(plan, say)
    if code is not None:
        return code
    for note in plan.notes:
        say(f"{ast.file}: note: {note}")
    gpu_check = _gpu_check(plan, path, arch, say) if gpu else None
    stages = [plan.stage(0).graph, plan.stage(len(plan.available)).graph] if plan.available else [plan.stage(0).graph]
    stage0_is_oracle = oracle.as_written is not None  # the program as written: no repair to report
    failures: list[_Failure] = []
    repaired: list[Shapes] = []
    layouts = True if len(stages) > 1 and "insert-reshape" in plan.available else None

    def first_failure(shapes: Shapes, data_seed: int) -> _Failure | None:
        # The verdict is on the program the compiler builds (after the passes); the program as written
        # is checked too, so a disagreement the passes repair is reported with the repairs it relied on.
        try:
            if not check_against(stages[-1], oracle, shapes, data_seed, check_layouts=layouts).ok:
                return _Failure(shapes, data_seed)
            if (len(stages) > 1 and not stage0_is_oracle and not repaired
                    and not check_against(stages[0], oracle, shapes, data_seed).ok):
                repaired.append(shapes)
        except ReferenceProblem as exc:
            return _Failure(shapes, data_seed, reference=exc)
        if gpu_check is not None:
            result = gpu_check(shapes, data_seed)
            if not result.ok:
                return _Failure(shapes, data_seed, gpu=result)
        return None

    @hypothesis_seed(seed)
    @settings(max_examples=examples, deadline=None, database=None, derandomize=False, print_blob=False,
              suppress_health_check=list(HealthCheck), phases=(Phase.generate, Phase.shrink))
    @given(shapes=attention_shapes(stages[0], max_len=longest), data_seed=st.integers(0, 2**16))
    def prop(shapes: Shapes, data_seed: int) -> None:
        failure = first_failure(shapes, data_seed)
        if failure is not None:
            failures[:] = [failure]   # hypothesis replays the shrunk example last
            raise _Counterexample()

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiles are small: threads only add overhead
    try:
        prop()
    except _Counterexample:
        pass
    finally:
        torch.set_num_threads(threads)
    if not failures:
        _report_pass(plan, path, examples, longest, repaired, gpu_check is not None, say)
        return 1 if gpu and gpu_check is None else 0
    failure = failures[0]
    if failure.reference is not None:
        say(f"{ast.file}: error: {failure.reference.message} (at {failure.shapes.describe()} seed={failure.seed})")
        return 1
    if failure.gpu is not None:
        say(f"{ast.file}: FAIL: the GPU kernel differs from the float64 reference ({failure.gpu.message})")
        say(f"  counterexample (shrunk): {failure.shapes.describe()} seed={failure.seed}")
        say(f"  replay: {_replay_command(plan, failure.shapes, failure.seed)} --gpu")
        return 1
    return _report_failure(plan, failure.shapes, failure.seed, say)


def _gpu_check(plan: Plan, path: str | Path, arch: str | None, say: Out):
    """The kernel checker for --gpu, or None with the reason printed (the CPU checks still run)."""
    from tlc.testing.gpu_check import gpu_problem, make_gpu_check

    assert plan.oracle is not None
    known = plan.oracle.variant in GPU_VARIANTS or plan.oracle.as_written is not None or plan.oracle.function
    if not known:
        problem = (f"the kernel is compared with the {' or '.join(GPU_VARIANTS)} reference, the program as written "
                   f"or your --reference, and this program is checked against {plan.oracle.label}; run without --gpu")
    else:
        problem = gpu_problem(arch)
    if problem is None:
        try:
            return make_gpu_check(path, plan.stage(0).graph, plan.defines, arch, plan.oracle)
        except TlcError as exc:
            problem = f"the kernel does not build:\n{exc.render(GLOBAL_SOURCES)}"
    say(f"{plan.ast.file}: error: --gpu: {problem}; the CPU checks still run below")
    return None


def _report_pass(plan: Plan, path: str | Path, examples: int, longest: int, repaired: list[Shapes], gpu: bool,
                 say: Out) -> None:
    assert plan.oracle is not None
    passes = f"{len(plan.available)} passes ({', '.join(plan.available)})"
    if plan.oracle.as_written is not None:
        what = f"the interpreter after {passes}" if plan.available else \
            "the interpreter before passes (no pass ran: the program was compared with itself)"
    elif repaired:
        what = f"the interpreter after {passes}"
        say(f"{plan.ast.file}: note: the program as written differs from {plan.oracle.label} (e.g. at "
            f"{repaired[0].describe()}); tlc builds it after these repairs:")
        for remark in _repairs(path, plan.defines):
            say(f"  {remark}")
    else:
        what = f"the interpreter before and after {passes}" if plan.available else "the interpreter before passes"
    kernel = " and the GPU kernel within docs/correctness.md's tolerance" if gpu else ""
    say(f"{plan.ast.file}: ok: {examples} examples (lengths 1 to {longest}), checked against: {plan.oracle.label}; "
        f"{what}{kernel}")


def _repairs(path: str | Path, defines: Mapping[str, str]) -> list[str]:
    """The remarks of the TL pipeline for `path`: what the passes changed in the program."""
    from tlc.api import compile_graph

    _, remarks = compile_graph(Path(path).read_bytes(), str(path), defines=defines)
    return [d.render(GLOBAL_SOURCES).splitlines()[0] for d in remarks]


def _report_failure(plan: Plan, shapes: Shapes, data_seed: int, say: Out) -> int:
    assert plan.oracle is not None
    file = plan.ast.file
    try:
        blamed, result, log = check_all_stages(plan, shapes, data_seed)
    except ReferenceProblem as exc:
        say(f"{file}: error: {exc.message} (at {shapes.describe()} seed={data_seed})")
        return 1
    say(f"{file}: FAIL: interpreter differs from {plan.oracle.label}; broken by {blamed or 'an unknown stage'}")
    say(f"  checked against: {plan.oracle.label}")
    say(f"  counterexample (shrunk): {shapes.describe()} dtype=float64 seed={data_seed}")
    err = "inf (NaN or error)" if math.isinf(result.max_error) else f"{result.max_error:.3e}"
    say(f"  max relative error {err} (bound 1e-6)" + (f" at batch {result.where[0]}, head {result.where[1]}, "
                                                       f"row {result.where[2]}" if result.where else ""))
    if result.message:
        say(f"  {result.message}")
    for line in log:
        say(f"    {line}")
    say(f"  replay: {_replay_command(plan, shapes, data_seed)}")
    return 1


def replay(path: str | Path, replay_text: str, defines: Mapping[str, Any] | Sequence[str] | None = None,
           *, out: Out | None = None, gpu: bool = False, arch: str | None = None,
           reference: Reference | str | None = None) -> int:
    """Re-run one counterexample printed by `run_tl_test`, through every stage, against the same oracle."""
    say: Out = out or _print
    try:
        defs = _normalise_defines(defines)
        shapes, data_seed = replay_shapes(replay_text)
        ast = parse_file(path)
        plan = Plan(ast, defs, _default_pipeline(), oracle=oracle_for(lambda: lower_program(ast, dict(defs)), reference))
    except TlcError as exc:
        say(exc.render(GLOBAL_SOURCES, file=str(path)))
        return 1
    code = _probe_passes(plan, say)
    if code is not None:
        return code
    try:
        blamed, result, log = check_all_stages(plan, shapes, data_seed)
    except ReferenceProblem as exc:
        say(f"{plan.ast.file}: error: {exc.message} (at {shapes.describe()} seed={data_seed})")
        return 1
    if blamed is None and gpu:
        gpu_check = _gpu_check(plan, path, arch, say)
        if gpu_check is None:
            return 1
        gpu_result = gpu_check(shapes, data_seed)
        log.append(f"GPU kernel: {'ok' if gpu_result.ok else 'FAIL'} ({gpu_result.message})")
        if not gpu_result.ok:
            say(f"{plan.ast.file}: FAIL on the GPU at {shapes.describe()} seed={data_seed}")
            for line in log:
                say(f"    {line}")
            return 1
    if blamed is None:
        assert plan.oracle is not None
        say(f"{plan.ast.file}: ok at {shapes.describe()} seed={data_seed}, checked against: {plan.oracle.label}")
        for line in log:
            say(f"    {line}")
        if not log[0].endswith(": ok"):
            say(f"{plan.ast.file}: note: the program as written differs; tlc builds it after these repairs:")
            for remark in _repairs(path, defs):
                say(f"  {remark}")
        return 0
    return _report_failure(plan, shapes, data_seed, say)


def replay_shapes(text: str) -> tuple[Shapes, int]:
    """A printed counterexample (`batch=1,heads=2,kv_heads=1,seqlen_q=3,scale=0.5,seed=7`) → (shapes, seed),
    each number read by tlc.numbers: sizes from 1 (0 for the seed), a whole number for an int Input."""
    shapes, seed = Shapes(), 0
    for item in filter(None, (t.strip() for t in text.split(","))):
        key, eq, raw = item.partition("=")
        what = f"--replay {key.strip()}"
        if not eq or not key.strip():
            raise fail(f"--replay: '{item}' is not name=value; replay the line tlc test printed")
        key = key.strip()
        if key == "seed":
            seed = parse_int(raw, what, maximum=2**32 - 1)
        elif key in ("batch", "heads", "kv_heads"):
            setattr(shapes, key, parse_int(raw, what, minimum=1, maximum=INT32_MAX))
        elif raw.strip().lstrip("+-").isdigit():
            shapes.ints[key] = parse_int(raw, what, minimum=1, maximum=INT32_MAX)
        else:
            shapes.floats[key] = parse_float(raw, what)
    return shapes, seed


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m tlc.testing.runner`: `tlc test`'s options (tlc/cli.py), and --replay."""
    p = argparse.ArgumentParser(prog="python -m tlc.testing.runner",
                                description="Property-test a TL program against its reference.")
    p.add_argument("file")
    p.add_argument("--examples", type=int_option(minimum=1, maximum=1_000_000), default=100)
    p.add_argument("--seed", type=int_option(maximum=2**32 - 1), default=0)
    p.add_argument("--gpu", action="store_true")
    p.add_argument("--arch", default=None, help="default: the visible GPU's")
    p.add_argument("--reference", metavar="MODULE:FUNCTION", help="as `tlc test --reference`")
    p.add_argument("--max-len", type=int_option(minimum=1, maximum=MAX_LEN), default=None, metavar="N")
    p.add_argument("-D", dest="define", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--replay", metavar="SHAPES", help="re-run one printed counterexample")
    args = p.parse_args(argv)
    if args.replay:
        return replay(args.file, args.replay, args.define, gpu=args.gpu, arch=args.arch, reference=args.reference)
    return run_tl_test(args.file, args.examples, args.seed, args.gpu, args.arch, args.define,
                       reference=args.reference, max_len=args.max_len)


if __name__ == "__main__":
    sys.exit(main())
