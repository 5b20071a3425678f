"""Behind the shipped HAProxy (deploy/haproxy.cfg, `option forwardfor`) servers that trust it
(--forwarded-allow-ips 127.0.0.1) lock out the client that guesses tokens, not everyone behind the proxy.
Real HAProxy and three real servers on 127.0.0.1; the two clients connect from 127.0.0.2 and 127.0.0.3."""
from __future__ import annotations

import asyncio
import json

import pytest
import websockets

from bench.cluster import Cluster, haproxy_binary

pytestmark = pytest.mark.skipif(
    haproxy_binary() is None, reason="HAProxy is not installed (Debian: apt-get install haproxy; .ci/run does)")

TOKEN = "s3cret-Tok3n"
FAILURES = 2  # --auth-max-failures: fewer guesses to lock an address out on each of the three servers


async def guess(url: str, source: str, claimed: str) -> int:
    """The HTTP status of a wrong-token handshake from `source` that claims to be forwarded for `claimed`."""
    try:
        async with websockets.connect(f"{url}?token=guess", local_addr=(source, 0),
                                      additional_headers={"X-Forwarded-For": claimed}):
            return 101
    except websockets.InvalidStatus as refused:
        return refused.response.status_code


async def test_a_guessing_client_does_not_lock_out_the_others(test_model_dir):
    options = ("--token", TOKEN, "--auth-max-failures", str(FAILURES), "--forwarded-allow-ips", "127.0.0.1")
    async with Cluster(test_model_dir, max_sessions=4, server_options=options) as cluster:
        url = cluster.balancer.url
        guesses: list[int] = []
        while 429 not in guesses:  # until one server refuses the guesser (each server counts apart)
            # A new made-up address each time does not help: HAProxy appends the real one, which the server reads.
            guesses.append(await guess(url, "127.0.0.2", claimed=f"198.51.100.{len(guesses)}"))
            assert len(guesses) <= 3 * FAILURES + 1, guesses
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

