"""Wrong tokens behind the shipped HAProxy (deploy/haproxy.cfg). The balancer counts them where every
request passes (its stick table), so an address gets the five guesses a minute the docs promise, not five per
server; and servers that trust it (--forwarded-allow-ips 127.0.0.1) lock out the client that guesses, not
everyone behind the proxy (`option forwardfor`). Real HAProxy and three real servers on 127.0.0.1; the
clients connect from 127.0.0.2 and 127.0.0.3."""
from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import websockets

from bench.cluster import Cluster, haproxy_binary

pytestmark = pytest.mark.skipif(
    haproxy_binary() is None, reason="HAProxy is not installed (Debian: apt-get install haproxy; .ci/run does)")

TOKEN = "s3cret-Tok3n"
FAILURES = 2  # --auth-max-failures: fewer guesses to lock an address out on each of the three servers
BALANCER_FAILURES = 5  # deploy/haproxy.cfg's UNIPAD_LB_AUTH_FAILURES default, as the servers' own default


async def refusal(url: str, source: str, claimed: str, token: str = "guess") -> tuple[int, str]:
    """The HTTP status and body of a handshake from `source` with `token` that claims to be forwarded
    for `claimed` (101 and "" when it was accepted)."""
    try:
        async with websockets.connect(f"{url}?token={token}", local_addr=(source, 0),
                                      additional_headers={"X-Forwarded-For": claimed}):
            return 101, ""
    except websockets.InvalidStatus as refused:
        return refused.response.status_code, refused.response.body.decode("utf-8", "replace")


async def transcribe(url: str, source: str, audio) -> list[str]:
    """The finals' texts of one stream from `source` that sends `audio` (float32, 16 kHz) at once."""
    async with websockets.connect(f"{url}?token={TOKEN}", local_addr=(source, 0)) as ws:
        await ws.send(json.dumps({"type": "start", "sample_rate": 16000, "format": "s16le"}))
        assert json.loads(await asyncio.wait_for(ws.recv(), 30))["type"] == "ready"
        await ws.send((np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes())
        await ws.send(json.dumps({"type": "stop"}))
        texts = []
        while (message := json.loads(await asyncio.wait_for(ws.recv(), 60)))["type"] != "done":
            if message["type"] == "final":
                texts.append(message["text"])
        return texts


async def test_the_balancer_refuses_the_sixth_wrong_token_in_a_minute_across_servers(test_model_dir, demo_speech):
    """Three servers with their own default limit (5 wrong tokens each): the guesses spread over them, so no
    server locks the guesser out, and HAProxy's count does, at the sixth; another address streams on."""
    options = ("--token", TOKEN, "--forwarded-allow-ips", "127.0.0.1")
    async with Cluster(test_model_dir, max_sessions=4, server_options=options) as cluster:
        url = cluster.balancer.url
        answers = [await refusal(url, "127.0.0.2", claimed=f"198.51.100.{i}") for i in range(BALANCER_FAILURES + 1)]
        right_token = await refusal(url, "127.0.0.2", "198.51.100.99", token=TOKEN)  # the address is locked
        seen = {name: int(row["stot"]) for name, row in (await cluster.balancer.servers()).items()}
        texts = await transcribe(url, "127.0.0.3", demo_speech.audio)
    statuses = [status for status, _ in answers]
    assert statuses == [401] * BALANCER_FAILURES + [429], answers
    assert "load balancer" in answers[-1][1] and right_token[0] == 429  # HAProxy's answer, not a server's
    assert sum(seen.values()) == BALANCER_FAILURES and max(seen.values()) < BALANCER_FAILURES, seen
    assert texts == [u["text"] for u in demo_speech.utterances]


async def test_a_guessing_client_does_not_lock_out_the_others(test_model_dir):
    """The servers' own count, behind the balancer's (raised here, so a server's lockout comes first)."""
    options = ("--token", TOKEN, "--auth-max-failures", str(FAILURES), "--forwarded-allow-ips", "127.0.0.1")
    async with Cluster(test_model_dir, max_sessions=4, server_options=options,
                       balancer_settings={"UNIPAD_LB_AUTH_FAILURES": "100"}) as cluster:
        url = cluster.balancer.url
        guesses: list[int] = []
        while 429 not in guesses:  # until one server refuses the guesser (each server counts apart)
            # A new made-up address each time does not help: HAProxy appends the real one, which the server reads.
            status, body = await refusal(url, "127.0.0.2", claimed=f"198.51.100.{len(guesses)}")
            guesses.append(status)
            assert len(guesses) <= 3 * FAILURES + 1, guesses
        assert "load balancer" not in body, body  # a server's 429
        # Three streams held open at once: leastconn puts one on each server, the guessers' included.
        others = [await websockets.connect(f"{url}?token={TOKEN}", local_addr=("127.0.0.3", 0)) for _ in range(3)]
        try:
            for ws in others:
                await ws.send(json.dumps({"type": "start"}))
            ready = [json.loads(await asyncio.wait_for(ws.recv(), 30))["type"] for ws in others]
            spread = {name: int(row["scur"]) for name, row in (await cluster.balancer.servers()).items()}
        finally:
            for ws in others:
                await ws.close()
    assert set(guesses[:-1]) == {401} and guesses[-1] == 429
    assert ready == ["ready"] * 3
    assert sorted(spread.values()) == [1, 1, 1], spread

