"""`tlc opt FILE --pass a,b{opt=v} [--schedule NAME=VALUE …] [--arch ARCH] [--fact NAME=WHY …]`: kernel-IR
text in, the transforms run in order, kernel-IR text out (xdsl-opt's shape, for tests and for looking).

Lines starting with `//` are comments (a FileCheck test's RUN and CHECK lines; the schedule notes this
prints), so the output reads back in. The schedule comes from `--schedule` with the Params' names and
checks; the facts from `--arch` (default: sm_90a for a kernel lowered for it, an Sm90KernelOp, else
sm_90) and `--fact stale-max=WHY` / `--fact masked-trips=WHY`, which say a precondition fails and why;
a precondition not given is assumed to hold.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Sequence

from tlc.arch import arch_info
from tlc.diagnostics import Loc, TlcError, error, fail
from tlc.kir.ops import ProgramOp, walk
from tlc.kir.ops_sm90 import Sm90KernelOp
from tlc.kir.text import SOURCE, parse_kir, print_kir
from tlc.kir.transforms.base import Facts, Transform
from tlc.kir.transforms.registry import TRANSFORMS, lookup
from tlc.kir.transforms.schedule import SCHEDULE_KNOBS, Schedule
from tlc.numbers import shown

FACTS = {"stale-max": "stale_max", "masked-trips": "masked_trips"}   # --fact NAME → Facts field
_COMMENT = re.compile(r"^[ \t]*//.*$", re.M)


def read_program(text: str, path: str) -> ProgramOp:
    """Kernel-IR text, comment lines blanked (line numbers kept), as a verified program; errors at path."""
    try:
        program = parse_kir(_COMMENT.sub("", text))
        if not isinstance(program, ProgramOp):
            raise fail(f"the text is a {type(program).__name__}, not a ProgramOp: the transforms take a whole "
                       "program", Loc(SOURCE, 1, 1))
        program.verify()
    except TlcError as exc:
        raise TlcError([dataclasses.replace(d, loc=dataclasses.replace(d.loc, file=path))
                        if d.loc is not None and d.loc.file == SOURCE else d for d in exc.diagnostics]) from None
    return program


def parse_passes(text: str) -> list[Transform]:
    """`"insert-sync,pipeline{stages=1}"` → transform instances."""
    from tlc.passes.pipeline import parse_entries
    from tlc.passes.registry import REGISTRY

    def unknown(name: str) -> str:
        known = ", ".join(sorted(TRANSFORMS))
        if name in REGISTRY:
            return f"--pass {name}: not a kernel-IR transform (it needs the TL graph: tlc show runs it); the " \
                   f"transforms are {known}"
        return f"--pass {shown(name)}: unknown kernel-IR transform; the transforms are {known}"

    if not text.strip():
        raise TlcError(error("--pass: name at least one transform, e.g. --pass insert-sync"))
    return parse_entries(text, lookup, unknown)


def _pairs(items: Sequence[str], option: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name.strip():
            raise TlcError(error(f"{option} {shown(item)}: write {option} NAME=VALUE"))
        out[name.strip()] = value.strip()
    return out


def parse_schedule(items: Sequence[str], tma_ring: bool) -> Schedule:
    """`--schedule Stages=3 …` (the Params' names and values) → the checked schedule."""
    from tlc.frontend.params import parse_define

    values = {}
    for name, raw in _pairs(items, "--schedule").items():
        if name not in SCHEDULE_KNOBS:
            raise TlcError(error(f"--schedule {shown(name)}: no such schedule knob; the knobs are "
                                 f"{', '.join(SCHEDULE_KNOBS)}"))
        values[name] = parse_define(raw, f"--schedule {name}")
    return Schedule.from_params(values, tma_ring=tma_ring)


def parse_facts(items: Sequence[str], arch: str) -> Facts:
    """`--fact stale-max=WHY …` → the facts for `arch`, the preconditions not named assumed to hold."""
    failing = {}
    for name, why in _pairs(items, "--fact").items():
        if name not in FACTS:
            raise TlcError(error(f"--fact {shown(name)}: no such fact; the facts are {', '.join(FACTS)}"))
        if not why:
            raise TlcError(error(f"--fact {name}: say why the precondition fails, e.g. --fact {name}=\"…\""))
        failing[FACTS[name]] = why
    return Facts(arch=arch_info(arch), **failing)


def run_opt(text: str, path: str, passes: str, schedule: Sequence[str] = (), arch: str | None = None,
            facts: Sequence[str] = ()) -> str:
    """The program in `text` after the transforms `passes` names, as kernel-IR text led by their notes."""
    from tlc.lowering.rules import FAMILIES

    transforms = parse_passes(passes)
    program = read_program(text, path)
    arch = arch or ("sm_90a" if any(isinstance(op, Sm90KernelOp) for op in walk(program)) else "sm_90")
    given = parse_facts(facts, arch)
    family = FAMILIES.get(given.arch.mma_path)
    knobs = parse_schedule(schedule, tma_ring=family is not None and family.tma_copies)
    notes: list[str] = []
    for transform in transforms:
        before = program
        program, more = transform.apply(program, knobs, given)
        if program is not before:
            program.verify()
        notes += more
    return "".join(f"// schedule: {n}\n" for n in notes) + print_kir(program)
