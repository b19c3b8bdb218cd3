"""The kernel-IR transforms' frame: the registry built from the modules (module name = pass name), the
lowering pipeline made of them and the three driver passes, the typed schedule parsed once from the
Params (its refusals word for word at the Param's line), and transforms that never read the TL graph."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tlc.diagnostics import Loc, TlcError
from tlc.frontend.params import SCHEDULE_PARAMS
from tlc.kir.transforms.registry import FRAMEWORK, TRANSFORMS, lookup
from tlc.kir.transforms.schedule import CP_ASYNC_STAGES, SCHEDULE_KNOBS, TMA_STAGES, Schedule
from tlc.passes.pipeline import LOWERING_PIPELINE, parse_pipeline
from tlc.passes.registry import REGISTRY

ROOT = Path(__file__).resolve().parents[2]
TRANSFORMS_DIR = ROOT / "tlc" / "kir" / "transforms"
DRIVER = {"lower-tile-ops", "infer-layouts", "check-resources"}
ATTENTION = {"overlap-gemms", "lazy-rescale", "reduction-chains", "defer-reductions", "split-masked-trips",
             "skip-masked-trips", "l2-sections", "persistent", "prefetch-next-tile"}


def test_every_transform_module_defines_the_class_named_after_it() -> None:
    modules = {p.stem.replace("_", "-") for p in TRANSFORMS_DIR.glob("*.py") if p.stem not in FRAMEWORK | {"__init__"}}
    attention = {p.stem.replace("_", "-") for p in (TRANSFORMS_DIR / "attention").glob("*.py")
                 if p.stem != "__init__"}
    assert set(TRANSFORMS) == modules | attention and attention == ATTENTION
    for name in TRANSFORMS:
        assert lookup(name).name == name


def test_the_lowering_pipeline_is_the_driver_passes_and_the_transforms() -> None:
    assert set(LOWERING_PIPELINE) == DRIVER | set(TRANSFORMS)
    for name in TRANSFORMS:   # each runs as a lowering pass of the same name and options
        (p,) = parse_pipeline(name)
        assert p.name == name == REGISTRY[name]().name and p.transform is lookup(name)
    assert parse_pipeline("pipeline{stages=1}")[0].stages == 1


def test_transforms_never_read_the_tl_graph() -> None:
    for path in TRANSFORMS_DIR.rglob("*.py"):
        if path.stem == "opt":
            continue   # the `tlc opt` driver reads pass lists with the pipeline's parser
        tree = ast.parse(path.read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not {m for m in imported if m.startswith(("tlc.ir", "tlc.passes"))}, path
        assert "graph.params" not in path.read_text() and "param_locs" not in path.read_text(), path


def test_every_knob_has_a_define_kind_and_a_default() -> None:
    assert set(SCHEDULE_PARAMS) == set(SCHEDULE_KNOBS)
    schedule = Schedule()
    assert (schedule.stages, schedule.warp_specialize, schedule.persistent, schedule.lazy_rescale) == (2, True, False, None)
    assert Schedule.from_params({"ReduceChains": 2.0}).reduce_chains == 2


AT = Loc("k.tl", 7, 1)


@pytest.mark.parametrize("params, ring, message", [
    ({"Persistent": 2}, False, "Param Persistent = 2: use true or false"),
    ({"PingPong": "yes"}, False, "Param PingPong = 'yes': use true or false"),
    ({"ReduceChains": 3}, False, "Param ReduceChains = 3: use 1, 2, 4 or 8"),
    ({"Exp2Poly": 65}, False, "Param Exp2Poly = 65: use 0 (off) or k from 1 to 64: every k-th exp2 by polynomial"),
    ({"LazyRescale": 1}, False, "Param LazyRescale = 1: use true or false"),
    ({"StaticTiles": True}, True, "StaticTiles = true needs Persistent = true (it picks how a persistent kernel's "
                                  "CTAs take their tiles); set both, or drop StaticTiles"),
    ({"L2TailOnly": True, "L2Sections": False}, True, "L2TailOnly = true needs L2Sections = true (it picks which "
                                                      "heads l2-sections reorders); set both, or drop L2TailOnly"),
    ({"Stages": 3}, False, f"Param Stages = 3: {CP_ASYNC_STAGES}"),
    ({"Stages": 5}, True, f"Param Stages = 5: {TMA_STAGES}"),
    ({"Stages": 3, "WarpSpecialize": False}, True, f"Param Stages = 3: {CP_ASYNC_STAGES}"),
])
def test_a_bad_knob_is_refused_once_at_its_param(params, ring, message) -> None:
    with pytest.raises(TlcError) as info:
        Schedule.from_params(params, {name: AT for name in params}, tma_ring=ring)
    (diagnostic,) = info.value.diagnostics
    assert diagnostic.message == message and diagnostic.loc == AT


def test_every_refusal_is_reported_together_and_a_ring_takes_four_stages() -> None:
    with pytest.raises(TlcError) as info:
        Schedule.from_params({"Overlap": 0, "Trace": "on"})
    assert [d.message for d in info.value.diagnostics] == ["Param Overlap = 0: use true or false",
                                                           "Param Trace = 'on': use true or false"]
    schedule = Schedule.from_params({"Stages": 4, "Persistent": True, "StaticTiles": True}, {"Stages": AT},
                                    tma_ring=True)
    assert (schedule.stages, schedule.static_tiles, schedule.loc("Stages")) == (4, True, AT)
