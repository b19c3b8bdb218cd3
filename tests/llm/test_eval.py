"""`tlc gen --eval N`: N samples per variant, each its own seed, .tl and replayable transcript."""
from __future__ import annotations

import json

import pytest
from loopback import answer, fenced, one_error_line
from scripts import sketch_of, spec_text

pytest.importorskip("tlc.api", reason="tlc's frontend (tlc.api) is not there yet")


def test_eval_counts_and_keeps_every_sample(endpoint_env, gen, tmp_path):
    program = spec_text()
    endpoint_env.script = [fenced(sketch_of(program)), fenced(program), answer("no idea")]
    out_dir = tmp_path / "eval"
    status, output = gen("MHA, head dim 128", "--eval", "2", "--no-build", "--max-rounds", "0",
                         "--transcript-dir", str(out_dir), "--seed", "10")
    assert status == 0, output
    assert "mha: 1/2 pass tlc check (not built: --no-build)" in output
    assert [r.body["seed"] for r in endpoint_env.received] == [10, 10, 11]  # one seed per sample
    summary = json.loads((out_dir / "eval.json").read_text())
    assert summary["llm_calls"] == 3 and summary["variants"]["mha"]["compiled"] == 1
    assert "no valid TL after 1 answer(s)" in summary["variants"]["mha"]["failures"][0]
    stem = "mha_full_d128_bf16"
    assert (out_dir / f"{stem}-s0.tl").read_text().strip() == program.strip()
    assert not (out_dir / f"{stem}-s1.tl").exists()
    assert json.loads((out_dir / f"{stem}-s1.tl.transcript.json").read_text())["outcome"]["status"] == "failed"


def test_an_eval_sample_replays_alone(endpoint_env, gen, tmp_path, monkeypatch):
    program = spec_text()
    endpoint_env.script = [fenced(sketch_of(program)), fenced(program)]
    out_dir = tmp_path / "eval"
    assert gen("GQA causal", "--eval", "1", "--no-build", "--transcript-dir", str(out_dir))[0] == 0
    monkeypatch.delenv("TLC_LLM_BASE_URL")
    sample = out_dir / "gqa_causal_d128_bf16-s0.tl"
    again = tmp_path / "again.tl"
    status, output = gen("--replay", str(sample) + ".transcript.json", "-o", str(again), "--no-build")
    assert status == 0, output
    assert again.read_bytes() == sample.read_bytes()


def test_eval_all_variants(endpoint_env, gen, tmp_path):
    endpoint_env.script = [answer("nothing")] * 5
    status, output = gen("all variants, bf16", "--eval", "1", "--no-build", "--max-rounds", "0",
                         "--transcript-dir", str(tmp_path))
    assert status == 0, output
    for variant in ("mha", "gqa", "mqa", "mla_prefill", "mla_decode"):
        assert f"{variant}: 0/1 pass tlc check" in output
    assert len(endpoint_env.received) == 5


def test_eval_replaces_nothing_without_force(endpoint_env, gen, tmp_path):
    """eval.json and a sample's transcript may be the user's (an earlier evaluation): kept, before any call."""
    out_dir = tmp_path / "eval"
    out_dir.mkdir()
    (out_dir / "eval.json").write_text("earlier results\n")
    status, output = gen("MHA", "--eval", "1", "--no-build", "--transcript-dir", str(out_dir))
    assert status == 1 and "eval.json already exists; pass --force" in one_error_line(output)
    assert (out_dir / "eval.json").read_text() == "earlier results\n" and endpoint_env.received == []
    (out_dir / "eval.json").unlink()
    stem = "mha_full_d128_bf16-s0"
    (out_dir / f"{stem}.cubin").write_text("earlier build\n")
    status, output = gen("MHA", "--eval", "1", "--transcript-dir", str(out_dir))
    assert status == 1 and f"{stem}.cubin already exists (tlc build would replace it)" in one_error_line(output)
    assert endpoint_env.received == []
    old_transcript = out_dir / f"{stem}.tl.transcript.json"
    old_transcript.write_text("earlier transcript\n")
    program = spec_text()
    endpoint_env.script = [fenced(sketch_of(program)), fenced(program)]
    status, output = gen("MHA", "--eval", "1", "--no-build", "--transcript-dir", str(out_dir))
    assert status == 0, output
    assert old_transcript.read_text() == "earlier transcript\n"
    assert json.loads((out_dir / f"{stem}-1.tl.transcript.json").read_text())["outcome"]["status"] == "ok"


def test_eval_takes_no_output_name(endpoint_env, gen, tmp_path):
    status, output = gen("MHA", "--eval", "1", "-o", str(tmp_path / "x.tl"))
    assert status == 1 and "--eval writes one file per sample into --transcript-dir" in one_error_line(output)
