"""`tlc build`: TL file → TL passes → lowering passes (kernel IR) → CuTe → NVRTC → artifacts.

Writes `<stem>.cu`, `<stem>.cubin` and `<stem>.json` (versioned schema: launch ABI, grid
formula, shared memory, registers and spills, arch, versions). Needs no GPU. Several files
build in parallel processes; an existing artifact is replaced atomically. `check_targets` runs
every check a build runs short of NVRTC, for `tlc check`.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from tlc.diagnostics import GLOBAL_SOURCES, Diagnostic, Loc, TlcError, escape_controls, fail
from tlc.names import kernel_name
from tlc.numbers import a_kind, shown

__version__ = "0.1.0"

# What `tlc check` lowers for without --arch: the sm_80 family (compiled as sm_90, as `tlc build`'s
# default) and the Hopper path; the other sm_80-family targets differ only in the arch table's limits.
TARGET_FAMILIES = ("sm_90", "sm_90a")


def _atomic_write(path: Path, data: bytes) -> None:
    """A build output, written whole through a fresh temporary file with the permissions the user's umask
    gives a new file (kernel-cache entries stay 0600)."""
    from tlc.backend_cute.cache import atomic_write

    mask = os.umask(0)
    os.umask(mask)
    atomic_write(path, data, mode=0o666 & ~mask)


def check_target(arch: object, what: str = "--arch") -> str:
    """`arch` if it names a target of `tlc.arch`, else a one-line TlcError naming `what`."""
    from tlc.arch import ARCHES

    if not isinstance(arch, str):
        raise fail(f"{what} must be a target name such as 'sm_90' or 'sm_90a', not {a_kind(arch)}")
    if arch not in ARCHES:
        raise fail(f"{what}: unknown target '{shown(arch)}'; tlc knows {', '.join(ARCHES)} (sm_80 family: "
                   "mma.sync, cp.async, ldmatrix; sm_90a: the Hopper wgmma/TMA path)")
    return arch


PATH_SHOWN = 400  # characters of a file name quoted in a message (a long one-line string may be no name at all)
_STATEMENT_START = re.compile(r"\s*(param|input|allocate|copy|compute|reshape|for)\b", re.IGNORECASE)


def read_program(path_or_text: str | os.PathLike | bytes) -> tuple[bytes, str]:
    """(source, name) of a TL program given as a file or as text. A `pathlib.Path` (any os.PathLike) is a
    file. bytes are TL text. A str is TL text when it holds a newline; else a file when it names an existing
    one (any extension: `kernel.TL` too); else TL text when it starts with a statement word (`Param`,
    `Input`, `Allocate`, `Copy`, `Compute`, `Reshape`, `for`); anything else is taken as a file name that
    does not exist, a one-line error."""
    if isinstance(path_or_text, (bytes, bytearray)):
        return bytes(path_or_text), "<text>"
    if isinstance(path_or_text, str) and ("\n" in path_or_text or (
            not _is_file(path_or_text) and _STATEMENT_START.match(path_or_text))):
        return path_or_text.encode("utf-8", "surrogatepass"), "<text>"
    if not isinstance(path_or_text, (str, os.PathLike)):
        raise fail(f"a TL program is a .tl file path (str or pathlib.Path) or TL text, not {a_kind(path_or_text)}")
    p = Path(path_or_text)
    if not os.path.exists(p):
        hint = (" (a string without a newline that does not start with a TL statement names a file)"
                if isinstance(path_or_text, str) else "")
        raise fail(f"cannot read '{shown(str(p), PATH_SHOWN)}': no such file{hint}")
    try:
        return p.read_bytes(), str(p)
    except OSError as exc:
        raise fail(f"cannot read '{shown(str(p), PATH_SHOWN)}': {exc.strerror or exc}") from None


def _is_file(path: str | os.PathLike) -> bool:
    try:
        return Path(path).is_file()
    except (OSError, ValueError):  # a name too long, or holding NUL: not a file
        return False


def lower_to_kernel_ir(data: bytes, path: str, arch: str, defines: Mapping[str, str], *, name: str,
                       lse: bool = False, kernel: str | None = None):
    """TL text → TL passes → the lowering passes (tlc.lowering.passes); (state, remarks). The remarks
    include a warning for each schedule knob the program or -D sets that this kernel could not apply.
    `kernel`: which kernel of a program of several (`Kernel NAME` lines)."""
    from tlc.api import compile_graph
    from tlc.lowering.passes import run_lowering

    graph, remarks = compile_graph(data, path, defines=defines, kernel=kernel)
    with refusing_for(arch):
        refuse_loaded_operands(graph)
        refuse_second_stores(graph)
        state, ctx = run_lowering(graph, arch, name=name, lse=lse)
        refuse_unproved_protocol(state.kir, arch)
    if kernel is not None:   # one of several kernels: its program states the whole program's launch
        state.kir = dataclasses.replace(state.kir, body=(launch_op(data, path, defines), *state.kir.body))
    notes = [d for d in ctx.sink.items if d.severity != "error"]
    return state, remarks + notes + schedule_warnings(graph, state.schedule, arch)


def launch_op(data: bytes, path: str, defines: Mapping[str, str]):
    """The launch contract (tlc.kir LaunchOp) of a program of several kernels: its kernels in launch order and each
    global tensor's role (tlc.ir.module.Module.roles, which refuses a tensor two kernels store)."""
    from tlc.api import compile_module
    from tlc.kir.ops import LaunchOp

    module, _ = compile_module(data, path, defines=defines, run_passes=False)   # roles read the copies no pass adds
    return LaunchOp(program=Path(path).stem,
                    kernels=tuple(name for name, _ in module.kernels), tensors=tuple(module.roles().items()))


