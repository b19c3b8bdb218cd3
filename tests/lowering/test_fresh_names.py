"""One fresh-name helper (`tlc.names.FreshNames`) spells every pass's new names as before: the TL graph's
versions (`S`, `S.1`), the lowering's C++ identifiers (`S_1`), the kernel-IR passes' second names
(`n_masked_from_2`) and the reshape's always-numbered results (`P.1`)."""
from __future__ import annotations

from pathlib import Path

from tlc.api import lower_source
from tlc.lowering.storage import Namer
from tlc.names import FreshNames, fresh_value_name

SPEC = Path(__file__).resolve().parents[2] / "specs" / "mha_fwd.tl"


def test_names_start_bare_then_count_from_first_with_the_separator():
    names = FreshNames(["a", "a_1"])
    assert [names.fresh("a"), names.fresh("a"), names.fresh("b")] == ["a_2", "a_3", "b"]
    second = FreshNames(["n_masked_from"], first=2)
    assert [second.fresh("n_masked_from"), second.fresh("n_masked_from")] == ["n_masked_from_2", "n_masked_from_3"]
    versions = FreshNames(sep=".")
    assert [versions.fresh("S"), versions.fresh("S"), versions.fresh("S")] == ["S", "S.1", "S.2"]
    numbered = FreshNames(["P.1"], sep=".", bare=False)
    assert [numbered.fresh("P"), numbered.fresh("Q")] == ["P.2", "Q.1"]


def test_the_lowering_namer_makes_cpp_identifiers_and_keeps_reserved_names_out():
    names = Namer(reserved=("block_idx", "p"))
    assert [names.fresh("S.1"), names.fresh("S.1"), names.fresh("int"), names.fresh("p")] == \
        ["S_1", "S_1_1", "v_int", "p_1"]
    assert "S_1_1" in names.taken


def test_tl_values_get_versions_no_value_of_the_graph_has():
    graph = lower_source(SPEC.read_text(), SPEC.name)
    results = {r.name for _, op in graph.walk() for r in op.results}
    assert {"S", "S.1", "K", "K.1", "K.3", "K.4"} <= results and "K.2" not in results
    taken: set[str] = set()
    assert fresh_value_name(graph, "S", taken) == "S.2" and taken == {"S.2"}
    assert fresh_value_name(graph, "S", taken) == "S.3"
    assert fresh_value_name(graph, "K") == "K.2"    # the smallest k no value has
    assert fresh_value_name(graph, "x") == "x"
    assert fresh_value_name(graph, "x", bare=False) == "x.1"   # a Reshape result is numbered even where its base is free
