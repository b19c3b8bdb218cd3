"""One wall-clock deadline per request, and a time budget per model call: no endpoint hangs tlc gen."""
from __future__ import annotations

import json
import time

import pytest
from conftest import SECRET
from loopback import Reply, completion, one_error_line

from tlc_llm.client import ChatClient, ChatSettings, ProviderError
from tlc_llm.transcript import Transcript
from tlc_llm.transport import HttpTransport, TransportError

MESSAGES = [{"role": "user", "content": "hello"}]
SILENT = Reply(200, completion("never sent"), delay_s=600)  # accepts, reads the request, never answers


def trickling(headers: bool) -> Reply:
    return Reply(200, completion("a long answer " * 20), trickle_s=0.25, trickle_headers=headers)


@pytest.mark.parametrize("headers", [False, True], ids=["body", "headers-and-body"])
def test_a_trickle_cannot_reset_the_deadline(server, headers):
    """A byte every 0.25 s never trips a per-read socket timeout; the request's deadline does."""
    server.script = [trickling(headers)]
    transport = HttpTransport(server.base_url, SECRET, 1.0)
    start = time.monotonic()
    with pytest.raises(TransportError) as info:
        transport.post({"model": "m", "messages": MESSAGES})
    assert time.monotonic() - start < 2.0
    assert info.value.kind == "timeout" and "within 1 s" in info.value.message


def test_a_short_budget_shortens_the_request(server):
    server.script = [SILENT]
    transport = HttpTransport(server.base_url, SECRET, 30.0)
    start = time.monotonic()
    with pytest.raises(TransportError, match="within 0.5 s"):
        transport.post({"model": "m", "messages": MESSAGES}, timeout_s=0.5)
    assert time.monotonic() - start < 1.5


def test_the_call_budget_stops_retries_and_is_recorded(server):
    server.script = [SILENT] * 5
    transcript = Transcript({"request": "test", "target": "sm_90"})
    client = ChatClient(HttpTransport(server.base_url, SECRET, 0.6),
                        ChatSettings(model="m", max_retries=4, backoff_s=0.0, budget_s=1.5), transcript.record)
    start = time.monotonic()
    with pytest.raises(ProviderError) as info:
        client.complete(MESSAGES, "t")
    assert time.monotonic() - start < 2.5
    message = str(info.value)
    assert "the 1.5 s budget for one call, retries included, is spent" in message and "--total-timeout" in message
    kinds = [e["error"]["kind"] for e in transcript.exchanges]
    assert kinds[-1] == "budget" and set(kinds[:-1]) == {"timeout"} and client.calls == len(kinds) - 1


def test_trickling_endpoint_gives_up_within_the_timeout(endpoint_env, gen, tmp_path):
    endpoint_env.script = [Reply(200, completion("slow " * 100), trickle_s=1.0)]
    start = time.monotonic()
    status, output = gen("MHA", "-o", str(tmp_path / "mha.tl"), "--timeout", "2", "--retries", "0")
    assert time.monotonic() - start < 5.0
    line = one_error_line(output)
    assert status == 1 and f"no reply from {endpoint_env.base_url}/chat/completions within 2 s" in line
    assert "--timeout" in line


def test_silent_endpoint_gives_up_within_timeout_times_attempts(endpoint_env, gen, tmp_path):
    endpoint_env.script = [SILENT] * 3
    start = time.monotonic()
    status, output = gen("MHA", "-o", str(tmp_path / "mha.tl"), "--timeout", "1", "--retries", "2")
    elapsed = time.monotonic() - start
    assert 2.9 < elapsed < 1 * (2 + 1) + 1.5
    line = one_error_line(output)
    assert status == 1 and "after 3 attempt(s)" in line and endpoint_env.base_url in line
    assert "did not answer in time" in line and "raise --timeout" in line


def test_total_timeout_caps_a_dead_endpoint_and_replays_the_same(endpoint_env, gen, tmp_path, monkeypatch):
    endpoint_env.script = [SILENT] * 4
    out = tmp_path / "live" / "mha.tl"
    start = time.monotonic()
    status, output = gen("MHA", "-o", str(out), "--timeout", "1", "--total-timeout", "1.5", "--retries", "3")
    assert time.monotonic() - start < 2.5
    line = one_error_line(output)
    assert status == 1 and "1.5 s budget for one call" in line and "--total-timeout" in line
    recorded = out.with_name("mha.tl.transcript.json")
    assert json.loads(recorded.read_text())["exchanges"][-1]["error"]["kind"] == "budget"
    for var in ("TLC_LLM_BASE_URL", "TLC_LLM_MODEL", "TLC_LLM_API_KEY"):
        monkeypatch.delenv(var)
    again = tmp_path / "again" / "mha.tl"
    status, replayed = gen("--replay", str(recorded), "-o", str(again))
    assert status == 1 and one_error_line(replayed) == line  # stops where the live run's budget ran out
    assert again.with_name("mha.tl.transcript.json").read_bytes() == recorded.read_bytes()


def test_help_states_the_timeouts(capsys):
    from tlc_llm.cli import main

    assert main(["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--timeout S" in text and "(default 120)" in text
    assert "--total-timeout S" in text and "(default 300, or --timeout if larger)" in text


@pytest.mark.parametrize("flag", ["--timeout", "--total-timeout"])
def test_timeouts_must_be_positive(endpoint_env, gen, tmp_path, flag):
    status, output = gen("MHA", "-o", str(tmp_path / "x.tl"), flag, "0")
    assert status == 1 and f"{flag} must be > 0 and at most 86400 seconds" in one_error_line(output)
    assert endpoint_env.received == []