BUILD_REFUSAL = "tlc build: "


@contextmanager
def refusing_for(arch: str) -> Iterator[None]:
    """Each `tlc build: …` refusal raised inside says which target refused it, `tlc build (sm_90a): …`: the
    lowering rules are shared by the targets (sm_90a's copies are the sm_80 family's cp.async), so the
    message a rule writes cannot tell which target ran it. Other messages (a Param's value, resources
    that name their arch) pass unchanged."""
    try:
        yield
    except TlcError as exc:
        named = [dataclasses.replace(d, message=f"tlc build ({arch}): {d.message[len(BUILD_REFUSAL):]}")
                 if d.message.startswith(BUILD_REFUSAL) else d for d in exc.diagnostics]
        raise TlcError(named) from None


def refuse_loaded_operands(graph) -> None:
    """A Compute or Reshape whose operand is a tile copied from memory into registers (a bias added to S),
    refused at its line before the lowering: every target lowers a register copy of a shared tile only
    as a GEMM operand, and a copy from global to registers only in a kernel without GEMMs, and the ABI's checks would otherwise speak
    first, of the tensor's shape, so a user would fix that to meet this refusal next. The interpreter
    runs such programs."""
    from tlc.diagnostics import Note
    from tlc.ir.ops import CopyOp, GemmOp, LoopOp
    from tlc.passes.verify import LOWERED_OPERANDS, statement

    gemms = any(isinstance(op, GemmOp) for _, op in graph.walk())
    for region, op in graph.walk():
        if isinstance(op, (GemmOp, CopyOp, LoopOp)):
            continue
        for v in op.operands:
            copy = region.producer(v)
            if not gemms and isinstance(copy, CopyOp) and copy.src_space == "global":
                continue   # a kernel without GEMMs loads its register tiles from global (tile_copies)
            if isinstance(copy, CopyOp) and copy.dst_space == "register" and copy.src_space != "register":
                raise fail(f"{BUILD_REFUSAL}{statement(op)} reads '{v.base}', a tile copied to registers from "
                           f"{copy.src_space} memory; {LOWERED_OPERANDS}", op.loc,
                           Note(f"'{v.base}' is copied to registers here", copy.loc))


