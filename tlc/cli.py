"""`tlc` command line: check, fmt, show, opt, interp, test, build, gen.

Every failure is a diagnostic on stderr and exit status 1; a Python traceback only
with TLC_DEBUG=1. `tlc gen` lives in the optional LLM package and is reached through
the `tlc.commands` entry point, so tlc never imports it.
"""
from __future__ import annotations

import argparse
import os
import sys
from importlib import metadata
from pathlib import Path
from typing import Callable

from tlc.diagnostics import GLOBAL_SOURCES, TlcError, error, escape_controls
from tlc.numbers import float_option, int_option, parse_int, problem, shown

MAX_INTERP_SIZE = 4096  # the CPU interpreter's float64 scores grow as Q·K per head: larger sizes take minutes


def _defines(items: list[str] | None) -> dict[str, str]:
    from tlc.frontend.params import define_items

    return define_items(items)


def _say(text: str, err: bool = False) -> None:
    """Print a message that may quote file names or values from users, control characters escaped."""
    print(escape_controls(text), file=sys.stderr if err else sys.stdout)


def _err(msg: str):
    return error(msg)


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise TlcError(_err(f"cannot read '{path}': {exc.strerror or exc}"))


def cmd_check(args) -> int:
    """The TL checks, then (unless --sketch or --no-passes) each target's lowering and CuTe emission,
    as `tlc build` runs them: for --arch, else for every target family (tlc.builder.TARGET_FAMILIES).
    Exit 1 when the TL checks fail or every target checked refuses; a refusal by some targets only is
    printed with their names and the file reported ok for the others."""
    from tlc.api import check_source
    from tlc.builder import TARGET_FAMILIES, check_target

    targets = [check_target(args.arch)] if args.arch else list(TARGET_FAMILIES)
    defines = _defines(args.define)
    status = 0
    for path in args.files:
        try:
            data = _read(path)
        except TlcError as exc:
            _say(exc.render(), err=True)
            status = 1
            continue
        res = check_source(data, path, sketch=args.sketch, defines=defines, run_passes=not args.no_passes,
                           targets=targets)
        lines = [d.render(GLOBAL_SOURCES) for d in res.diagnostics if not args.quiet or d.severity == "error"]
        lines += _target_lines(res.targets, path, args.quiet)
        if lines:
            _say("\n".join(lines), err=True)
        if not res.ok:
            status = 1
        elif not args.quiet:
            refused = [t.arch for t in res.refused]
            accepted = [t.arch for t in res.targets if t.error is None]
            _say(f"{path}: ok" + (f" for {', '.join(accepted)}; {', '.join(refused)} refuses it (above)"
                                  if refused else ""))
    return status


def _target_lines(targets, path: str, quiet: bool) -> list[str]:
    """Each target's refusals (and, unless quiet, warnings) as `tlc build` renders them, prefixed with
    the targets that say it: `sm_90a: file:line:col: error: …`; a message every target gives, once."""
    said: dict[str, list[tuple[str, str]]] = {}   # the text without its target's name → (target, text)
    for t in targets:
        diags = (t.error.diagnostics if t.error is not None else []) + ([] if quiet else t.warnings)
        for d in diags:
            text = TlcError([d]).render(GLOBAL_SOURCES, file=path)
            said.setdefault(text.replace(f"tlc build ({t.arch}): ", "tlc build: "), []).append((t.arch, text))
    return [f"{by[0][0]}: {by[0][1]}" if len(by) == 1 else f"{', '.join(a for a, _ in by)}: {text}"
            for text, by in said.items()]


def cmd_fmt(args) -> int:
    """The canonical text of a TL file, its comments (`# tlc-test:` lines too) and blank lines kept
    (tlc.frontend.format); `-i` rewrites the file in place."""
    from tlc.frontend.format import format_program
    from tlc.frontend.parser import parse_with_layout

    data = _read(args.file)
    text = format_program(*parse_with_layout(data, args.file))
    if not args.in_place:
        sys.stdout.write(text)
        return 0
    _replace_keeping_mode(Path(args.file), text)
    return 0


