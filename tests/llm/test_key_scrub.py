"""The API key never gets out, even when the endpoint echoes it JSON-escaped (`\\u0073k-…`, `\\/`)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from loopback import Reply, completion, one_error_line
from scripts import sketch_of, spec_text

api = pytest.importorskip("tlc.api", reason="tlc's frontend (tlc.api) is not there yet")

REDACTED = "[REDACTED]"
KEY = "sk-proj/Te5t+Key-9a7f_do-not-leak"  # a '/' so that `\/` is a spelling too
PLACEHOLDER = "KEYGOESHERE"


def every_char_u(key: str) -> str:
    return "".join(f"\\u{ord(c):04x}" for c in key)


def some_chars_u_upper(key: str) -> str:
    return "".join(f"\\u{ord(c):04X}" if i % 2 == 0 else c for i, c in enumerate(key))


def first_char_u(key: str) -> str:
    return f"\\u{ord(key[0]):04x}" + key[1:].replace("/", "\\/")


def slash_escaped(key: str) -> str:
    return key.replace("/", "\\/")


def escaped_twice(key: str) -> str:
    """The key inside a JSON string inside a JSON string: `\\\\u0073…`."""
    return json.dumps(every_char_u(key))[1:-1]


SPELLINGS = [every_char_u, some_chars_u_upper, first_char_u, slash_escaped, escaped_twice]
IDS = [f.__name__ for f in SPELLINGS]


def unescaped(text: str) -> str:
    """Undo `\\uXXXX` and `\\/` at any depth, independently of tlc_llm's own pattern."""
    while True:
        plain = re.sub(r"\\+u([0-9a-fA-F]{4})", lambda m: chr(int(m.group(1), 16)), text)
        plain = re.sub(r"\\+/", "/", plain)
        if plain == text:
            return text
        text = plain


def assert_no_key(text: str, where: str) -> None:
    assert KEY not in text, where
    assert KEY not in unescaped(text), f"{where}: the key, escaped"


def assert_nowhere(output: str, root: Path) -> None:
    assert_no_key(output, "stdout/stderr")
    files = [p for p in root.rglob("*") if p.is_file()]
    assert files, "the run wrote nothing to check"
    for path in files:
        assert_no_key(path.read_text(encoding="utf-8", errors="replace"), str(path))


def echoing(template: str, spell) -> Reply:
    """A body echoing the bearer token the request carried, spelled by `spell`."""
    return Reply(200, echo_key=lambda token: template.replace(PLACEHOLDER, spell(token)))


def with_status(status: int, reply: Reply) -> Reply:
    return Reply(status, echo_key=reply.echo_key)


@pytest.fixture
def keyed(endpoint_env, monkeypatch):
    monkeypatch.setenv("TLC_LLM_API_KEY", KEY)
    return endpoint_env


@pytest.mark.parametrize("spell", SPELLINGS, ids=IDS)
def test_redact_matches_every_spelling(spell):
    from tlc_llm.redact import redact

    body = '{"a": "x ' + spell(KEY) + ' y"}'
    cleaned = redact(body, KEY)
    assert_no_key(cleaned, "redacted")
    assert REDACTED in json.loads(cleaned)["a"]  # still valid JSON


@pytest.mark.parametrize("spell", SPELLINGS, ids=IDS)
def test_key_escaped_in_a_chat_answer(keyed, gen, tmp_path, spell):
    """The key in the prose around the code: shown and recorded redacted; the program is written as sent."""
    program = spec_text()
    content = f"Your key is {PLACEHOLDER}.\n```tl\n{program}```"
    keyed.script = [echoing(completion(f"```tl\n{sketch_of(program)}```"), spell), echoing(completion(content), spell)]
    out = tmp_path / "mha.tl"
    status, output = gen("MHA", "-o", str(out), "--no-build")
    assert status == 0, output
    assert keyed.received[0].headers["Authorization"] == f"Bearer {KEY}"
    assert out.read_text().strip() == program.strip()
    assert REDACTED in Path(f"{out}.transcript.json").read_text()
    assert_nowhere(output, tmp_path)