def refuse_unproved_protocol(program, arch: str) -> None:
    """An sm_90a kernel's mbarrier and named-barrier protocol is run abstractly at sizes that reach its edge
    cases (tlc.kir.sm90_protocol): a kernel that could deadlock, overrun its ring or race in shared memory,
    or whose protocol the checker cannot follow, is refused at the op's line instead of hanging a GPU."""
    from tlc.diagnostics import Diagnostic, TlcError
    from tlc.kir.sm90_protocol import check_protocol, default_sizes

    for sizes in default_sizes(program):
        problems = check_protocol(program, sizes)
        if problems:
            raise TlcError([Diagnostic("error", f"tlc build ({arch}): {p.message} — refused: a kernel whose "
                                       "barriers may deadlock or race is never built", p.loc, tuple(p.notes))
                            for p in problems[:3]])


def refuse_second_stores(graph) -> None:
    """A second `Copy O … to global` of one tensor, refused at its line: the lowering keys a store's shared
    staging buffer by the tensor's name (tlc.lowering.tile_copies), so a second store replaces the first's
    buffer and the first store's partition would read a buffer never declared (the emitter's scope check
    refuses it, with no line). The interpreter runs such programs."""
    from tlc.ir.ops import CopyOp
    from tlc.passes.verify_final import global_allocation

    first: dict[int, CopyOp] = {}
    for region, op in graph.walk():
        if not (isinstance(op, CopyOp) and op.dst_space == "global"):
            continue
        alloc = global_allocation(region, op.operands[-1])
        if alloc is None:
            continue
        if id(alloc) in first:
            raise fail(f"tlc build: '{alloc.name}' is stored to global memory a second time (first at line "
                       f"{first[id(alloc)].loc.line}); the lowering stores each global tensor once: store it "
                       "once, after its last computation", op.loc)
        first[id(alloc)] = op


# ---------------------------------------------------------------------- schedule knobs that could not apply
@dataclass(frozen=True)
class _Knob:
    """How the schedule notes (`state.schedule`) tell whether a knob took effect: a note matching
    `applied` says it did; one matching `declined` says it did not, its group 1 giving the reason."""

    applied: str | None
    declined: tuple[str, ...] = ()
    sm90a: bool = True  # only warp-specialised sm_90a kernels have what it changes


_WS_KEPT = r"warp-specialize: kept the cp\.async schedule: (.*)"
_KNOBS = {
    "WarpSpecialize": _Knob(r"warp-specialize: warp group", (_WS_KEPT,)),
    "TmaStore": _Knob(r"warp-specialize: warp group", (r"warp-specialize: the epilogue keeps its copy: (.*)",
                                                       _WS_KEPT)),
    "Overlap": _Knob(r"overlap-gemms: loop \S+: ", (r"overlap-gemms: loop \S+ keeps its order: (.*)",)),
    "PingPong": _Knob(r"overlap-gemms: .*ping-pong: ", (r"overlap-gemms: loop \S+ keeps its order: (.*)",)),
    "Persistent": _Knob(r"persistent: a CTA per", (r"persistent: kept one tile per CTA: (.*)",)),
    "StaticTiles": _Knob(r"persistent: a CTA per", (r"persistent: kept one tile per CTA: (.*)",)),
    "L2Sections": _Knob(r"l2-sections: the ", (r"l2-sections: kept the hardware's order: (.*)",)),
    "L2TailOnly": _Knob(r"l2-sections: the ", (r"l2-sections: kept the hardware's order: (.*)",)),
    "PrefetchNext": _Knob(r"prefetch-next-tile: the ", (r"prefetch-next-tile: kept: (.*)",)),
    "PrefetchTma": _Knob(r"prefetch-tma-descriptors: (?!no )", (r"prefetch-tma-descriptors: (no .*)",)),
    "SkipMaskedTrips": _Knob(r"skip-masked-trips: each ", (r"skip-masked-trips: kept: (.*)",)),
    "SplitMasked": _Knob(r"split-masked-trips: loop '\S+' runs",
                         (r"split-masked-trips: loop '\S+' kept whole \((.*)\)",), sm90a=False),
    "LazyRescale": _Knob(r"lazy-rescale: ", sm90a=False),
    "Trace": _Knob(r"trace-phases: ", sm90a=False),
    "TraceTrips": _Knob(r"trace-phases: ", sm90a=False),
    "Exp2Poly": _Knob(r"emulate-exp2: every \d+\w* exp2 of [1-9]", sm90a=False),
    "ReduceChains": _Knob(r"reduction-chains: [1-9]", sm90a=False),
    "Stages": _Knob(None, (r"warp-specialize: (one stage; .*)", r"loop \S+: (one stage; .*)"), sm90a=False),
}


