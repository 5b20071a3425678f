"""The `resume` of a start message on one real server: numbering and times continue the caller's, a
malformed resume is `bad_resume` (1008), and a draining server leaves a resumable stream's open segment
uncut (finals of closed segments, then 1001 without `done`)."""
from __future__ import annotations

import asyncio
import json

import pytest
import websockets

from pipeline.audio import SAMPLE_RATE
from server.protocol import CLOSE_GOING_AWAY, CLOSE_POLICY
from server_testkit import pcm16, run_stream

GOOD = {"session": "abc123", "segment": 5, "time": 3.0}


MALFORMED = [
    ({**GOOD, "extra": 1}, "unknown field(s) extra"),
    ({"session": "abc123", "segment": 5}, "missing field(s) time"),
    ({**GOOD, "time": -0.03}, "time must be from 0"),
    ({**GOOD, "time": float("inf")}, "time must be a number"),
    ({**GOOD, "time": 10 ** 400}, "time must be a number"),  # no float holds it: was an internal error
    ({**GOOD, "session": "abc123\n"}, "session must be"),  # "$" matched before a final newline
    ({**GOOD, "time": 1.01}, "frame grid"),
    ({**GOOD, "segment": -1}, "segment must be an integer from 0 to 100"),
    ({**GOOD, "segment": 101}, "segment must be an integer from 0 to 100"),
    ({**GOOD, "segment": 2.0}, "segment must be an integer"),
    ({**GOOD, "session": ""}, "session must be"),
    ({**GOOD, "session": "a/b"}, "session must be"),
    ("abc", "must be an object"),
]


async def test_malformed_resume_is_bad_resume(serve_test_server):
    async with serve_test_server() as url:
        for resume, fragment in MALFORMED:
            start = json.dumps({"type": "start", "resume": resume}, allow_nan=True)
            async with websockets.connect(url) as ws:
                await ws.send(start)
                error = json.loads(await ws.recv())
                await ws.wait_closed()
            assert error["type"] == "error" and error["code"] == "bad_resume", (resume, error)
            assert fragment in error["message"], (resume, error)
            assert ws.close_code == CLOSE_POLICY


async def test_resume_continues_the_callers_numbering_and_times(serve_test_server, demo_speech):
    async with serve_test_server(partial_interval=0.0) as url:
        plain = await run_stream(url, demo_speech.audio)
        resumed = await run_stream(url, demo_speech.audio, start={"resume": GOOD, "resumable": True})
    base, shifted = plain.of("final"), resumed.of("final")
    assert len(base) == len(shifted) == 3
    for a, b in zip(base, shifted):
        assert b["segment"] == a["segment"] + GOOD["segment"]
        assert b["text"] == a["text"]
        assert b["start"] == pytest.approx(a["start"] + GOOD["time"], abs=1e-3)
        assert b["end"] == pytest.approx(a["end"] + GOOD["time"], abs=1e-3)
    assert resumed.of("done")[0]["segments"] == GOOD["segment"] + 3  # the whole stream's count


async def test_drain_leaves_a_resumable_streams_open_segment(serve_test_server, demo_speech):
    """SIGTERM's drain: a resumable stream gets the finals of its closed segments, then 1001 without
    `done`; the utterance it was in the middle of is not cut into a final (its resume re-sends it)."""
    audio = demo_speech.audio
    first = demo_speech.utterances[0]
    middle_of_second = (demo_speech.utterances[1]["start"] + demo_speech.utterances[1]["end"]) / 2
    async with serve_test_server(partial_interval=0.0) as url:
        async with websockets.connect(url) as ws:
            await ws.send(json.dumps({"type": "start", "sample_rate": SAMPLE_RATE, "resumable": True}))
            messages = [json.loads(await ws.recv())]
            await ws.send(pcm16(audio[: int(middle_of_second * SAMPLE_RATE)]))
            while not any(m["type"] == "final" for m in messages):
                messages.append(json.loads(await asyncio.wait_for(ws.recv(), 30)))
            url.server.request_shutdown()
            async for text in ws:
                messages.append(json.loads(text))
        finals = [m for m in messages if m["type"] == "final"]
        assert ws.close_code == CLOSE_GOING_AWAY
        assert [f["segment"] for f in finals] == [0]
        assert finals[0]["end"] == pytest.approx(first["end"], abs=0.2)
        assert not [m for m in messages if m["type"] in ("done", "error")]


async def test_a_plain_stream_still_gets_its_open_segment_on_drain(serve_test_server, demo_speech):
    """Without `resumable` the drain is as before: the open segment ends at the drain, final and `done`."""
    middle_of_second = (demo_speech.utterances[1]["start"] + demo_speech.utterances[1]["end"]) / 2
    async with serve_test_server(partial_interval=0.0) as url:
        async with websockets.connect(url) as ws:
            await ws.send(json.dumps({"type": "start", "sample_rate": SAMPLE_RATE}))
            messages = [json.loads(await ws.recv())]
            await ws.send(pcm16(demo_speech.audio[: int(middle_of_second * SAMPLE_RATE)]))
            while not any(m["type"] == "final" for m in messages):  # the audio has been read
                messages.append(json.loads(await asyncio.wait_for(ws.recv(), 30)))
            url.server.request_shutdown()
            messages += [json.loads(text) async for text in ws]
        assert [m["segment"] for m in messages if m["type"] == "final"][-1] == 1
        assert messages[-1]["type"] == "done" and ws.close_code == CLOSE_GOING_AWAY
