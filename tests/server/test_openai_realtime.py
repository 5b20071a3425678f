"""OpenAI Realtime transcription sessions: the real `openai` package's Realtime client at real-time pace, and
raw WebSocket events for what the SDK does not exercise, against a real server on 127.0.0.1."""
from __future__ import annotations

import asyncio
import base64
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile
import soxr
import websockets
from openai_testkit import HELD_OUT, TOKEN, knows_words, own_protocol_text, post, sdk, words

from pipeline.audio import SAMPLE_RATE

DEMO = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "demo"
CHUNK_SECONDS = 0.1
TRANSCRIPTION = "conversation.item.input_audio_transcription"


def pcm16(audio: np.ndarray) -> bytes:
    return np.clip(np.round(audio * 32767), -32768, 32767).astype("<i2").tobytes()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def test_sdk_realtime_transcription_at_real_time_pace(serve_test_server, test_model_dir):
    """24 kHz audio in 100 ms appends at real-time pace, server_vad, partials on: one item per utterance;
    each item's deltas add up to its completed transcript; the words are our own protocol's."""
    audio, _ = soundfile.read(HELD_OUT, dtype="float32")
    data = pcm16(soxr.resample(audio, SAMPLE_RATE, 24000)) + bytes(2 * 24000)  # + 1 s of silence
    step = int(24000 * CHUNK_SECONDS) * 2
    events: list[Any] = []
    async with serve_test_server(token=TOKEN, partial_interval=0.3) as url:
        own = words(await own_protocol_text(url, audio))
        async with sdk(url).realtime.connect(extra_query={"intent": "transcription"}) as conn:
            await conn.session.update(session={"type": "transcription", "audio": {"input": {
                "format": {"type": "audio/pcm", "rate": 24000},
                "transcription": {"model": "gpt-4o-transcribe", "language": "en"},
                "turn_detection": {"type": "server_vad", "silence_duration_ms": 500, "prefix_padding_ms": 300,
                                   "threshold": 0.5}}}})

            async def send() -> None:
                began = time.monotonic()
                for n, i in enumerate(range(0, len(data), step)):
                    await asyncio.sleep(max(0.0, began + n * CHUNK_SECONDS - time.monotonic()))
                    await conn.input_audio_buffer.append(audio=b64(data[i:i + step]))

            async def receive() -> None:
                async for event in conn:
                    events.append(event)
                    if sum(e.type == f"{TRANSCRIPTION}.completed" for e in events) == len(own_items):
                        return

            own_items = [1, 2, 3] if knows_words(test_model_dir) else [1]
            sender = asyncio.ensure_future(send())
            await asyncio.wait_for(receive(), 60)
            await sender
    kinds = [e.type for e in events]
    assert kinds[:2] == ["session.created", "session.updated"] and "error" not in kinds
    assert events[1].session.audio.input.turn_detection.silence_duration_ms == 500
    completed = [e for e in events if e.type == f"{TRANSCRIPTION}.completed"]
    for item in completed:
        mine = [e for e in events if getattr(e, "item_id", None) == item.item_id]
        order = [e.type for e in mine]
        assert order.index("input_audio_buffer.speech_started") < order.index("input_audio_buffer.speech_stopped") \
            < order.index("input_audio_buffer.committed") < order.index(f"{TRANSCRIPTION}.completed")
        deltas = [e.delta for e in mine if e.type == f"{TRANSCRIPTION}.delta"]
        assert "".join(deltas) == item.transcript and all(e.content_index == 0 for e in mine if "content_index" in
                                                          type(e).model_fields)
    if knows_words(test_model_dir):
        assert words(" ".join(e.transcript for e in completed)) == own
        assert len(completed) == 3


async def expect(ws: Any, kind: str) -> dict:
    """The next event, which must be of type `kind`."""
    event = json.loads(await asyncio.wait_for(ws.recv(), 30))
    assert event["type"] == kind, event
    return event


async def commit_item(ws: Any, data: bytes, speech_seconds: float = 0.0) -> str:
    """Append `data` in one event and commit it: one item, its deltas adding up to its transcript (returned);
    its usage counts more than `speech_seconds`."""
    await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": b64(data)}))
    await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
    committed = await expect(ws, "input_audio_buffer.committed")
    events = [json.loads(await asyncio.wait_for(ws.recv(), 30))]
    while events[-1]["type"] != f"{TRANSCRIPTION}.completed":
        events.append(json.loads(await asyncio.wait_for(ws.recv(), 30)))
    assert {e["item_id"] for e in events} == {committed["item_id"]}, events
    assert {e["type"] for e in events[:-1]} <= {f"{TRANSCRIPTION}.delta"}, events
    assert "".join(e["delta"] for e in events[:-1]) == events[-1]["transcript"]
    assert events[-1]["usage"]["seconds"] > speech_seconds
    return events[-1]["transcript"]


