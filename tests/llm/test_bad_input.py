"""Bad replies, bad flags and terminal control bytes: one `tlc gen: error:` line in tlc's words,
exit status 1 (2 for a command line that does not parse), never an internal error or a traceback."""
from __future__ import annotations

import json

import pytest
from loopback import Reply, completion, fenced, one_error_line
from scripts import sketch_of, spec_text

pytest.importorskip("tlc.api", reason="tlc's frontend (tlc.api) is not there yet")

CONTROLS = "\x1b[2J\x1b]0;owned\x07\r\x9b31m\x7f\x00"  # clear screen, retitle, CR, C1 CSI, DEL, NUL


def assert_no_controls(output: str) -> None:
    raw = [c for c in CONTROLS if not c.isprintable()]
    assert not any(c in output for c in raw), repr(output)


BAD_REPLIES = {
    "html-page": (Reply(200, "<!DOCTYPE html><html><body>Welcome to nginx!</body></html>"),
                  "not valid JSON but an HTML page"),
    "huge-number": (Reply(200, '{"choices": [], "n": 1' + "0" * 5000 + "}"), "a number too long or nesting too deep"),
    "deep-nesting": (Reply(200, "[" * 100_000), "a number too long or nesting too deep"),
    "content-list": (Reply(200, json.dumps({"choices": [{"message": {"content": [{"type": "text", "text": "x"}]}}]})),
                     "content that is not text (a JSON array)"),
    "content-number": (Reply(200, json.dumps({"choices": [{"message": {"content": 7}}]})),
                       "content that is not text (a JSON number)"),
    "not-utf8": (Reply(200, b"\xff\xfe{\x00"), "not valid JSON"),
}


@pytest.mark.parametrize("reply, message", BAD_REPLIES.values(), ids=BAD_REPLIES.keys())
def test_bad_reply_is_one_line(endpoint_env, gen, tmp_path, reply, message):
    endpoint_env.script = [reply] * 2
    out = tmp_path / "mha.tl"
    status, output = gen("MHA", "-o", str(out), "--retries", "1")
    line = one_error_line(output)
    assert status == 1 and message in line and "internal error" not in line, line
    assert not out.exists()


BAD_FLAGS = {
    "timeout-inf": (["--timeout", "inf"], "--timeout must be > 0 and at most 86400 seconds"),
    "total-timeout-nan": (["--total-timeout", "nan"], "--total-timeout must be > 0"),
    "backoff-negative": (["--backoff", "-1"], "--backoff must be a number of seconds >= 0"),
    "temperature-nan": (["--temperature", "nan"], "--temperature must be a number >= 0"),
    "max-tokens-zero": (["--max-tokens", "0"], "--max-tokens must be >= 1"),
    "eval-huge": (["--eval", "1000000000"], "--eval N needs 1 <= N <= 1000"),
    "define-twice": (["-D", "BM=64", "-D", "BM=128"], "-D BM is given twice (64 and 128); keep one"),
}


@pytest.mark.parametrize("argv, message", BAD_FLAGS.values(), ids=BAD_FLAGS.keys())
def test_bad_flag_is_refused_before_any_call(endpoint_env, gen, tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)  # the default output name is in the current directory
    endpoint_env.script = [Reply(500, "{}")] * 3
    status, output = gen("MHA", *argv, "--retries", "1", "--no-build")
    line = one_error_line(output)
    assert status == 1 and message in line and "internal error" not in line, line
    assert endpoint_env.received == []


def test_command_line_that_does_not_parse_is_one_line(endpoint_env, gen, tmp_path):
    status, output = gen("MHA", "-o", str(tmp_path / "x.tl"), f"extra{CONTROLS}")
    line = one_error_line(output)
    assert status == 2 and "unrecognized arguments: extra\\x1b[2J" in line and "see tlc gen --help" in line
    assert_no_controls(output)
    assert "usage:" not in output


def test_output_in_a_missing_place_is_refused_before_any_call(endpoint_env, gen, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    status, output = gen("MHA", "-o", str(blocker / "x.tl"))
    assert status == 1 and f"{blocker} is not a directory" in one_error_line(output)
    status, output = gen("MHA", "-o", str(tmp_path))
    assert status == 1 and "is a directory; -o names the file to write" in one_error_line(output)
    assert endpoint_env.received == []


def test_output_named_like_a_build_artifact(endpoint_env, gen, tmp_path):
    """`-o k.cu` would be replaced by the build's own k.cu: the TL would be lost after the run."""
    status, output = gen("MHA", "-o", str(tmp_path / "k.cu"))
    assert status == 1 and "name the TL file k.tl" in one_error_line(output)
    assert endpoint_env.received == []


def test_endpoint_error_with_control_bytes(endpoint_env, gen, tmp_path):
    endpoint_env.script = [Reply(404, f"not here{CONTROLS}")]
    status, output = gen("MHA", "-o", str(tmp_path / "x.tl"))
    line = one_error_line(output)
    assert status == 1 and "HTTP 404: not here\\x1b[2J\\x1b]0;owned\\x07" in line
    assert_no_controls(output)


def test_define_with_control_bytes(endpoint_env, gen, tmp_path):
    status, output = gen("MHA", "-o", str(tmp_path / "x.tl"), "-D", f"oops{CONTROLS}")
    assert status == 1 and "-D expects NAME=VALUE, got 'oops\\x1b[2J" in one_error_line(output)
    assert_no_controls(output)


def test_transcript_text_with_control_bytes(endpoint_env, gen, tmp_path):
    """A replay that diverges quotes the recorded label: an edited transcript cannot drive the terminal."""
    program = spec_text()
    endpoint_env.script = [fenced(sketch_of(program)), fenced(program)]
    live = tmp_path / "mha.tl"
    assert gen("MHA", "-o", str(live), "--no-build")[0] == 0
    data = json.loads(live.with_name("mha.tl.transcript.json").read_text())
    data["exchanges"][0]["label"] = f"sketch{CONTROLS}"
    data["exchanges"][0]["request"]["temperature"] = 1.5
    crafted = tmp_path / "crafted.json"
    crafted.write_text(json.dumps(data))
    status, output = gen("--replay", str(crafted), "-o", str(tmp_path / "r.tl"), "--no-build")
    line = one_error_line(output)
    assert status == 1 and "replay diverged at request #1 (sketch\\x1b[2J" in line
    assert_no_controls(output)


def test_model_text_with_control_bytes(endpoint_env, gen, tmp_path):
    """What the model wrote reaches messages through tlc's diagnostics and remarks: escaped there too."""
    program = spec_text()
    endpoint_env.script = [Reply(200, completion(f"```tl\n{sketch_of(program)}```")),
                           Reply(200, completion(f"```tl\n{program}Compute{CONTROLS} X\n```"))]
    status, output = gen("MHA", "-o", str(tmp_path / "x.tl"), "--no-build", "--max-rounds", "0")
    assert status == 1 and "parameters: no valid TL" in one_error_line(output)
    assert_no_controls(output)