@pytest.mark.parametrize("spell", SPELLINGS, ids=IDS)
def test_key_in_the_accepted_program_is_not_written(keyed, gen, tmp_path, spell):
    """A program is written exactly as it was checked, so one that holds the key is not written at all."""
    program = spec_text()
    commented = f"# reviewed with key {PLACEHOLDER}\n{program}"
    keyed.script = [echoing(completion(f"```tl\n{sketch_of(program)}```"), spell),
                    echoing(completion(f"```tl\n{commented}```"), spell)]
    out = tmp_path / "mha.tl"
    status, output = gen("MHA", "-o", str(out), "--no-build")
    assert status == 1 and "contains the API key" in one_error_line(output)
    assert not out.exists()
    assert_nowhere(output, tmp_path)


@pytest.mark.parametrize("spell", SPELLINGS, ids=IDS)
@pytest.mark.parametrize("status", [400, 500])
def test_key_escaped_in_an_error_body(keyed, gen, tmp_path, spell, status):
    error = echoing(json.dumps({"error": {"message": f"invalid api key {PLACEHOLDER}"}}), spell)
    keyed.script = [with_status(status, error)] * 2
    out = tmp_path / "mha.tl"
    code, output = gen("MHA", "-o", str(out), "--retries", "1")
    assert code == 1 and f"HTTP {status}" in one_error_line(output)
    assert_nowhere(output, tmp_path)


@pytest.mark.parametrize("spell", SPELLINGS, ids=IDS)
def test_key_escaped_in_a_json_field(keyed, gen, tmp_path, spell):
    """In an error object that tlc gen decodes and quotes, and in fields of a good reply (a key, a value)."""
    quoted = echoing(json.dumps({"error": {"code": "auth", "api_key": PLACEHOLDER}}), spell)
    program = spec_text()
    good = json.loads(completion(f"```tl\n{sketch_of(program)}```"))
    good["id"] = PLACEHOLDER
    good["usage"] = {PLACEHOLDER: 1}
    keyed.script = [quoted, echoing(json.dumps(good), spell), echoing(completion(f"```tl\n{program}```"), spell)]
    out = tmp_path / "mha.tl"
    status, output = gen("MHA", "-o", str(out), "--no-build")
    assert status == 0, output
    assert_nowhere(output, tmp_path)
    keyed.script = [quoted] * 2
    status, output = gen("MHA", "-o", str(tmp_path / "again.tl"), "--retries", "1")
    assert status == 1 and "endpoint reported an error" in one_error_line(output)
    assert_nowhere(output, tmp_path)


LONG_KEY = "sk-0123456789abcdef"


@pytest.mark.parametrize("key", ["1", "BN", LONG_KEY])
def test_replies_are_parsed_as_sent_whatever_the_key(endpoint_env, gen, tmp_path, monkeypatch, key):
    """Redaction is for what is shown and recorded: a key `1` (in every `"prompt_tokens": 1`) or `BN` (a Param
    of the program) is never cut out of a reply before it is parsed, so every key gives the same program."""
    monkeypatch.setenv("TLC_LLM_API_KEY", key)
    program = spec_text()
    assert "Param BN" in program and '"prompt_tokens": 1' in completion("x")
    endpoint_env.script = [echoing(completion(f"Key {PLACEHOLDER}.\n```tl\n{sketch_of(program)}```"), str),
                           echoing(completion(f"Key {PLACEHOLDER}.\n```tl\n{program}```"), str)]
    out = tmp_path / "mha.tl"
    status, output = gen("MHA", "-o", str(out), "--no-build")
    assert status == 0, output
    assert out.read_text().strip() == program.strip()
    assert api.check_source(out.read_text(), out.name).ok
    transcript = Path(f"{out}.transcript.json").read_text()
    if key == LONG_KEY:
        assert key not in output and key not in unescaped(transcript) and REDACTED in transcript
    else:  # too short to redact (MIN_SECRET_CHARS): the transcript keeps the replies as they came
        assert REDACTED not in transcript and f"Key {key}." in transcript


def test_keys_shorter_than_eight_characters_are_not_redacted():
    from tlc_llm.redact import MIN_SECRET_CHARS, redact, redact_body

    assert MIN_SECRET_CHARS == 8
    body = '{"index": 1, "text": "abcdefg abcdefgh"}'
    assert redact(body, "1") == body and redact_body(body, "abcdefg") == body
    assert redact(body, "abcdefgh") == '{"index": 1, "text": "abcdefg [REDACTED]"}'