def _asks(name: str, value: Any) -> bool:
    """Whether a knob's value asks for a change (turning a pass on, more stages, …); off is always honoured."""
    if isinstance(value, bool):
        return value
    number = isinstance(value, (int, float))
    return number and value > {"ReduceChains": 1, "Stages": 1}.get(name, 0)


def schedule_warnings(graph, schedule: list[str], arch: str) -> list[Diagnostic]:
    """One warning per schedule knob the program sets (a Param, or -D) asking for what this kernel did not
    get, with the lowering's reason: the CuTe is then what it would be without the knob. Defaults
    (knobs the program leaves unset) are never reported."""
    warned = []
    for name, knob in _KNOBS.items():
        value = graph.params.get(name)
        if name not in graph.params or not _asks(name, value):
            continue
        reason = next((m.group(1) for note in schedule for pattern in knob.declined
                       if (m := re.match(pattern, note))), None)
        if reason is None and knob.applied is not None and not any(re.match(knob.applied, n) for n in schedule):
            ws = next((m.group(1) for n in schedule if (m := re.match(_WS_KEPT, n))), None)
            reason = ("it applies to sm_90a kernels only" if knob.sm90a and not arch.endswith("a") else
                      f"the kernel is not warp-specialised ({ws})" if knob.sm90a and ws else
                      "nothing in this kernel for it to change")
        if reason is None:
            continue
        shown_value = str(value).lower() if isinstance(value, bool) else value
        loc = graph.param_locs.get(name) or Loc(graph.file, 0, 0)
        warned.append(Diagnostic("warning", f"{name} = {shown_value} has no effect on this {arch} kernel: "
                                 f"{reason}; the kernel is built without it", loc))
    return warned


@dataclass
class TargetCheck:
    """What one target's build would say of a program short of NVRTC: its refusal (None when it
    lowers and emits) and its warnings."""

    arch: str
    error: TlcError | None = None
    warnings: list[Diagnostic] = field(default_factory=list)


def module_kernel_name(path: str, kernel: str | None) -> str:
    """The C++ name of a program's kernel: the file's (tlc.names.kernel_name), and for a kernel of a program
    of several, its name after it."""
    return kernel_name(path) if not kernel else f"{kernel_name(path)}_{kernel}"


def check_targets(data: bytes, path: str, defines: Mapping[str, str], archs,
                  kernels: Sequence[str] = ()) -> list[TargetCheck]:
    """Every check `tlc build` makes before NVRTC, for each target: the TL passes, the lowering passes
    and the CuTe emitter (whose own checks, scopes among them, run as it writes); for each of `kernels`
    (the names of a program of several) in turn."""
    from tlc.backend_cute.emit import emit_program

    results = []
    for arch in archs:
        try:
            warnings = []
            for kernel in kernels or [None]:
                state, remarks = lower_to_kernel_ir(data, path, arch, defines, name=module_kernel_name(path, kernel),
                                                    kernel=kernel)
                emit_program(state.kir, source=Path(path).name, cu_name=f"{Path(path).stem}.cu")
                warnings += [d for d in remarks if d.severity == "warning"]
        except TlcError as exc:
            results.append(TargetCheck(arch, exc))
            continue
        results.append(TargetCheck(arch, None, warnings))
    return results


def build_one(path: str, arch: str, out_dir: str, defines: Mapping[str, str]) -> dict[str, Any]:
    """Build one file; returns the artifact metadata (also written as JSON)."""
    return _build(path, arch, out_dir, defines)[0]


