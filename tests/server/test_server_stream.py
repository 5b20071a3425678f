"""End to end through a real server: segments, partials, finals, concurrency, keepalive, shutdown."""
from __future__ import annotations

import asyncio
import json
import threading

import numpy as np
import websockets

from pipeline.audio import SAMPLE_RATE, seconds_to_samples
from server.protocol import CLOSE_GOING_AWAY, CLOSE_NORMAL, parse_server_message
from server_testkit import eventually, pcm16, run_stream

TOLERANCE = 0.3  # seconds: how far a final's start/end may be from where the speech really is


def partial_pauses(utterances) -> list:
    """Wait for a partial of each utterance midway through it: the unpaced stream would otherwise outrun
    the partials (a final makes its segment's waiting partial stale, and stale partials are dropped)."""
    return [((u["start"] + u["end"]) / 2, lambda m, i=i: m["type"] == "partial" and m["segment"] == i)
            for i, u in enumerate(utterances)]


def check_finals(result, utterances) -> None:
    """One final per utterance, in order, with matching times; partials of a segment come before its final."""
    finals = result.of("final")
    assert [f["segment"] for f in finals] == list(range(len(utterances)))
    for final, utterance in zip(finals, utterances):
        assert abs(final["start"] - utterance["start"]) <= TOLERANCE, (final, utterance)
        assert abs(final["end"] - utterance["end"]) <= TOLERANCE, (final, utterance)
        for token in final.get("tokens", []):
            assert final["start"] - TOLERANCE - 0.1 <= token["start"] <= token["end"] <= final["end"] + TOLERANCE
    kinds = [(m["type"], m.get("segment")) for m in result.messages]
    for segment in range(len(utterances)):
        final_at = kinds.index(("final", segment))
        partials = [i for i, k in enumerate(kinds) if k == ("partial", segment)]
        assert partials, f"no partial for segment {segment}"
        assert max(partials) < final_at, "a partial came after its segment's final"
    assert result.messages[-1] == {"type": "done", "segments": len(utterances)}
    for message in result.messages:  # every message parses with the clients' own parser
        parse_server_message(json.dumps(message))


async def test_three_utterances_give_three_finals(serve_test_server, speech):
    async with serve_test_server(partial_interval=0.3) as url:
        result = await run_stream(url, speech.audio, pauses=partial_pauses(speech.utterances))
    assert result.messages[0]["type"] == "ready"
    assert result.messages[0]["sample_rate"] == SAMPLE_RATE
    check_finals(result, speech.utterances)
    assert result.close_code == CLOSE_NORMAL


async def test_resampled_stereo_float_input(serve_test_server, speech):
    """48 kHz stereo f32le from a browser lands on the same segments."""
    import soxr

    audio48 = soxr.resample(speech.audio, SAMPLE_RATE, 48000).astype("<f4")
    stereo = np.repeat(audio48, 2).tobytes()
    async with serve_test_server(partial_interval=0.3) as url:
        async with websockets.connect(url) as ws:
            await ws.send(json.dumps({"type": "start", "sample_rate": 48000, "format": "f32le", "channels": 2}))
            for i in range(0, len(stereo), 38400):
                await ws.send(stereo[i:i + 38400])
            await ws.send(json.dumps({"type": "stop"}))
            messages = [json.loads(m) async for m in ws]
    finals = [m for m in messages if m["type"] == "final"]
    assert len(finals) == len(speech.utterances)
    for final, utterance in zip(finals, speech.utterances):
        assert abs(final["start"] - utterance["start"]) <= TOLERANCE
        assert abs(final["end"] - utterance["end"]) <= TOLERANCE


async def test_two_sessions_at_once_both_get_all_finals(serve_test_server, speech):
    async with serve_test_server(partial_interval=0.3) as url:
        first, second = await asyncio.gather(
            run_stream(url, speech.audio, chunk_seconds=0.05, pauses=partial_pauses(speech.utterances)),
            run_stream(url, speech.audio, chunk_seconds=0.12, pauses=partial_pauses(speech.utterances)),
        )
        await eventually(lambda: not url.server.connections)
    for result in (first, second):
        check_finals(result, speech.utterances)
        assert result.close_code == CLOSE_NORMAL
    assert first.messages[0]["session"] != second.messages[0]["session"]


async def test_partials_off(serve_test_server, speech):
    async with serve_test_server() as url:
        result = await run_stream(url, speech.audio, start={"partials": False})
    assert not result.of("partial")
    assert len(result.of("final")) == len(speech.utterances)


