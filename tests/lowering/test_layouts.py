"""CPU layout checks with pycute (DESIGN.md §8 layer 3): the m16n8k16 atom's TV layouts,
the accumulator → A regroup, ldmatrix vs ldmatrix.trans, and Swizzle<3,3,3> banks — each
with a deliberately wrong choice that the same check must catch."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tlc.api import compile_graph
from tests.lowering.programs import attention_kir
from tests.lowering.programs import gemms
from tlc.kir.ops import SmemLayoutOp, TiledCopyOp
from tlc.lowering import layout_check as lc
from tlc.lowering.passes import run_lowering

MHA = Path(__file__).resolve().parents[2] / "specs" / "mha_fwd.tl"


def test_cute_tv_layouts_match_the_ptx_fragment_tables() -> None:
    assert lc.atom_problems() == []
    assert lc.A_TV.size() == 32 * 8 and lc.B_TV.size() == 32 * 4 and lc.C_TV.size() == 32 * 4
    # each layout is a bijection onto its tile (every element held by exactly one register)
    for tv, n, elems in ((lc.A_TV, 8, 256), (lc.B_TV, 4, 128), (lc.C_TV, 4, 128)):
        assert sorted(x for row in lc.tv_table(tv, n) for x in row) == list(range(elems))


def test_a_wrong_atom_table_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lc, "C_TV", lc.Layout(((4, 8), (2, 2)), ((32, 1), (8, 16))))  # v0, v1 swapped
    assert lc.atom_problems()


def test_two_n8_accumulators_are_one_k16_a_operand() -> None:
    """Why P stays in registers: FA2's convert_layout_acc_Aregs is a register renaming."""
    assert lc.regroup_problems(lc.ACC_PAIR_TV, lc.A_TV) == []


def test_regrouping_to_the_b_layout_is_caught() -> None:
    problems = lc.regroup_problems(lc.ACC_PAIR_TV, lc.B_PAIR_TV)
    assert problems and "thread 0 register 2 holds element (8, 0)" in problems[0]


def test_regrouping_two_m16_atoms_is_caught() -> None:
    # atoms stacked along M (rows 16..31) instead of along N: not an m16k16 A tile
    m_pair = lc.Layout(((4, 8), ((2, 2), 2)), ((32, 1), ((16, 8), 16 * 16 * 2)))
    assert lc.regroup_problems(m_pair, lc.A_TV)


@pytest.mark.parametrize("role, major, load", [("A", "k", "ldmatrix"), ("B", "k", "ldmatrix"),
                                               ("B", "mn", "ldmatrix.trans"), ("A", "mn", "ldmatrix.trans")])
def test_ldmatrix_choice(role: str, major: str, load: str) -> None:
    assert lc.load_problems(role, major, load) == []
    wrong = "ldmatrix" if load == "ldmatrix.trans" else "ldmatrix.trans"
    assert lc.load_problems(role, major, wrong), f"{wrong} of a {major}-major {role} must be caught"
    assert lc.required_load(role, major) == load


def test_the_kernel_loads_follow_resolve_transpose() -> None:
    graph, _ = compile_graph(MHA.read_bytes(), str(MHA))
    state, _ = run_lowering(graph, "sm_90", name="mha_fwd")
    copies = {op.name: op.atom for op in lc.walk(state.kir) if isinstance(op, TiledCopyOp)}
    (_, s_loads), (_, o_loads) = gemms(state.kir)
    assert lc.LOAD_OF_ATOM[copies["s2r_B"]] == lc.required_load("B", "k") and "s2r_B" in s_loads   # K: k-major
    assert lc.LOAD_OF_ATOM[copies["s2r_B_trans"]] == lc.required_load("B", "mn") and list(o_loads) == ["s2r_B_trans"]


def test_wrong_load_in_the_kernel_ir_is_caught() -> None:
    program = attention_kir(stages=2)
    chosen = {"s2r_B": "ldmatrix", "s2r_B_trans": "ldmatrix.trans"}
    assert lc.check_program(program, chosen) == []
    wrong = _replace_ops(program, lambda op: dataclasses.replace(op, atom="SM75_U32x4_LDSM_N")
                         if isinstance(op, TiledCopyOp) and op.name == "s2r_B_trans" else op)
    assert any("s2r_B_trans" in p for p in lc.check_program(wrong, chosen))


def test_swizzle_333_makes_ldmatrix_phases_conflict_free() -> None:
    swizzled = lc.smem_layout((3, 3, 3), (8, 64), (8, 64))
    assert lc.ldmatrix_phase_problems(swizzled, (8, 64)) == []
    plain = lc.smem_layout(None, (8, 64), (8, 64))
    problems = lc.ldmatrix_phase_problems(plain, (8, 64))
    assert len(problems) == 8 and "8-way conflict" in problems[0]  # every column chunk


def test_swizzle_is_conflict_free_over_whole_tiles() -> None:
    for atom, sw, shape in (((8, 64), (3, 3, 3), (128, 128)), ((8, 32), (2, 3, 3), (64, 96))):
        assert lc.ldmatrix_phase_problems(lc.smem_layout(sw, atom, shape), shape) == []
    # a swizzle too narrow for a 128-byte row leaves 2-way conflicts
    assert lc.ldmatrix_phase_problems(lc.smem_layout((2, 3, 3), (8, 64), (8, 64)), (8, 64))


def test_unswizzled_layout_in_the_kernel_ir_is_caught() -> None:
    program = attention_kir(stages=2)
    assert lc.check_program(program) == []
    broken = _replace_ops(program, lambda op: dataclasses.replace(op, swizzle=(0, 3, 3))
                          if isinstance(op, SmemLayoutOp) and op.name == "sK_layout" else op)
    problems = lc.check_program(broken)
    assert problems and all(p.startswith("sK_layout") for p in problems)


def _replace_ops(op, fn):
    changes = {r: tuple(_replace_ops(c, fn) for c in getattr(op, r)) for r in op.regions}
    return fn(dataclasses.replace(op, **changes) if changes else op)
