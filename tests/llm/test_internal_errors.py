"""tlc failing internally on a model's answer is one more diagnostic for the model, not an abort."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from loopback import fenced, one_error_line
from scripts import sketch_of, spec_text

api = pytest.importorskip("tlc.api", reason="tlc's frontend (tlc.api) is not there yet")

CRASH_MARKER = "# crash tlc here"


def with_huge_coordinate(program: str, terms: int = 600) -> str:
    huge = " + ".join(["n"] * terms)
    bad = program.replace("in coordinate [L = n]", f"in coordinate [L = {huge}]", 1)
    assert bad != program, "the spec has no `[L = n]` coordinate"
    return bad


@pytest.fixture
def crashing_tlc(monkeypatch):
    """tlc's checker raising a non-TlcError on marked text, whatever the frontend does today."""
    real = api.check_source

    def check_source(text, *args, **kwargs):
        if CRASH_MARKER in text:
            raise RecursionError("maximum recursion depth exceeded")
        return real(text, *args, **kwargs)

    monkeypatch.setattr(api, "check_source", check_source)


def test_huge_expression_is_repaired_in_round_two(endpoint_env, gen, tmp_path):
    """600 `+` terms: a RecursionError in an older frontend, a located diagnostic in a newer one."""
    program = spec_text()
    endpoint_env.script = [fenced(sketch_of(program)), fenced(with_huge_coordinate(program)), fenced(program)]
    out = tmp_path / "mha.tl"
    status, output = gen("MHA", "-o", str(out), "--no-build")
    assert status == 0, output
    assert "3 LLM call(s), 1 repair round(s)" in output
    assert out.read_text().strip() == program.strip()
    feedback = endpoint_env.received[2].body["messages"][3]["content"]
    assert "mha.tl:" in feedback and "error:" in feedback


def test_internal_error_goes_back_to_the_model(endpoint_env, gen, tmp_path, crashing_tlc):
    program = spec_text()
    endpoint_env.script = [fenced(sketch_of(program)), fenced(f"{CRASH_MARKER}\n{program}"), fenced(program)]
    out = tmp_path / "mha.tl"
    status, output = gen("MHA", "-o", str(out), "--no-build")
    assert status == 0, output
    assert "Traceback" not in output and "3 LLM call(s), 1 repair round(s)" in output
    feedback = endpoint_env.received[2].body["messages"][3]["content"]
    assert "internal error while checking your program: RecursionError: maximum recursion depth" in feedback
    assert "simplify the expression at line" in feedback


def test_internal_errors_in_every_round_end_clearly(endpoint_env, gen, tmp_path, crashing_tlc):
    program = spec_text()
    endpoint_env.script = [fenced(sketch_of(program))] + [fenced(f"{CRASH_MARKER}\n{program}")] * 3
    out = tmp_path / "mha.tl"
    status, output = gen("MHA", "-o", str(out), "--no-build", "--max-rounds", "2")
    assert status == 1 and not out.exists()
    line = one_error_line(output)
    assert "parameters: no valid TL after 3 answer(s)" in line
    assert "internal error while checking your program: RecursionError" in line and "TLC_DEBUG=1" in line
    record = json.loads(Path(str(out) + ".transcript.json").read_text())
    assert record["outcome"]["status"] == "failed"