def _build(path: str, arch: str, out_dir: str, defines: Mapping[str, str]) -> tuple[dict[str, Any], list[Diagnostic]]:
    """`build_one`'s metadata and the build's warnings."""
    from tlc.backend_cute.compile import compile_kir

    from tlc.api import kernel_names

    src_path = Path(path)
    data = src_path.read_bytes()
    names = kernel_names(data, path)
    if not names:
        return _build_kernel(src_path, data, arch, out_dir, defines, None, src_path.stem)
    # several kernels: `<stem>.<kernel>.{cu,cubin,json}` each, and `<stem>.json` saying what runs in which order;
    # the program's tensor roles are checked before anything is written
    from tlc.api import compile_module
    module, _ = compile_module(data, path, defines=defines, run_passes=False)
    metas, warnings = [], []
    for kernel in names:
        meta, said = _build_kernel(src_path, data, arch, out_dir, defines, kernel, f"{src_path.stem}.{kernel}")
        metas.append(meta)
        warnings += said
    index = {"tlc": __version__, "source": str(src_path), "defines": dict(defines), "arch": arch,
             "kernels": [{"name": k, "artifacts": f"{src_path.stem}.{k}"} for k in names],
             "tensors": module.roles()}
    _atomic_write(Path(out_dir) / f"{src_path.stem}.json", (json.dumps(index, indent=2) + "\n").encode())
    summary = dict(metas[-1], program=", ".join(m["program"] for m in metas), cached=all(m["cached"] for m in metas),
                   compile_seconds=round(sum(m["compile_seconds"] for m in metas), 2),
                   ptxas={}, program_kernels=names)
    return summary, warnings


def _build_kernel(src_path: Path, data: bytes, arch: str, out_dir: str, defines: Mapping[str, str],
                  kernel: str | None, stem: str) -> tuple[dict[str, Any], list[Diagnostic]]:
    """One kernel's artifacts `<stem>.{cu,cubin,json}` (the user's file name; the kernel gets a C++-safe one)."""
    from tlc.backend_cute.compile import compile_kir

    path = str(src_path)
    state, remarks = lower_to_kernel_ir(data, path, arch, defines, name=module_kernel_name(path, kernel),
                                        kernel=kernel)
    compiled = compile_kir(state.kir, arch, source_name=src_path.name, cu_name=f"{stem}.cu")
    spilled = spill_warning(state, compiled.metadata.get("ptxas", {}))
    if spilled is not None:  # ptxas' count replaces check-resources' estimate that it would spill
        remarks = [d for d in remarks if not d.message.startswith(REGISTER_ESTIMATE)] + [spilled]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = dict(compiled.metadata)
    meta.update({
        "tlc": __version__,
        "source": str(src_path),
        "defines": dict(defines),
        "launch": state.abi.to_json(),
        "schedule": list(state.schedule),
        "compile_seconds": round(compiled.compile_seconds, 2),
        "cached": compiled.cached,
        "remarks": [d.render(GLOBAL_SOURCES) for d in remarks],
    })
    _atomic_write(out / f"{stem}.cu", compiled.source.encode())
    _atomic_write(out / f"{stem}.cubin", compiled.cubin)
    _atomic_write(out / f"{stem}.json", (json.dumps(meta, indent=2) + "\n").encode())
    return meta, [d for d in remarks if d.severity == "warning"]


REGISTER_ESTIMATE = "registers: about "   # check-resources' warning (tlc.lowering.check_resources)


def spill_warning(state, ptxas: Mapping[str, Any]) -> Diagnostic | None:
    """When ptxas spilled registers, a warning at the kernel's first GEMM saying why: the registers a
    thread may hold, what the kernel's data needs (check-resources' estimate, largest users first) and
    which knob lowers it (tlc.lowering.resources.register_advice)."""
    from tlc.lowering.resources import register_advice, register_use

    spilled, report = ptxas.get("spill_store_bytes", 0), state.resources
    if not spilled or report is None:
        return None
    return Diagnostic("warning", f"tlc build ({state.arch.name}): ptxas spilled {spilled} B of registers to local "
                      f"memory: a thread may hold {report.regs_limit} registers, and the kernel's data needs about "
                      f"{report.regs_peak} at its hungriest GEMM before addresses and temporaries "
                      f"({register_use(report)}); {register_advice(state.kir.kernels()[0])}", state.loc)


