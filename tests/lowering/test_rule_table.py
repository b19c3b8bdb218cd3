"""The rule table of lower-tile-ops (tlc/lowering/rules.py): every TL op class has a rule, or a
refusal with a message, on every target family; a class without one is refused, never skipped;
and a new family is one `Family` plus the rules it does not share."""
from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest

import tlc.ir.ops as tl_ops
from tlc.api import compile_graph
from tlc.arch import ARCHES, arch_info
from tlc.diagnostics import TlcError
from tlc.ir.ops import OP_CLASSES, GemmOp, MaskOp, Op
from tlc.kir.text import print_kir
from tlc.lowering import rules
from tlc.lowering.rules import FAMILIES, RULES, SHARED, Refuse, family_of, rule_for
from tlc.lowering.tile_gemm import lower_mma_sync_gemm
from tlc.lowering.tile_ops import TileOpLowering

SPEC = Path(__file__).resolve().parents[2] / "specs" / "mha_fwd.tl"


def _tl_op_classes() -> set[type[Op]]:
    """Every op class the TL IR defines: the frontend's and the TL passes' (OP_CLASSES), and any
    class of tlc.ir.ops that OP_CLASSES does not list yet."""
    defined = {cls for _, cls in inspect.getmembers(tl_ops, inspect.isclass)
               if issubclass(cls, Op) and cls is not Op and cls.__module__ == tl_ops.__name__}
    return defined | set(OP_CLASSES.values())


@pytest.mark.parametrize("path", sorted(FAMILIES))
@pytest.mark.parametrize("cls", sorted(_tl_op_classes(), key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_every_op_class_has_a_rule_on_every_family(cls: type[Op], path: str) -> None:
    rule = rule_for(cls, path)
    assert rule is not None, f"no lowering rule for {cls.__name__} on the {path} family (tlc/lowering/rules.py)"
    if isinstance(rule, Refuse):
        assert rule.message.startswith("tlc build: ") and len(rule.message) > 40


def test_the_table_names_only_known_families_and_op_classes() -> None:
    known = _tl_op_classes()
    for cls, path in RULES:
        assert cls in known, cls
        assert path == SHARED or path in FAMILIES, f"{cls.__name__}: rules registered for unknown family {path!r}"
    for path, family in FAMILIES.items():
        assert family.path == path


@pytest.mark.parametrize("name", sorted(ARCHES))
def test_every_arch_lowers_with_a_family(name: str) -> None:
    arch = arch_info(name)
    assert family_of(arch).path == arch.mma_path


def test_an_arch_without_a_family_is_refused_naming_the_families() -> None:
    arch = dataclasses.replace(arch_info("sm_90a"), name="sm_100a", mma_path="tcgen05")
    with pytest.raises(TlcError, match="uses tcgen05, which has no lowering rules .*mma.sync, wgmma"):
        family_of(arch)


def test_refusals_format_the_op() -> None:
    for (cls, _), rule in RULES.items():
        if isinstance(rule, Refuse):
            stand_in = type("StandIn", (), {"mnemonic": cls.mnemonic, "loc": None})()
            with pytest.raises(TlcError, match=f"'{cls.mnemonic}'"):
                rule(None, stand_in, None, [])   # type: ignore[arg-type]


def _graph():
    graph, _ = compile_graph(SPEC.read_bytes(), str(SPEC))
    return graph


def _mask_line() -> int:
    lines = SPEC.read_text().splitlines()
    return next(i + 1 for i, line in enumerate(lines) if line.strip().startswith("Compute Softmax"))


def test_a_class_without_a_rule_is_refused_at_its_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(RULES, (MaskOp, SHARED))
    with pytest.raises(TlcError, match="no kernel lowering for 'mask' here") as err:
        TileOpLowering(_graph(), arch_info("sm_80"), "mha_fwd").run()
    assert err.value.diagnostics[0].loc.line == _mask_line()


def test_a_new_family_registers_only_the_rules_it_does_not_share(monkeypatch: pytest.MonkeyPatch) -> None:
    """A family "test" that lowers GEMMs as mma.sync does and shares every other rule builds the
    sm_80 kernel; refusing an op class there refuses it at its line, on that family only."""
    arch = dataclasses.replace(arch_info("sm_80"), name="sm_test", mma_path="test")
    monkeypatch.setitem(FAMILIES, "test", dataclasses.replace(FAMILIES["mma.sync"], path="test", label="test"))
    monkeypatch.setitem(RULES, (GemmOp, "test"), lower_mma_sync_gemm)
    expected = print_kir(TileOpLowering(_graph(), arch_info("sm_80"), "mha_fwd").run())
    assert print_kir(TileOpLowering(_graph(), arch, "mha_fwd").run()) == expected

    monkeypatch.setitem(RULES, (MaskOp, "test"), Refuse("tlc build: the test family has no '{op.mnemonic}' yet"))
    with pytest.raises(TlcError, match="the test family has no 'mask' yet") as err:
        TileOpLowering(_graph(), arch, "mha_fwd").run()
    assert err.value.diagnostics[0].loc.line == _mask_line()
    assert rules.rule_for(MaskOp, "mma.sync") is RULES[(MaskOp, SHARED)]