def _replace_keeping_mode(path: Path, text: str) -> None:
    """Atomically replace `path` (a symlink's target) with `text`, keeping its mode and, where allowed,
    its owner; a read-only file or a folder that refuses the temporary file is a one-line error, and
    the file is left as it was."""
    import contextlib
    import stat
    import tempfile

    target = path.resolve()  # os.replace on a link would swap the link for a plain file
    st = target.stat()
    mode = stat.S_IMODE(st.st_mode)
    # The bits as well as access(): root may write a file marked read-only, and os.replace would let
    # anyone who can write the folder replace a file they cannot write.
    if not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH) or not os.access(target, os.W_OK):
        raise TlcError(_err(f"{path} is read-only; not rewritten (make it writable, or run without -i to print)"))
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tlc-fmt", dir=target.parent)
    except OSError as exc:
        raise TlcError(_err(f"cannot write beside {path} ({exc.strerror or exc}); not rewritten")) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode("utf-8"))
        os.chmod(tmp, mode)
        with contextlib.suppress(OSError):  # only root may give a file away; others keep theirs anyway
            os.chown(tmp, st.st_uid, st.st_gid)
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise TlcError(_err(f"cannot rewrite {path} ({exc.strerror or exc}); left as it was")) from None


def _lowering_passes() -> set[str]:
    """The lowering passes' names (a --print-after of one of them runs the lowering)."""
    from tlc.passes.pipeline import LOWERING_PIPELINE

    return set(LOWERING_PIPELINE)


def _check_print_after(names: list[str], pipeline: str | None) -> None:
    """Every --print-after names a pass the pipeline runs: a misspelt one would print nothing."""
    from tlc.passes.pipeline import DEFAULT_PIPELINE, LOWERING_PIPELINE, parse_pipeline
    from tlc.passes.registry import lookup

    for name in names:
        if lookup(name) is None:
            raise TlcError(_err(f"--print-after {shown(name)}: no such pass; the TL passes are "
                                f"{', '.join(DEFAULT_PIPELINE)}; the lowering passes are "
                                f"{', '.join(LOWERING_PIPELINE)}"))
    run = [p.name for p in parse_pipeline(pipeline)] if pipeline is not None else DEFAULT_PIPELINE
    missing = [n for n in names if n not in run]
    if missing:
        raise TlcError(_err(f"--print-after {missing[0]}: the pipeline run here is {', '.join(run)}; add "
                            f"{missing[0]} to --pipeline or drop the --print-after"))


def cmd_show(args) -> int:
    from tlc.api import compile_graph, lower_source
    from tlc.ir.printer import print_graph

    data = _read(args.file)
    defines = _defines(args.define)
    if args.arch:
        from tlc.builder import check_target

        check_target(args.arch)
    from tlc.api import kernel_names
    names = kernel_names(data, args.file)
    if names and args.kernel is None:
        raise TlcError(_err(f"{args.file}: the program has {len(names)} kernels ({', '.join(names)}); say which to "
                            f"show with --kernel NAME (e.g. --kernel {names[0]})"))
    kernel = args.kernel if names or args.kernel else None
    if args.emit in ("kir", "cute"):
        from tlc.lowering.emit_text import emit_text

        sys.stdout.write(emit_text(data, args.file, args.arch or "sm_90", defines, args.emit,
                                   line_directives=not args.no_locs, kernel=kernel))
        return 0
    if not (args.print_after or args.print_after_all or args.pipeline or args.time_passes or args.arch):
        graph = lower_source(data, args.file, defines=defines, sketch=args.sketch, kernel=kernel)
        sys.stdout.write(print_graph(graph, with_locs=not args.no_locs))
        return 0
    pipeline = args.pipeline
    if pipeline is None and (args.arch or args.print_after_all or set(args.print_after or []) & _lowering_passes()):
        from tlc.lowering.passes import full_pipeline  # the TL passes, then the lowering for the target

        pipeline = ",".join(full_pipeline(args.arch))
    _check_print_after(args.print_after or [], pipeline)
    _, remarks = compile_graph(data, args.file, defines=defines, pipeline=pipeline, kernel=kernel,
                               print_after=set(args.print_after or []), print_after_all=args.print_after_all,
                               time_passes=args.time_passes, verify_each=not args.no_verify_each)
    for d in remarks:
        _say(d.render(GLOBAL_SOURCES), err=True)
    return 0