def _build_reporting(args: tuple[str, str, str, dict[str, str]]) -> tuple[str, str, int, str]:
    """(path, the line to print, exit code, warnings to print on stderr before it)."""
    path, arch, out_dir, defines = args
    try:
        meta, warnings = _build(path, arch, out_dir, defines)
    except TlcError as exc:
        return path, exc.render(GLOBAL_SOURCES, file=path), 1, ""
    except OSError as exc:
        return path, f"{path}: error: {exc.strerror or exc}", 1, ""
    res = meta.get("ptxas", {})
    regs = f", {res['registers']} registers" if "registers" in res else ""
    spills = f", {res.get('spill_store_bytes', 0)} B spilled" if "spill_store_bytes" in res else ""
    how = "cached" if meta["cached"] else f"in {meta['compile_seconds']} s"
    where = (f"{Path(out_dir) / Path(path).stem}.{{{','.join(meta['program_kernels'])}}}.{{cu,cubin,json}} and "
             f"{Path(out_dir) / Path(path).stem}.json" if "program_kernels" in meta
             else f"{Path(out_dir) / Path(path).stem}.{{cu,cubin,json}}")
    return path, (f"{path}: built {meta['program']} for {arch} {how}"
                  f"{regs}{spills} → {where}"), 0, \
        "\n".join(d.render(GLOBAL_SOURCES) for d in warnings)


def _run_reporting(fn, tasks: list, jobs: int) -> int:
    """Run `fn` over `tasks` in parallel processes; print each (path, message, code[, warnings]), the
    warnings on stderr; OR the codes. File names and messages are printed with control characters escaped."""
    jobs = jobs or min(len(tasks), os.cpu_count() or 1)
    status = 0
    with ProcessPoolExecutor(max_workers=jobs) if jobs > 1 and len(tasks) > 1 else nullcontext() as pool:
        for _, message, code, *warnings in (pool.map(fn, tasks) if pool else map(fn, tasks)):
            if warnings and warnings[0]:
                print(escape_controls(warnings[0]), file=sys.stderr, flush=True)
            print(escape_controls(message), file=sys.stderr if code else sys.stdout, flush=True)  # in order
            status |= code
    return status


def _distinct(files: list[str]) -> list[str]:
    """Each input file once, in the order given: `x.tl` and `./x.tl` are one build, not a collision."""
    first: dict[str, str] = {}
    for f in files:
        first.setdefault(os.path.realpath(f), f)
    return list(first.values())


def output_collisions(files: list[str]) -> list[str]:
    """One error line per artifact stem that two inputs would both write (`a/x.tl`, `b/x.tl` → x.cu)."""
    by_stem: dict[str, list[str]] = {}
    for f in files:
        by_stem.setdefault(Path(f).stem, []).append(f)
    return [f"error: {' and '.join(paths)} would both write {stem}.{{cu,cubin,json}}; build them into "
            f"separate -o directories" for stem, paths in by_stem.items() if len(paths) > 1]


def build_files(files: list[str], *, arch: str, out_dir: str, defines: Mapping[str, str], jobs: int = 0) -> int:
    """Build every file into `out_dir`; nothing is compiled when two inputs would share artifacts.
    A compile that takes more than a few seconds announces itself (tlc.backend_cute.compile)."""
    files = _distinct(files)
    if problems := output_collisions(files):
        print(escape_controls("\n".join(f"tlc build: {p}" for p in problems)), file=sys.stderr)
        return 1
    return _run_reporting(_build_reporting, [(f, arch, out_dir, dict(defines)) for f in files], jobs)