async def test_raw_events_errors_and_manual_commits(serve_test_server, test_model_dir):
    """Mistakes are `error` events and the session goes on; without turn detection, commits make items."""
    transcripts = json.loads((DEMO / "transcripts.json").read_text())
    audio, _ = soundfile.read(DEMO / transcripts[0]["audio"], dtype="float32")
    async with serve_test_server(token=TOKEN) as url:
        uri = f"ws://127.0.0.1:{url.port}/v1/realtime?intent=transcription"
        async with websockets.connect(uri, subprotocols=["realtime", f"openai-insecure-api-key.{TOKEN}"]) as ws:
            assert ws.subprotocol == "realtime"
            session = (await expect(ws, "session.created"))["session"]
            assert session["type"] == "transcription" and session["audio"]["input"]["format"]["rate"] == 24000
            mistakes = [
                ({"type": "response.create", "event_id": "e1"}, "invalid_value"),
                ("{not json", "invalid_json"),
                ("[" * 100_000, "invalid_json"),  # nested past Python's recursion limit: was a 1011 close
                ({"type": "input_audio_buffer.append", "audio": "***"}, "invalid_base64"),
                ({"type": "input_audio_buffer.append", "audio": b64(b"\0\0\0")}, "invalid_audio"),
                ({"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
                    "format": {"type": "audio/pcmu"}}}}}, "unsupported_audio_format"),
                ({"type": "transcription_session.update", "session": {"input_audio_format": "g711_ulaw"}},
                 "unsupported_audio_format"),
                ({"type": "input_audio_buffer.commit"}, "input_audio_buffer_commit_empty"),
                # Settings of the wrong JSON type: an error naming them, not the session's end (was 1011).
                ({"type": "session.update", "session": {"audio": {"input": "pcm"}}}, "invalid_value"),
                ({"type": "session.update", "session": {"audio": "pcm"}}, "invalid_value"),
                ({"type": "transcription_session.update", "session": {"input_audio_transcription": "en"}},
                 "invalid_value"),
            ]
            for message, code in mistakes:
                await ws.send(message if isinstance(message, str) else json.dumps(message))
                error = (await expect(ws, "error"))["error"]
                assert error["code"] == code and error["message"] and error["type"] == "invalid_request_error", error
            assert error["event_id"] is None
            # an id echoed back in full only while it is a sane length (a burst of megabyte ids held 130 MB)
            await ws.send(json.dumps({"type": "response.create", "event_id": "x" * 100_000}))
            assert (await expect(ws, "error"))["error"]["event_id"] == "x" * 256
            # Audio, then clear: nothing left to commit.
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": b64(bytes(9600))}))
            await ws.send(json.dumps({"type": "input_audio_buffer.clear"}))
            await expect(ws, "input_audio_buffer.cleared")
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            assert (await expect(ws, "error"))["error"]["code"] == "input_audio_buffer_commit_empty"
            # A commit of silence (server_vad heard no speech): an item with an empty transcript.
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": b64(bytes(9600))}))
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            silent = await expect(ws, "input_audio_buffer.committed")
            done = await expect(ws, f"{TRANSCRIPTION}.completed")
            assert done["item_id"] == silent["item_id"] and done["transcript"] == ""
            # The beta update: 16 kHz is not a beta format, so the GA shape says so; no turn detection.
            await ws.send(json.dumps({"type": "transcription_session.update", "session": {
                "input_audio_transcription": {"model": "whisper-1", "language": "en"}, "turn_detection": None}}))
            assert (await expect(ws, "transcription_session.updated"))["session"]["turn_detection"] is None
            await ws.send(json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {
                "input": {"format": {"type": "audio/pcm", "rate": 16000}}}}}))
            updated = (await expect(ws, "session.updated"))["session"]["audio"]["input"]
            assert updated["format"]["rate"] == 16000 and updated["turn_detection"] is None
            data = pcm16(audio)  # in one append of over 64 KiB: larger than a control message may be
            assert len(b64(data)) > 64 * 1024
            transcript = await commit_item(ws, data)
            if knows_words(test_model_dir):
                assert words(transcript) == words(transcripts[0]["text"])


