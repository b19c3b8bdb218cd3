"""Sketch mode: the algorithm without Allocates, shapes or parameter values is accepted,
and the same text without --sketch says exactly what TL code still needs."""
from __future__ import annotations

from tlc.api import check_source

SKETCH = """\
Param BM
Copy Q from global to shared
for n = 0:N
  Copy K from global to shared
  Copy V from global to shared
  Compute GEMM Q, K.T and get S
  Compute Softmax S and get P
  Compute GEMM P, V and accumulate O
end
Copy O from register to global
"""


def test_sketch_is_accepted() -> None:
    res = check_source(SKETCH, "s.tl", sketch=True)
    assert res.ok, res.rendered


def test_sketch_as_code_lists_what_is_missing() -> None:
    res = check_source(SKETCH, "s.tl")
    text = res.rendered
    assert not res.ok
    assert "s.tl:1:1: error: parameter 'BM' has no value" in text
    assert "s.tl:2:6: error: 'Q' has no value in global memory" in text
    assert "undefined name 'N' in the loop bound" in text
    assert "'accumulate O' needs an existing accumulator" in text


def test_sketch_still_checks_structure() -> None:
    res = check_source(SKETCH.replace("from global to shared", "from global to smem", 1), "s.tl", sketch=True)
    assert not res.ok and "did you mean 'shared'?" in res.rendered
