"""Hardening regressions of the stream endpoints, end to end (real server, real WebSocket, real audio)."""
from __future__ import annotations

import json
import threading

import websockets

from pipeline.audio import SAMPLE_RATE
from server.worker import PARTIAL
from server_testkit import eventually, pcm16

STOP = json.dumps({"type": "stop"})


async def test_replaced_partials_are_not_held_by_the_connection(serve_test_server, speech):
    """While the model is busy, each new partial replaces the waiting one in the worker; the connection
    must forget the replaced ones too (each holds up to --partial-window of audio), or a long stream under
    load grows without bound until it ends."""
    gate = threading.Event()
    audio = speech.audio  # three utterances: fewer finals than MAX_FINALS_IN_FLIGHT, so all is read
    async with serve_test_server(partial_interval=0.1) as url:
        url.server.engine.fault_hook = lambda call: gate.wait(60)
        async with websockets.connect(url) as ws:
            await ws.send(json.dumps({"type": "start", "sample_rate": SAMPLE_RATE}))
            data = pcm16(audio)
            for i in range(0, len(data), 3200):
                await ws.send(data[i:i + 3200])
            (connection,) = url.server.connections
            received = lambda: connection.session.received_seconds if connection.session else 0.0  # noqa: E731
            await eventually(lambda: received() >= len(audio) / SAMPLE_RATE - 0.01, 60)
            held = [job for job in connection._jobs if job.kind == PARTIAL]
            assert len(held) <= 2, len(held)  # the one the model runs, the one waiting
            gate.set()
            await ws.send(STOP)
            messages = [json.loads(m) async for m in ws]
    finals = [m for m in messages if m["type"] == "final"]
    assert [f["segment"] for f in finals] == list(range(len(speech.utterances)))
    assert messages[-1] == {"type": "done", "segments": len(finals)}