def cmd_opt(args) -> int:
    """Kernel-IR transforms on kernel-IR text (tlc.kir.transforms.opt); FILE '-' reads stdin."""
    from tlc.kir.transforms.opt import run_opt

    data = sys.stdin.buffer.read() if args.file == "-" else _read(args.file)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TlcError(_err(f"{args.file}: not UTF-8 text (byte {exc.start})")) from None
    sys.stdout.write(run_opt(text, args.file, args.passes, args.schedule or [], args.arch, args.fact or []))
    return 0


DEFAULT_INTERP_SIZES = ((17, 33), (1, 1), (70, 9), (1, 65))  # odd, unequal, single-row and ragged tails


def cmd_interp(args) -> int:
    """Interpret the program at a few sizes against its oracle (tlc.testing.oracle): --reference, else its
    Variant's float64 reference, else the program as written — a program without a Variant is never read
    as attention."""
    import math

    from tlc.api import compile_graph
    from tlc.frontend.ast import eval_expr
    from tlc.testing.checks import Shapes, check_against, program_info
    from tlc.testing.oracle import oracle_for

    data = _read(args.file)
    defines = _defines(args.define)
    sizes = _interp_sizes(args.sizes) if args.sizes else DEFAULT_INTERP_SIZES
    from tlc.api import kernel_names
    if kernel_names(data, args.file):
        return _interp_module(args, data, defines, sizes)
    # The program the compiler builds: the repair passes run unless --no-passes asks for the raw meaning.
    graph, remarks = compile_graph(data, args.file, defines=defines, run_passes=not args.no_passes)
    oracle = oracle_for(lambda: compile_graph(data, args.file, defines=defines, run_passes=False)[0], args.reference)
    info = program_info(graph)
    if args.sizes:
        _check_size_counts(args.sizes, sizes, info.int_inputs)
    for d in remarks:
        _say(d.render(GLOBAL_SOURCES), err=True)
    _say(f"{args.file}: checked against: {oracle.label}")
    if args.no_passes and oracle.as_written is not None:
        _say(f"{args.file}: note: with --no-passes the program as written is compared with itself, so this only "
             "runs it; drop --no-passes to check what tlc builds, or give --reference", err=True)
    params = {k: v for k, v in graph.params.items() if isinstance(v, int) and not isinstance(v, bool)}
    tiles = [t for t in info.tensors if len(t.dims) == 2]   # a vector has no columns to scale by
    d = int(eval_expr(tiles[0].dims[-1], params)) if tiles else 1
    worst = 0.0
    for i, pair in enumerate(sizes):
        shapes = Shapes(batch=2, heads=4, kv_heads=2, ints=dict(zip(info.int_inputs, pair)),
                        floats={n: 1.0 / math.sqrt(d) for n in info.float_inputs})
        r = check_against(graph, oracle, shapes, seed=args.seed + i, rtol=args.tolerance)
        where = f" at (batch, head, row) = {r.where}" if r.where else ""
        _say(f"{args.file}: {shapes.describe()}: max relative error {r.max_error:.3e}{where}"
             + (f" ({r.message})" if r.message else ""))
        worst = max(worst, r.max_error)
    if worst > args.tolerance:
        _say(f"{args.file}: error: max relative error {worst:.3e} exceeds {args.tolerance:g}", err=True)
        return 1
    return 0


def _interp_module(args, data: bytes, defines: dict, sizes) -> int:
    """`tlc interp` of a program of several kernels: the kernels in order after the passes, against the program
    as written (such a program has no Variant; --reference is refused)."""
    import math

    from tlc.api import compile_module
    from tlc.testing.checks import Shapes, program_info
    from tlc.testing.module_checks import check_module

    if args.reference:
        raise TlcError(_err(f"{args.file}: --reference takes a one-kernel program; a program of several kernels is "
                            "checked against itself as written"))
    module, remarks = compile_module(data, args.file, defines=defines, run_passes=not args.no_passes)
    written, _ = compile_module(data, args.file, defines=defines, run_passes=False)
    for d in remarks:
        _say(d.render(GLOBAL_SOURCES), err=True)
    ints, floats = [], []
    for g in module.graphs:
        info = program_info(g)
        ints += [n for n in info.int_inputs if n not in ints]
        floats += [n for n in info.float_inputs if n not in floats]
    if args.sizes:
        _check_size_counts(args.sizes, sizes, tuple(ints))
    _say(f"{args.file}: {len(module.kernels)} kernels ({', '.join(n for n, _ in module.kernels)}), checked against: "
         "the program as written")
    worst = 0.0
    for i, pair in enumerate(sizes):
        shapes = Shapes(batch=2, heads=4, kv_heads=2, ints=dict(zip(ints, pair)), floats={n: 0.125 for n in floats})
        r = check_module(module, written, shapes, seed=args.seed + i, rtol=args.tolerance)
        where = f" at (batch, head, row) = {r.where}" if r.where else ""
        _say(f"{args.file}: {shapes.describe()}: max relative error {r.max_error:.3e}{where}"
             + (f" ({r.message})" if r.message else ""))
        worst = max(worst, r.max_error)
    if worst > args.tolerance or math.isnan(worst):
        _say(f"{args.file}: error: max relative error {worst:.3e} exceeds {args.tolerance:g}", err=True)
        return 1
    return 0


