"""A transcript is untrusted input: `tlc gen --replay` writes only where the user says, and refuses a
damaged, edited or foreign transcript in one line (never an internal error, never a traceback)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from loopback import fenced, one_error_line
from scripts import sketch_of, spec_text

pytest.importorskip("tlc.api", reason="tlc's frontend (tlc.api) is not there yet")


@pytest.fixture
def recorded(endpoint_env, gen, tmp_path) -> Path:
    """A real transcript of a good two-call run, recorded under tmp_path/live."""
    program = spec_text()
    endpoint_env.script = [fenced(sketch_of(program)), fenced(program)]
    live = tmp_path / "live" / "mha.tl"
    status, output = gen("MHA", "-o", str(live), "--no-build")
    assert status == 0, output
    return Path(f"{live}.transcript.json")


def edited(recorded: Path, where: Path, change) -> Path:
    data = json.loads(recorded.read_text())
    change(data)
    where.write_text(json.dumps(data))
    return where


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("name", ["../../x.tl", "../x.tl", "sub/x.tl", "<tmp>/abs/x.tl", "..", "a\\b.tl",
                                  "x\x1b[2J.tl", "x" * 300 + ".tl"],
                         ids=["up-two", "up-one", "subdir", "absolute", "dotdot", "backslash", "control", "long"])
def test_replay_writes_no_recorded_path(recorded, gen, tmp_path, monkeypatch, name):
    """Without -o the replay would write the recorded name: only a plain file name is accepted."""
    name = name.replace("<tmp>", str(tmp_path))
    crafted = edited(recorded, tmp_path / "crafted.json", lambda d: d["command"].update(filename=name))
    cwd = tmp_path / "w" / "a" / "b"
    cwd.mkdir(parents=True)
    monkeypatch.chdir(cwd)
    before = files_under(tmp_path)
    status, output = gen("--replay", str(crafted), "--no-build")
    line = one_error_line(output)
    assert status == 1 and f"transcript {crafted}" in line and "not a plain file name" in line
    assert "pass -o PATH" in line and "\x1b" not in output
    assert files_under(tmp_path) == before
    out = tmp_path / "chosen.tl"  # -o is the fix: the recorded name then only names the diagnostics
    status, output = gen("--replay", str(crafted), "-o", str(out), "--no-build")
    assert status == 0, output
    assert out.read_text().strip() == spec_text().strip()
    assert files_under(tmp_path) == before | {out, Path(f"{out}.transcript.json")}


def test_replay_keeps_existing_files(recorded, gen, tmp_path):
    out = tmp_path / "mine.tl"
    out.write_text("mine\n")
    status, output = gen("--replay", str(recorded), "-o", str(out), "--no-build")
    assert status == 1 and "already exists; pass --force" in one_error_line(output)
    assert out.read_text() == "mine\n"
    mine = tmp_path / "other.tl"
    old_transcript = Path(f"{mine}.transcript.json")
    old_transcript.write_text("my notes\n")
    status, output = gen("--replay", str(recorded), "-o", str(mine), "--no-build")
    assert status == 0, output
    assert old_transcript.read_text() == "my notes\n"
    assert tmp_path.joinpath("other-1.tl.transcript.json").read_bytes() == recorded.read_bytes()


def _drop(key: str):
    return lambda d: d.pop(key)


def _set(path: tuple, value):
    def change(data):
        target = data
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return change


DAMAGED = {
    "other-format": (_set(("format",), "tlc-llm-transcript/2"), "has format 'tlc-llm-transcript/2'"),
    "no-format": (_drop("format"), "is not a tlc gen transcript"),
    "no-command": (_drop("command"), "no 'command' object"),
    "exchanges-object": (_set(("exchanges",), {}), "no 'exchanges' list"),
    "endpoint-list": (_set(("endpoint",), [1]), "'endpoint' is not an object"),
    "exchange-list": (_set(("exchanges", 0), [1]), "exchange #1 is not a JSON object"),
    "no-request": (_set(("exchanges", 1, "request"), "x"), "exchange #2 has no request object"),
    "status-text": (_set(("exchanges", 0, "response", "status"), "200"), "not an HTTP status"),
    "body-number": (_set(("exchanges", 0, "response", "body"), 5), "body that is not text"),
    "retry-after-text": (_set(("exchanges", 0, "response", "retry_after"), "soon"), "retry_after"),
    "no-reply": (_set(("exchanges", 0, "response"), None), "neither a response nor an error"),
    "error-kind": (_set(("exchanges", 0, "error"), {"kind": 3}), "error without a text 'kind'"),
    "max-rounds-text": (_set(("command", "max_rounds"), "3"), "'max_rounds' is not a whole number"),
    "retries-negative": (_set(("command", "max_retries"), -1), "'max_retries' is not a whole number >= 0"),
    "defines-list": (_set(("command", "defines"), ["BM=64"]), "'defines' is not an object"),
    "temperature-text": (_set(("command", "temperature"), "hot"), "'temperature' is not a number"),
    "mode-unknown": (_set(("command", "mode"), "python"), "'mode' is not one of tl, vanilla"),
    "filename-number": (_set(("command", "filename"), 5), "'filename' is not text"),
    "request-list": (_set(("command", "request"), ["MHA"]), "'request' is not text"),
}


@pytest.mark.parametrize("change, message", DAMAGED.values(), ids=DAMAGED.keys())
def test_damaged_transcript_is_one_line(recorded, gen, tmp_path, change, message):
    crafted = edited(recorded, tmp_path / "damaged.json", change)
    out = tmp_path / "r.tl"
    status, output = gen("--replay", str(crafted), "-o", str(out), "--no-build")
    line = one_error_line(output)
    assert status == 1 and message in line and str(crafted) in line, line
    assert "internal error" not in line and not out.exists()


RAW = {
    "garbage": (b"{not json", "is not valid JSON (line 1, column 2)"),
    "not-utf8": (b'{"format": "\xff\xfe"}', "is not UTF-8 text"),
    "array": (b"[1, 2]", "is not a tlc gen transcript"),
    "deep": (b"[" * 100_000, "nesting too deep"),
    "huge-number": (b'{"format": 1' + b"0" * 5000 + b"}", "a number too long"),
    "empty": (b"", "is not valid JSON"),
}


@pytest.mark.parametrize("data, message", RAW.values(), ids=RAW.keys())
def test_unreadable_transcript_is_one_line(gen, tmp_path, data, message):
    crafted = tmp_path / "t.json"
    crafted.write_bytes(data)
    status, output = gen("--replay", str(crafted), "-o", str(tmp_path / "r.tl"))
    line = one_error_line(output)
    assert status == 1 and message in line and str(crafted) in line, line
    assert "internal error" not in line and "Expecting" not in line  # tlc's words, not json's


def test_transcript_that_is_a_directory(gen, tmp_path):
    status, output = gen("--replay", str(tmp_path), "-o", str(tmp_path / "r.tl"))
    assert status == 1 and "is a directory; pass the .transcript.json file" in one_error_line(output)
