"""The provider against a real loopback HTTP server: retries, timeouts, malformed replies, the key."""
from __future__ import annotations

import json
import socket

import pytest
from conftest import SECRET
from loopback import Reply, answer, completion

from tlc_llm.client import ChatClient, ChatSettings, ProviderError
from tlc_llm.transcript import Transcript
from tlc_llm.transport import HttpTransport

MESSAGES = [{"role": "user", "content": "hello"}]


def make_client(server, *, retries: int = 2, timeout: float = 2.0, key: str | None = SECRET, seed=7):
    sleeps: list[float] = []
    transcript = Transcript({"request": "test", "target": "sm_90"}, secret=key)
    client = ChatClient(
        HttpTransport(server.base_url, key, timeout),
        ChatSettings(model="m", temperature=0.5, seed=seed, max_retries=retries, backoff_s=0.01),
        transcript.record, sleeps.append,
    )
    return client, transcript, sleeps


def test_answer_payload_and_auth(server):
    server.script = [answer("hi there")]
    client, transcript, _ = make_client(server)
    assert client.complete(MESSAGES, "t") == "hi there"
    (got,) = server.received
    assert got.path == "/v1/chat/completions"
    assert got.headers["Authorization"] == f"Bearer {SECRET}"
    assert got.body == {"model": "m", "messages": MESSAGES, "temperature": 0.5, "seed": 7}
    assert SECRET not in transcript.dump()


def test_no_key_sends_no_authorization(server):
    server.script = [answer("ok")]
    client, _, _ = make_client(server, key=None, seed=None)
    client.complete(MESSAGES, "t")
    assert "Authorization" not in server.received[0].headers
    assert "seed" not in server.received[0].body


def test_429_then_success_honours_retry_after(server):
    server.script = [Reply(429, '{"error": "slow down"}', headers={"Retry-After": "0.05"}), answer("done")]
    client, transcript, sleeps = make_client(server)
    assert client.complete(MESSAGES, "t") == "done"
    assert len(server.received) == 2 and client.calls == 2
    assert sleeps == [pytest.approx(0.05)]
    assert [e["response"]["status"] for e in transcript.exchanges] == [429, 200]


def test_5xx_exhausts_bounded_retries(server):
    server.script = [Reply(503, "busy")] * 3
    client, _, sleeps = make_client(server, retries=2)
    with pytest.raises(ProviderError, match=r"after 3 attempt\(s\); last: HTTP 503: busy"):
        client.complete(MESSAGES, "sketch/round-0")
    assert len(server.received) == 3
    assert sleeps == [pytest.approx(0.01), pytest.approx(0.02)]  # exponential backoff


def test_client_error_is_not_retried(server):
    server.script = [Reply(401, json.dumps({"error": f"invalid api key {SECRET}"})), answer("never")]
    client, transcript, _ = make_client(server)
    with pytest.raises(ProviderError) as info:
        client.complete(MESSAGES, "t")
    assert "HTTP 401" in str(info.value)
    assert SECRET not in str(info.value)  # the server echoed it; we must not
    assert SECRET not in transcript.dump()
    assert len(server.received) == 1


@pytest.mark.parametrize(
    "body, message",
    [
        ("<html>502 Bad Gateway</html>", "not valid JSON"),
        (completion("x")[:40], "not valid JSON"),
        (json.dumps({"choices": []}), "empty choice list"),
        (json.dumps({"choices": [{"message": {"content": None}}]}), "no message content"),
        (json.dumps([1, 2]), "not a JSON object"),
    ],
    ids=["garbage", "truncated", "empty-choices", "null-content", "not-object"],
)
def test_malformed_replies_fail_clearly(server, body, message):
    server.script = [Reply(200, body)] * 2
    client, _, _ = make_client(server, retries=1)
    with pytest.raises(ProviderError, match=message):
        client.complete(MESSAGES, "t")
    assert len(server.received) == 2


def test_truncated_then_good_recovers(server):
    server.script = [Reply(200, completion("x")[:25]), answer("whole")]
    client, _, _ = make_client(server)
    assert client.complete(MESSAGES, "t") == "whole"


def test_slow_server_times_out(server):
    server.script = [Reply(200, completion("late"), delay_s=2.0)] * 2
    client, transcript, _ = make_client(server, retries=1, timeout=0.1)
    with pytest.raises(ProviderError, match=r"timeout: no reply from http://127\.0\.0\.1:\d+/v1/chat/completions within 0\.1 s"):
        client.complete(MESSAGES, "t")
    assert [e["error"]["kind"] for e in transcript.exchanges] == ["timeout", "timeout"]


def test_slow_then_fast_recovers(server):
    server.script = [Reply(200, completion("late"), delay_s=2.0), answer("on time")]
    client, _, _ = make_client(server, retries=1, timeout=0.2)
    assert client.complete(MESSAGES, "t") == "on time"


def test_dropped_connection_is_retried(server):
    server.script = [Reply(drop=True), answer("back")]
    client, transcript, _ = make_client(server)
    assert client.complete(MESSAGES, "t") == "back"
    assert transcript.exchanges[0]["error"]["kind"] == "connection"


def test_connection_refused_is_one_clear_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed when the block ends: nothing listens there
    transport = HttpTransport(f"http://127.0.0.1:{port}/v1/?key={SECRET}", SECRET, 1.0)
    client = ChatClient(transport, ChatSettings(model="m", max_retries=1), None, lambda s: None)
    with pytest.raises(ProviderError) as info:
        client.complete(MESSAGES, "t")
    text = str(info.value)
    assert "connection" in text and "\n" not in text
    assert SECRET not in text and "[REDACTED]" in text
