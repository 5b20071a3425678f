"""Every client mistake gets an `error` message with a clear text, then the right close code, and never
disturbs another session streaming at the same time."""
from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import websockets

from pipeline.audio import SAMPLE_RATE
from server.protocol import (
    CLOSE_INVALID_PAYLOAD,
    CLOSE_NORMAL,
    CLOSE_POLICY,
    CLOSE_TOO_BIG,
    CLOSE_TRY_AGAIN,
    CLOSE_UNSUPPORTED,
)
from server_testkit import eventually, run_stream, send_and_collect

START = json.dumps({"type": "start", "sample_rate": SAMPLE_RATE})
MAX_BYTES = 64 * 1024

CASES = {
    # name: (frames, error code, close code)
    "malformed_json": (['{"type": "start", '], "invalid_json", CLOSE_INVALID_PAYLOAD),
    "not_an_object": (["[1, 2]"], "invalid_json", CLOSE_INVALID_PAYLOAD),
    "unknown_type": (['{"type": "pause"}'], "unknown_type", CLOSE_POLICY),
    "audio_before_start": ([b"\x00\x00" * 160], "bad_order", CLOSE_POLICY),
    "stop_before_start": (['{"type": "stop"}'], "bad_order", CLOSE_POLICY),
    "start_twice": ([START, START], "bad_order", CLOSE_POLICY),
    "unknown_start_field": (['{"type": "start", "rate": 16000}'], "bad_start", CLOSE_POLICY),
    "unknown_language": (['{"type": "start", "language": "xx"}'], "bad_start", CLOSE_POLICY),
    "odd_byte_count": ([START, b"\x00" * 321], "invalid_audio", CLOSE_INVALID_PAYLOAD),
    "nan_samples": ([json.dumps({"type": "start", "format": "f32le"}), np.full(160, np.nan, "<f4").tobytes()],
                    "invalid_audio", CLOSE_INVALID_PAYLOAD),
    "bad_rate": (['{"type": "start", "sample_rate": 44}'], "unsupported_audio", CLOSE_UNSUPPORTED),
    "bad_format": (['{"type": "start", "format": "mp3"}'], "unsupported_audio", CLOSE_UNSUPPORTED),
    "bad_channels": (['{"type": "start", "channels": 6}'], "unsupported_audio", CLOSE_UNSUPPORTED),
}


@pytest.fixture(scope="module")
def two_seconds_of_speech(speech) -> np.ndarray:
    u = speech.utterances[0]
    return speech.audio[int((u["start"] - 0.5) * SAMPLE_RATE):int((u["end"] + 1.0) * SAMPLE_RATE)]


async def test_each_mistake_gets_its_error_and_close_code(serve_test_server, two_seconds_of_speech):
    async with serve_test_server(max_message_bytes=MAX_BYTES) as url:
        # A healthy session streams at the same time, its audio interleaved with the failing ones.
        healthy = asyncio.ensure_future(run_stream(url, np.tile(two_seconds_of_speech, 3), chunk_seconds=0.02))
        for name, (frames, code, close) in CASES.items():
            result = await send_and_collect(url, frames)
            errors = result.of("error")
            assert len(errors) == 1, name
            assert errors[0]["code"] == code, name
            assert len(errors[0]["message"]) > 10, name
            assert result.messages[-1] == errors[0], name  # the error is the last thing sent ...
            assert result.close_code == close, name  # ... then the close
            assert result.close_reason == code, name
        result = await healthy
        await eventually(lambda: not url.server.connections)
    assert result.close_code == CLOSE_NORMAL
    assert len(result.of("final")) == 3
    assert not result.of("error")


async def test_oversized_message_closes_with_1009(serve_test_server, two_seconds_of_speech):
    async with serve_test_server(max_message_bytes=MAX_BYTES) as url:
        healthy = asyncio.ensure_future(run_stream(url, two_seconds_of_speech))
        result = await send_and_collect(url, [START, b"\x00\x00" * MAX_BYTES])
        assert result.close_code == CLOSE_TOO_BIG
        assert "exceeds limit" in result.close_reason, result.close_reason
        text = await send_and_collect(url, [START, json.dumps({"type": "stop", "pad": "x" * MAX_BYTES})])
        assert text.close_code == CLOSE_TOO_BIG
        ok = await healthy
    assert ok.close_code == CLOSE_NORMAL and len(ok.of("final")) == 1


async def test_full_server_refuses_with_1013(serve_test_server):
    async with serve_test_server(max_sessions=1) as url:
        async with websockets.connect(url) as first:
            await first.send(START)
            assert json.loads(await first.recv())["type"] == "ready"
            refused = await send_and_collect(url, [START])
            assert [m["code"] for m in refused.messages] == ["overloaded"]
            assert refused.close_code == CLOSE_TRY_AGAIN
            await first.send(json.dumps({"type": "stop"}))
            assert [json.loads(m)["type"] async for m in first] == ["done"]
        again = await send_and_collect(url, [START, '{"type": "stop"}'])  # capacity is back
    assert [m["type"] for m in again.messages] == ["ready", "done"]


async def test_idle_stream_is_closed(serve_test_server):
    async with serve_test_server(idle_timeout=0.3) as url:
        result = await send_and_collect(url, [START])
    assert [m["type"] for m in result.messages] == ["ready", "error"]
    assert result.messages[1]["code"] == "idle_timeout"
    assert result.close_code == CLOSE_POLICY


async def test_token_from_start_query_or_header(serve_test_server):
    stop = '{"type": "stop"}'
    async with serve_test_server(token="s3cret") as url:
        missing = await send_and_collect(url, [START, stop])
        wrong = await send_and_collect(url, [json.dumps({"type": "start", "token": "nope"}), stop])
        in_start = await send_and_collect(url, [json.dumps({"type": "start", "token": "s3cret"}), stop])
        in_query = await send_and_collect(url + "?token=s3cret", [START, stop])
        in_header = await send_and_collect(url, [START, stop], additional_headers={"Authorization": "Bearer s3cret"})
        with pytest.raises(websockets.InvalidStatus) as refused:
            await send_and_collect(url + "?token=nope", [START])
    for result in (missing, wrong):
        assert [m["code"] for m in result.messages] == ["unauthorized"]
        assert result.close_code == CLOSE_POLICY
    for result in (in_start, in_query, in_header):
        assert [m["type"] for m in result.messages] == ["ready", "done"]
    assert refused.value.response.status_code == 401