async def test_keepalive_ping_answered_while_the_worker_is_busy(serve_test_server, speech):
    """A model run that takes long must not block pings, HTTP or other sessions' handshakes."""
    running, release = threading.Event(), threading.Event()

    def slow_model(call: int) -> None:  # the engine's own hook, on the worker thread before each run
        running.set()
        release.wait(30)

    async with serve_test_server(partial_interval=0) as url:
        url.server.engine.fault_hook = slow_model
        async with websockets.connect(url) as ws:
            await ws.send(json.dumps({"type": "start"}))
            await ws.recv()  # ready
            utterance = speech.utterances[0]
            await ws.send(pcm16(speech.audio[: seconds_to_samples(utterance["end"] + 1.0)]))
            assert await asyncio.to_thread(running.wait, 30)
            pong = await ws.ping()
            await asyncio.wait_for(pong, 30)
            async with websockets.connect(url) as other:  # a second handshake completes as well
                await other.send(json.dumps({"type": "start"}))
                assert json.loads(await other.recv())["type"] == "ready"
            assert not release.is_set() and running.is_set()  # the run was in progress all along
            release.set()
            await ws.send(json.dumps({"type": "stop"}))
            messages = [json.loads(m) async for m in ws]
        url.server.engine.fault_hook = None
    assert [m["type"] for m in messages] == ["final", "done"]


async def test_inference_failure_is_an_error_for_that_segment_only(serve_test_server, speech):
    failed = []

    def fail_second_run(call: int) -> None:
        if call == 2:
            failed.append(call)
            raise RuntimeError("injected fault")

    async with serve_test_server(partial_interval=0) as url:
        url.server.engine.fault_hook = fail_second_run
        result = await run_stream(url, speech.audio)
    assert failed == [2]
    assert [(m["type"], m.get("segment")) for m in result.messages[1:]] == [
        ("final", 0), ("error", 1), ("final", 2), ("done", None)]
    error = result.of("error")[0]
    assert error["code"] == "inference_failed" and "injected fault" in error["message"]
    assert result.close_code == CLOSE_NORMAL


async def test_shutdown_sends_finals_of_audio_already_received(serve_test_server, speech):
    """SIGTERM semantics: the open segment is finished, its final and done are sent, then close 1001."""
    cut = seconds_to_samples((speech.utterances[1]["start"] + speech.utterances[1]["end"]) / 2)
    async with serve_test_server(partial_interval=0) as url:
        async with websockets.connect(url) as ws:
            await ws.send(json.dumps({"type": "start"}))
            await ws.recv()  # ready
            await ws.send(pcm16(speech.audio[:cut]))  # mid-way through the second utterance
            first = json.loads(await ws.recv())
            assert first["type"] == "final" and first["segment"] == 0  # everything before is processed
            url.server.request_shutdown()
            messages = [json.loads(m) async for m in ws]
            assert ws.close_code == CLOSE_GOING_AWAY
    assert [(m["type"], m.get("segment")) for m in messages] == [("final", 1), ("done", None)]
    assert abs(messages[0]["start"] - speech.utterances[1]["start"]) <= TOLERANCE


async def test_client_disconnect_mid_segment_releases_everything(serve_test_server, speech):
    async with serve_test_server(partial_interval=0.3) as url:
        server = url.server
        for _ in range(3):
            async with websockets.connect(url) as ws:
                await ws.send(json.dumps({"type": "start"}))
                await ws.recv()
                await ws.send(pcm16(speech.audio[: seconds_to_samples(speech.utterances[0]["end"] - 0.3)]))
        await eventually(lambda: not server.connections)
        assert server.worker.depth == 0
        result = await run_stream(url, speech.audio)  # and the server still serves
    assert len(result.of("final")) == len(speech.utterances)


async def test_no_compression_is_negotiated(serve_test_server):
    """Clients that offer permessage-deflate (browsers, websockets' default) get uncompressed frames on
    both ports: audio barely compresses, and deflate state per connection costs memory until the GC."""
    async with serve_test_server(funasr_port=0) as url:
        for address in (url, f"ws://127.0.0.1:{url.server.funasr_port}/"):
            async with websockets.connect(address) as ws:  # compression="deflate" is the client's default
                assert ws.response.headers.get("Sec-WebSocket-Extensions") is None
                assert ws.protocol.extensions == []
