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
    program = spec_text()
    commented = f"# reviewed with key {PLACEHOLDER}\n{program}"
    content = f"Your key is {PLACEHOLDER}.\n```tl\n{commented}```"
    keyed.script = [echoing(completion(f"```tl\n{sketch_of(program)}```"), spell), echoing(completion(content), spell)]
    out = tmp_path / "mha.tl"
    status, output = gen("MHA", "-o", str(out), "--no-build")
    assert status == 0, output
    assert keyed.received[0].headers["Authorization"] == f"Bearer {KEY}"
    assert REDACTED in out.read_text()  # the comment survived, the key did not
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
