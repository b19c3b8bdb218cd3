"""`tlc gen` end to end against the loopback server and the real tlc frontend and passes."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import SECRET
from loopback import Reply, answer, completion, fenced, one_error_line
from scripts import request_for, sketch_of, spec_files, spec_text, syntax_error, without_reshape, wrong_transpose

api = pytest.importorskip("tlc.api", reason="tlc's frontend (tlc.api) is not there yet")

SPECS = spec_files()


def good_script(program: str) -> list[Reply]:
    return [fenced(sketch_of(program)), fenced(program)]


def transcript_of(out: Path) -> dict:
    return json.loads(out.with_name(out.name + ".transcript.json").read_text())


@pytest.mark.parametrize("spec", SPECS, ids=[s.stem for s in SPECS])
def test_good_answers_for_every_spec(endpoint_env, gen, tmp_path, spec):
    program = spec.read_text(encoding="utf-8")
    endpoint_env.script = good_script(program)
    out = tmp_path / f"{spec.stem}.tl"
    status, output = gen(request_for(spec), "--target", "sm_90", "-o", str(out), "--no-build")
    assert status == 0, output
    assert api.check_source(out.read_text(), out.name).ok
    assert out.read_text().strip() == program.strip()
    assert "Traceback" not in output and "2 LLM call(s), 0 repair round(s)" in output
    record = transcript_of(out)
    assert [e["label"] for e in record["exchanges"]] == ["sketch/round-0", "parameters/round-0"]
    assert record["outcome"]["status"] == "ok"
    stage2 = endpoint_env.received[1].body["messages"][1]["content"]
    assert sketch_of(program).strip() in stage2  # stage 2 builds on the accepted sketch
    assert "streaming multiprocessors: 132" in stage2  # target facts for sm_90


def test_missing_reshape_is_repaired_by_the_passes(endpoint_env, gen, tmp_path):
    program = spec_text()
    endpoint_env.script = [fenced(sketch_of(program)), fenced(without_reshape(program))]
    out = tmp_path / "mha.tl"
    status, output = gen("MHA, head dim 128, bf16", "-o", str(out), "--no-build")
    assert status == 0, output
    assert len(endpoint_env.received) == 2  # no repair round trip
    assert "reshape" in output.lower() and "remark" in output.lower()
    assert api.check_source(out.read_text(), out.name).ok


def test_wrong_transpose_is_repaired_by_the_passes(endpoint_env, gen, tmp_path):
    program = spec_text()
    endpoint_env.script = [fenced(sketch_of(program)), fenced(wrong_transpose(program))]
    out = tmp_path / "mha.tl"
    status, output = gen("MHA", "-o", str(out), "--no-build")
    assert status == 0, output
    assert len(endpoint_env.received) == 2  # a unique transpose fix needs no round trip
    assert "needs '.T' here" in output and "remark" in output
    assert api.check_source(out.read_text(), out.name).ok


def test_syntax_error_fixed_in_a_later_round(endpoint_env, gen, tmp_path):
    program = spec_text()
    broken, line = syntax_error(program)
    endpoint_env.script = [fenced(sketch_of(program)), fenced(broken), fenced(program)]
    out = tmp_path / "mha.tl"
    status, output = gen("MHA", "-o", str(out), "--no-build")
    assert status == 0, output
    assert "3 LLM call(s), 1 repair round(s)" in output
    repair = endpoint_env.received[2].body["messages"]
    assert [m["role"] for m in repair] == ["system", "user", "assistant", "user"]
    assert f"mha.tl:{line}:" in repair[3]["content"] and "error:" in repair[3]["content"]
    assert out.read_text().strip() == program.strip()


def test_several_blocks_pick_the_one_that_parses(endpoint_env, gen, tmp_path):
    program = spec_text()
    broken, _ = syntax_error(program)
    mixed = f"First try:\n```tl\n{broken}```\nActually, corrected:\n```\n{program}```\n```python\nprint(1)\n```"
    endpoint_env.script = [fenced(sketch_of(program)), answer(mixed)]
    out = tmp_path / "mha.tl"
    status, output = gen("MHA", "-o", str(out), "--no-build")
    assert status == 0, output
    assert out.read_text().strip() == program.strip()


def test_garbage_answers_exhaust_the_rounds(endpoint_env, gen, tmp_path):
    endpoint_env.script = [answer("I am sorry, I cannot write kernels.")] * 3
    out = tmp_path / "mha.tl"
    status, output = gen("MHA", "-o", str(out), "--max-rounds", "2")
    assert status == 1 and not out.exists()
    line = one_error_line(output)
    assert "sketch: no valid TL after 3 answer(s)" in line and "no TL code block" in line
    assert transcript_of(out)["outcome"]["status"] == "failed"
    assert "exactly one" in endpoint_env.received[1].body["messages"][3]["content"]


@pytest.mark.parametrize(
    "reply, message",
    [
        (Reply(200, completion("```tl\nParam BM = 1\n```")[:50]), "not valid JSON"),
        (Reply(200, json.dumps({"id": "x", "choices": []})), "empty choice list"),
        (Reply(200, "<html>gateway</html>"), "not valid JSON"),
        (Reply(500, '{"error": "boom"}'), "HTTP 500"),
    ],
    ids=["truncated-json", "empty-choices", "garbage-body", "server-error"],
)
def test_endpoint_failures_are_one_line(endpoint_env, gen, tmp_path, reply, message):
    endpoint_env.script = [reply] * 2
    out = tmp_path / "mha.tl"
    status, output = gen("MHA", "-o", str(out), "--retries", "1")
    assert status == 1 and not out.exists()
    assert message in one_error_line(output)
    record = transcript_of(out)
    assert len(record["exchanges"]) == 2 and record["outcome"]["status"] == "failed"


def test_slow_server_times_out(endpoint_env, gen, tmp_path):
    endpoint_env.script = [Reply(200, completion("late"), delay_s=3.0)] * 2
    out = tmp_path / "mha.tl"
    status, output = gen("MHA", "-o", str(out), "--retries", "1", "--timeout", "0.1")
    assert status == 1
    assert "timeout: no reply from" in one_error_line(output)


def test_429_then_success(endpoint_env, gen, tmp_path):
    program = spec_text()
    endpoint_env.script = [Reply(429, '{"error": "rate"}'), *good_script(program)]
    out = tmp_path / "mha.tl"
    status, output = gen("MHA", "-o", str(out), "--no-build")
    assert status == 0, output
    assert [e.get("response", {}).get("status") for e in transcript_of(out)["exchanges"]] == [429, 200, 200]


def test_existing_output_is_kept_without_force(endpoint_env, gen, tmp_path):
    out = tmp_path / "mha.tl"
    out.write_text("mine\n")
    status, output = gen("MHA", "-o", str(out))
    assert status == 1 and "already exists; pass --force" in one_error_line(output)
    assert out.read_text() == "mine\n" and endpoint_env.received == []  # nothing spent
    endpoint_env.script = good_script(spec_text())
    status, output = gen("MHA", "-o", str(out), "--force", "--no-build")
    assert status == 0, output
    assert out.read_text().strip() == spec_text().strip()


def test_key_never_leaks(endpoint_env, gen, tmp_path):
    program = spec_text()
    endpoint_env.script = [Reply(500, json.dumps({"error": f"bad key {SECRET}"})), fenced(sketch_of(program)),
                           answer(f"{SECRET}\n```tl\n{program}```")]
    out = tmp_path / "mha.tl"
    status, output = gen("MHA", "-o", str(out), "--no-build")
    assert status == 0, output
    assert endpoint_env.received[0].headers["Authorization"] == f"Bearer {SECRET}"
    for path in tmp_path.iterdir():
        assert SECRET not in path.read_text(), path
    assert SECRET not in output
    endpoint_env.script = [Reply(401, f"key {SECRET} rejected")]
    status, output = gen("MHA", "-o", str(tmp_path / "x.tl"))
    assert status == 1 and SECRET not in output and "[REDACTED]" in one_error_line(output)


def test_replay_is_byte_for_byte_and_offline(endpoint_env, gen, tmp_path, monkeypatch):
    program = spec_text()
    broken, _ = syntax_error(program)
    endpoint_env.script = [Reply(429, "{}"), fenced(sketch_of(program)), fenced(broken), fenced(program)]
    live = tmp_path / "live" / "mha.tl"
    status, output = gen("GQA, causal, head dim 128, bf16", "-o", str(live), "--no-build", "--seed", "3")
    assert status == 0, output
    recorded = live.with_name("mha.tl.transcript.json")
    for var in ("TLC_LLM_BASE_URL", "TLC_LLM_MODEL", "TLC_LLM_API_KEY"):
        monkeypatch.delenv(var)  # offline: no endpoint at all
    served = len(endpoint_env.received)
    again = tmp_path / "again" / "other.tl"  # another name: diagnostics still say mha.tl, as recorded
    status, output = gen("--replay", str(recorded), "-o", str(again), "--no-build")
    assert status == 0, output
    assert len(endpoint_env.received) == served
    assert again.read_bytes() == live.read_bytes()
    assert again.with_name("other.tl.transcript.json").read_bytes() == recorded.read_bytes()


def test_replay_detects_divergence(endpoint_env, gen, tmp_path):
    program = spec_text()
    endpoint_env.script = good_script(program)
    live = tmp_path / "mha.tl"
    assert gen("MHA", "-o", str(live), "--no-build")[0] == 0
    recorded = live.with_name("mha.tl.transcript.json")
    data = json.loads(recorded.read_text())
    data["exchanges"][1]["request"]["messages"][1]["content"] += " (edited)"
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(data))
    status, output = gen("--replay", str(edited), "-o", str(tmp_path / "r.tl"), "--no-build")
    assert status == 1
    assert "replay diverged at request #2 (parameters/round-0): request.messages[1].content" in one_error_line(output)
    status, output = gen("--replay", str(recorded), "MHA", "-o", str(tmp_path / "r2.tl"))
    assert status == 1 and "drop request" in one_error_line(output)
    (tmp_path / "junk.json").write_text("{not json")
    status, output = gen("--replay", str(tmp_path / "junk.json"), "-o", str(tmp_path / "r3.tl"))
    assert status == 1 and "is not valid JSON (line 1, column 2)" in one_error_line(output)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["MHA", "--target", "sm_99"], "unknown target 'sm_99'"),
        (["MHA on sm_80", "--target", "sm_90"], "names target sm_80 but --target is sm_90"),
        ([""], "empty request"),
        (["MHA", "-D", "oops"], "-D expects NAME=VALUE"),
        (["MHA", "--eval", "0"], "--eval N needs 1 <= N <= 1000"),
        (["MHA", "--vanilla", "--translate", "llm"], "applies to the TL workflow only"),
        (["MHA", "--max-rounds", "-1"], "--max-rounds must be >= 0"),
    ],
)
def test_bad_usage_is_one_line(endpoint_env, gen, tmp_path, argv, message):
    status, output = gen(*argv, "-o", str(tmp_path / "x.tl"))
    assert status == 1 and message in one_error_line(output)
    assert endpoint_env.received == []


def test_no_endpoint_configured(gen, tmp_path, monkeypatch):
    for var in ("TLC_LLM_BASE_URL", "TLC_LLM_MODEL", "TLC_LLM_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    status, output = gen("MHA", "-o", str(tmp_path / "x.tl"))
    assert status == 1 and "no endpoint: pass --base-url or set TLC_LLM_BASE_URL" in one_error_line(output)


def test_replay_without_output_uses_the_recorded_name(endpoint_env, gen, tmp_path, monkeypatch):
    program = spec_text()
    endpoint_env.script = good_script(program)
    live = tmp_path / "live" / "mine.tl"
    assert gen("MHA", "-o", str(live), "--no-build")[0] == 0
    monkeypatch.chdir(tmp_path)
    status, output = gen("--replay", str(live) + ".transcript.json", "--no-build")
    assert status == 0, output
    assert (tmp_path / "mine.tl").read_bytes() == live.read_bytes()
    status, output = gen("--replay", str(live) + ".transcript.json", "--no-build")
    assert status == 1 and "mine.tl already exists; pass --force" in one_error_line(output)