async def test_a_commit_holding_two_utterances_is_cut_as_an_upload(serve_test_server, test_model_dir):
    """A buffer of "stop", 0.8 s of pause and a digit string, committed at once (what pipecat's default mode
    commits when its VAD missed the short word): one item whose words are the upload's for the same audio,
    at 24 kHz and 16 kHz. Decoded as one segment, pause included, "stop" was lost (issue 36)."""
    audio, _ = soundfile.read(DEMO / "stop_pause.wav", dtype="float32")
    spoken = [u["text"] for u in json.loads((DEMO / "stop_pause.json").read_text())["speech"]]
    async with serve_test_server(token=TOKEN) as url:
        upload = (await sdk(url).audio.transcriptions.create(model="whisper-1", file=DEMO / "stop_pause.wav")).text
        uri = f"ws://127.0.0.1:{url.port}/v1/realtime?intent=transcription"
        async with websockets.connect(uri, additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
            await expect(ws, "session.created")
            for rate in (24000, 16000):
                await ws.send(json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {
                    "input": {"format": {"type": "audio/pcm", "rate": rate}, "turn_detection": None}}}}))
                await expect(ws, "session.updated")
                data = pcm16(soxr.resample(audio, SAMPLE_RATE, rate) if rate != SAMPLE_RATE else audio)
                transcript = await commit_item(ws, data, speech_seconds=2.5)  # from "stop" to the last digit
                assert transcript
                if knows_words(test_model_dir):
                    assert words(transcript) == words(upload) == words(" ".join(spoken)), rate


async def semantic_vad_turns(port: int, data: bytes) -> tuple[list[str], list[str]]:
    """24 kHz PCM16 `data` as openai-agents' StreamedAudioInput sends it with its defaults (semantic_vad, 20 ms
    appends, here at 4 x real time): each turn's `.completed` transcript, and every delta."""
    uri = f"ws://127.0.0.1:{port}/v1/realtime?intent=transcription"
    completed: list[str] = []
    deltas: list[str] = []
    async with websockets.connect(uri, additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
        await expect(ws, "session.created")
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
            "format": {"type": "audio/pcm", "rate": 24000}, "turn_detection": {"type": "semantic_vad"}}}}}))
        await expect(ws, "session.updated")

        async def receive() -> None:
            while len(completed) < 2:
                event = json.loads(await ws.recv())
                assert event["type"] != "error", event
                if event["type"] == f"{TRANSCRIPTION}.completed":
                    completed.append(event["transcript"])
                elif event["type"] == f"{TRANSCRIPTION}.delta":
                    deltas.append(event["delta"])

        receiver = asyncio.ensure_future(receive())
        step = 24000 * 20 // 1000 * 2
        for i in range(0, len(data), step):
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": b64(data[i:i + step])}))
            await asyncio.sleep(0.005)
        await asyncio.wait_for(receiver, 60)
    return completed, deltas


async def test_completed_is_the_final_whatever_the_partials_committed(serve_test_server, test_model_dir):
    """Two recordings in brown noise (bench frameworks' own) through openai-agents' defaults: with partials on,
    each turn's `.completed` has the words the same session gets without partials. A partial hears only the
    start of a turn; the words it committed ("next next" for "next", "off" for "delete") were the turn's
    transcript, and openai-agents, pipecat and LiveKit all keep `.completed` as the turn's text (issue 36)."""
    audio, _ = soundfile.read(DEMO / "brown_turns.wav", dtype="float32")
    data = pcm16(soxr.resample(audio, SAMPLE_RATE, 24000))
    turns = {}
    for interval in (0.5, 0.0):
        async with serve_test_server(token=TOKEN, partial_interval=interval) as url:
            turns[interval] = await semantic_vad_turns(url.port, data)
    (with_partials, deltas), (without, _) = turns[0.5], turns[0.0]
    assert with_partials == without
    if knows_words(test_model_dir):
        assert len(deltas) > 2  # partials sent words before the finals
        spoken = json.loads((DEMO / "brown_turns.json").read_text())["texts"]
        assert words(without[1]) == words(spoken[1])


async def test_realtime_handshake_needs_the_token(serve_test_server):
    """The token in Authorization, ?token= or the browser SDK's subprotocol; without it, HTTP 401. A browser
    origin outside --allowed-origins is refused (403) here and on uploads, as on the other endpoints."""
    async with serve_test_server(token=TOKEN, allowed_origins=("https://app.example",)) as url:
        uri = f"ws://127.0.0.1:{url.port}/v1/realtime?intent=transcription"
        with pytest.raises(websockets.InvalidStatus) as refused:
            await websockets.connect(f"{uri}&token={TOKEN}", origin="https://evil.example")
        assert refused.value.response.status_code == 403
        status, answer = await post(url.port, "/v1/audio/transcriptions", b"x",
                                    {"Authorization": f"Bearer {TOKEN}", "Origin": "https://evil.example"})
        assert status == 403 and answer["error"]["code"] == "origin_not_allowed"
        for kwargs in ({}, {"subprotocols": ["realtime", "openai-insecure-api-key.wrong"]},
                       {"additional_headers": {"Authorization": "Bearer wrong"}}):
            with pytest.raises(websockets.InvalidStatus) as refused:
                await websockets.connect(uri, **kwargs)
            assert refused.value.response.status_code == 401
        async with websockets.connect(f"{uri}&token={TOKEN}") as ws:
            await expect(ws, "session.created")