def _interp_sizes(text: str) -> tuple[tuple[int, ...], ...]:
    """`--sizes 17x33,1x1`: sizes of `x`-separated numbers, each from 1 to MAX_INTERP_SIZE."""
    try:
        return tuple(tuple(parse_int(x, f"--sizes {shown(text)}", minimum=1, maximum=MAX_INTERP_SIZE)
                           for x in size.strip().split("x")) for size in text.split(","))
    except TlcError as exc:
        raise TlcError(_err(problem(exc))) from None


def _check_size_counts(text: str, sizes: tuple[tuple[int, ...], ...], int_inputs: tuple[str, ...]) -> None:
    """Each size gives one number per int Input of the program, in declaration order: a size with more
    or fewer would drop numbers or leave an Input unset."""
    if not int_inputs:
        raise TlcError(_err(f"--sizes {shown(text)}: the program has no int Input for a size to set; drop --sizes"))
    example = "x".join(str(n) for n in (17, 33, 9, 65, 5, 7, 11, 13)[:len(int_inputs)])
    for size in sizes:
        if len(size) != len(int_inputs):
            written = "x".join(map(str, size))
            raise TlcError(_err(f"--sizes {written}: {len(size)} number(s), but the program has {len(int_inputs)} "
                                f"int Input(s) ({', '.join(int_inputs)}); give one per Input, e.g. {example}"))


def cmd_test(args) -> int:
    from tlc.api import kernel_names
    from tlc.testing.runner import run_tl_test

    names = kernel_names(_read(args.file), args.file)
    if names:
        raise TlcError(_err(f"{args.file}: the program has {len(names)} kernels ({', '.join(names)}); tlc test takes a "
                            "one-kernel program: `tlc interp` checks this one against itself as written"))

    return run_tl_test(args.file, examples=args.examples, seed=args.seed, gpu=args.gpu, arch=args.arch,
                       defines=_defines(args.define), reference=args.reference, max_len=args.max_len)


def cmd_build(args) -> int:
    from tlc.builder import build_files, check_target

    check_target(args.arch)
    return build_files(args.files, arch=args.arch, out_dir=args.output, defines=_defines(args.define),
                       jobs=args.jobs)


def cmd_precompile(args) -> int:
    """TL files build for `--arch` (default sm_90, as `tlc build`); a shape list for `--arch`, by default for
    the targets `tlc.attention` picks on this machine (sm_90a on an H100/H200)."""
    if not args.files and not args.shapes:
        raise TlcError(_err("tlc precompile: give TL files, --shapes LIST, or both"))
    if args.define and not args.files:
        raise TlcError(_err("tlc precompile: -D applies to TL files; a shape list picks tlc.attention's own bindings"))
    from tlc.builder import check_target
    from tlc.attention.precompile import Job, default_targets, precompile, read_shape_file

    for arch in args.arch or []:
        check_target(arch)
    defines = _defines(args.define)
    jobs = [one for f in args.files for arch in args.arch or ["sm_90"]
            for one in Job.make(Path(f), defines, arch, label=f).per_kernel()]
    for shapes in args.shapes or []:
        jobs += read_shape_file(shapes, args.arch or default_targets())
    return precompile(jobs, args.jobs)


def _plugin(name: str) -> Callable[[list[str]], int] | None:
    try:
        eps = metadata.entry_points(group="tlc.commands")
    except Exception:
        return None
    for ep in eps:
        if ep.name == name:
            return ep.load()
    return None


class _Parser(argparse.ArgumentParser):
    """argparse, with the values it quotes in its errors escaped (a control byte in an argument would
    otherwise reach the terminal raw)."""

    def error(self, message: str):  # type: ignore[override]
        super().error(escape_controls(message))


MAX_JOBS = 1024
REFERENCE_HELP = ("compare with your float64 reference instead: a function imported from the current directory "
                  "or sys.path, called with the input tensors (batch, heads, rows, cols) and the Inputs by keyword, "
                  "returning the output (default: the Variant's reference; without a Variant, the program as "
                  "written, before the passes)")
SEED = int_option(maximum=2**32 - 1)


def make_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="tlc", description="Compile LLM-TL attention programs to CuTe kernels.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    def common(sp, define=True):
        if define:
            sp.add_argument("-D", dest="define", action="append", metavar="NAME=VALUE",
                            help="bind a Param (repeatable)")
        return sp

    sp = common(sub.add_parser("check", help="report diagnostics only; exit 1 on error"))
    sp.add_argument("files", nargs="+", metavar="FILE")
    sp.add_argument("--sketch", action="store_true", help="accept a sketch: open params, no shapes")
    sp.add_argument("--no-passes", action="store_true", help="frontend checks only")
    sp.add_argument("--arch", help="check what `tlc build --arch ARCH` would refuse (default: every target family, "
                    "sm_90 for the sm_80 family and sm_90a; exit 1 when all refuse)")
    sp.add_argument("-q", "--quiet", action="store_true")
    sp.set_defaults(fn=cmd_check)

    sp = sub.add_parser("fmt", help="print the canonical form of a TL file")
    sp.add_argument("file", metavar="FILE")
    sp.add_argument("-i", "--in-place", action="store_true", help="rewrite the file")
    sp.add_argument("--force", action="store_true", help=argparse.SUPPRESS)  # once needed to drop comments
    sp.set_defaults(fn=cmd_fmt)

    sp = common(sub.add_parser("show", help="print the TL graph (optionally after passes)"))
    sp.add_argument("file", metavar="FILE")
    sp.add_argument("--print-after", action="append", metavar="PASS")
    sp.add_argument("--print-after-all", action="store_true")
    sp.add_argument("--pipeline", help="comma-separated passes, e.g. 'verify,infer-shapes'")
    sp.add_argument("--time-passes", action="store_true")
    sp.add_argument("--no-verify-each", action="store_true", help="skip the structural verifier between passes")
    sp.add_argument("--no-locs", action="store_true", help="omit loc(line:col)")
    sp.add_argument("--sketch", action="store_true")
    sp.add_argument("--arch", help="run the lowering passes for this target too (default with "
                    "--print-after of a lowering pass or --emit: sm_90)")
    sp.add_argument("--emit", choices=("tl", "kir", "cute"), default="tl",
                    help="what to print: the TL graph (default), the kernel IR after the lowering passes, or the "
                    "CuTe C++ (no NVRTC; --no-locs drops the #line directives)")
    sp.add_argument("--kernel", metavar="NAME", help="which kernel of a program of several (`Kernel NAME` lines)")
    sp.set_defaults(fn=cmd_show)

    sp = sub.add_parser("opt", help="run kernel-IR transforms on kernel-IR text and print the result")
    sp.add_argument("file", metavar="FILE", help="kernel-IR text (tlc show --emit kir, --print-after); - for stdin")
    sp.add_argument("--pass", dest="passes", required=True, metavar="PASSES",
                    help="comma-separated transforms with options, e.g. 'insert-sync,pipeline{stages=1}'")
    sp.add_argument("--schedule", action="append", metavar="NAME=VALUE",
                    help="a schedule knob by its Param name, e.g. Stages=3 (repeatable)")
    sp.add_argument("--arch", help="the target (default: sm_90a for an Sm90KernelOp, else sm_90)")
    sp.add_argument("--fact", action="append", metavar="NAME=WHY",
                    help="a precondition the TL graph would disprove (stale-max, masked-trips) and why; "
                    "not given, it holds")
    sp.set_defaults(fn=cmd_opt)

    sp = common(sub.add_parser("interp", help="run on random inputs at a few sizes against the program's float64 reference"))
    sp.add_argument("file", metavar="FILE")
    sp.add_argument("--sizes", help="one number per int Input, x-separated, for each size: QxK pairs for "
                    "attention, e.g. 17x33,1x1 (default: a set of odd sizes)")
    sp.add_argument("--seed", type=SEED, default=0)
    sp.add_argument("--tolerance", type=float_option(minimum=0.0), default=1e-6)
    sp.add_argument("--passes", action="store_true", help="(the default) interpret what the compiler builds: after "
                    "the TL passes, whose repairs are printed")
    sp.add_argument("--no-passes", action="store_true", help="interpret the program as written, before any repair")
    sp.add_argument("--reference", metavar="MODULE:FUNCTION", help=REFERENCE_HELP)
    sp.set_defaults(fn=cmd_interp)

    sp = common(sub.add_parser("test", help="hypothesis property tests of a TL program"))
    sp.add_argument("file", metavar="FILE")
    sp.add_argument("--examples", type=int_option(minimum=1, maximum=1_000_000), default=100)
    sp.add_argument("--seed", type=SEED, default=0)
    sp.add_argument("--gpu", action="store_true", help="also build and run the kernel")
    sp.add_argument("--arch", default=None, help="with --gpu: target (default: the visible GPU's)")
    sp.add_argument("--reference", metavar="MODULE:FUNCTION", help=REFERENCE_HELP)
    sp.add_argument("--max-len", type=int_option(minimum=1, maximum=MAX_INTERP_SIZE), metavar="N",
                    help="the longest sequence length drawn (default: eight tiles of the largest tile, and one); "
                    "1, a tile ± 1 and two, four and eight tiles are drawn too")
    sp.set_defaults(fn=cmd_test)

    sp = common(sub.add_parser("build", help="compile TL files to .cu, .cubin and .json"))
    sp.add_argument("files", nargs="+", metavar="FILE")
    sp.add_argument("--arch", default="sm_90", help="sm_80, sm_86, sm_89, sm_90 (default) or sm_90a")
    sp.add_argument("-o", "--output", default="build", metavar="DIR")
    sp.add_argument("-j", "--jobs", type=int_option(maximum=MAX_JOBS), default=0,
                    help="parallel builds (default: CPU count)")
    sp.set_defaults(fn=cmd_build)

    sp = common(sub.add_parser("precompile", help="fill the kernel cache ahead of time (no artifacts)"))
    sp.add_argument("files", nargs="*", metavar="FILE")
    sp.add_argument("--shapes", action="append", metavar="LIST",
                    help="a file of tlc.attention call shapes, one per line, e.g. "
                    "'b=4 hq=32 hkv=8 sq=4096 sk=4096 d=128 causal dtype=bf16' (repeatable; see "
                    "tlc/attention/shapes.py)")
    sp.add_argument("--arch", action="append", help="repeatable; default: sm_90 for TL files (as tlc build), "
                    "the targets tlc.attention picks on this machine for --shapes (sm_90a on an H100/H200)")
    sp.add_argument("-j", "--jobs", type=int_option(maximum=MAX_JOBS), default=0,
                    help="parallel compiles (default: CPU count)")
    sp.set_defaults(fn=cmd_precompile)

    sub.add_parser("gen", help="LLM workflow: request → TL → kernel (needs the tlc_llm package)", add_help=False)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "gen":
        fn = _plugin("gen")
        if fn is None:
            print("tlc: error: 'tlc gen' needs the LLM workflow package (tlc_llm); install tlc with it "
                  "(pip install -e .)", file=sys.stderr)
            return 1
        return int(fn(argv[1:]) or 0)
    parser = make_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "fn", None):
        parser.print_help()
        return 1
    try:
        return int(args.fn(args) or 0)
    except TlcError as exc:
        _say(exc.render(GLOBAL_SOURCES), err=True)
        return 1
    except KeyboardInterrupt:
        print("tlc: interrupted", file=sys.stderr)
        return 130
    except RecursionError:
        print("tlc: error: the program nests too deeply to process", file=sys.stderr)
        return 1
    except Exception as exc:  # the promise: no tracebacks for users
        if os.environ.get("TLC_DEBUG"):
            raise
        _say(f"tlc: internal error: {type(exc).__name__}: {exc} (rerun with TLC_DEBUG=1 for a traceback, "
             "and please report it)", err=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
