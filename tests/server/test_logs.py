"""The server's log (server/logs.py): probes and page assets stay out of an INFO log, a stream is one line
at its start and one at its end, errors are warnings with their code, and --log-format json is one
object per line."""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import signal
import sys
from pathlib import Path

import numpy as np

from pipeline.modeldir import read_model_directory
from server.http import listening_urls
from server_testkit import eventually, http_get, run_stream, send_and_collect

ROOT = Path(__file__).resolve().parents[2]
PROBES = ("/healthz", "/readyz", "/metrics", "/", "/static/app.js", "/static/style.css", "/v1/model", "/nope")


async def read_json_log(stderr: asyncio.StreamReader, records: list[dict], ready: asyncio.Event) -> None:
    """Parse every line the server logs (each must be one JSON object); set `ready` once it is warm."""
    while line := await stderr.readline():
        records.append(json.loads(line))
        if records[-1]["message"].startswith("ready: "):
            ready.set()


async def test_probes_log_nothing_at_info_and_a_stream_logs_its_start_and_end(test_model_dir, speech):
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "server", "--model", str(test_model_dir), "--port", "0", "--log-format", "json",
        "--partial-interval", "0", cwd=ROOT, stderr=asyncio.subprocess.PIPE,
    )
    records: list[dict] = []
    ready = asyncio.Event()
    reader = asyncio.ensure_future(read_json_log(proc.stderr, records, ready))
    try:
        await asyncio.wait_for(ready.wait(), 60)
        # the stream's address, and the page's for people to open (it was missing: only the ws:// one)
        listening = next(r for r in records if r["message"].startswith("listening on"))["message"]
        match = re.fullmatch(r"listening on ws://127\.0\.0\.1:(\d+)/v1/stream \(model .+, loading\); "
                             r"browser page: (http://127\.0\.0\.1:(\d+)/)", listening)
        assert match and match[1] == match[3], listening
        port, page = int(match[1]), match[2]
        http = page.rstrip("/")
        startup = len(records)
        for _ in range(5):  # a load balancer's probes and a few page loads
            for path in PROBES:
                status, _, _ = await http_get(http, path)
                assert status == (404 if path == "/nope" else 200), path
        url = f"ws://127.0.0.1:{port}/v1/stream"
        good = await run_stream(url, speech.audio)
        bad = await send_and_collect(url, [b"\x00\x00"])  # audio before start: error bad_order
        await eventually(lambda: sum(r.get("event") == "stream_end" for r in records) == 2, timeout=30)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
        await asyncio.wait_for(reader, 10)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert all({"time", "level", "logger", "message"} <= record.keys() for record in records)
    assert all(record["time"].endswith("Z") for record in records)
    after_startup = records[startup:]
    assert not [r for r in records if r["logger"].startswith("websockets")], records  # INFO ones became DEBUG
    streams = [r for r in after_startup if r["logger"] == "server.connection"]
    assert [(r["event"], r["level"]) for r in streams] == [
        ("stream_start", "INFO"), ("stream_end", "INFO"), ("stream_start", "INFO"), ("stream_end", "WARNING")]
    others = [r["message"] for r in after_startup if r not in streams]
    assert others == ["stopped"], others  # nothing per request
    session = next(m["session"] for m in good.messages if m["type"] == "ready")
    model = read_model_directory(test_model_dir).manifest.name
    start, end = streams[0], streams[1]
    assert start["session"] == end["session"] == session and session in start["message"]
    assert start["client"] == end["client"] == "127.0.0.1" and start["model"] == end["model"] == model
    finals = [m for m in good.messages if m["type"] == "final"]
    assert end["segments"] == len(finals) == len(speech.utterances) and end["close"] == 1000 and end["code"] is None
    assert abs(end["audio_s"] - speech.duration) < 0.01 and end["duration_s"] > 0
    error = streams[3]
    assert error["code"] == "bad_order" and error["close"] == bad.close_code == 1008
    assert "bad_order" in error["message"] and error["segments"] == 0


async def test_requests_are_logged_at_debug(serve_test_server, caplog):
    """What `--log-level debug` shows: websockets' request lines, demoted to DEBUG."""
    async with serve_test_server() as url:
        caplog.set_level(logging.INFO)
        await http_get(url.http, "/healthz")
        assert not [r for r in caplog.records if r.name.startswith("websockets")]
        caplog.set_level(logging.DEBUG, logger="websockets")
        await http_get(url.http, "/healthz")
    sent = [r for r in caplog.records if r.getMessage() == "HTTP response sent (200 OK)"]
    assert len(sent) == 1 and sent[0].levelno == logging.DEBUG


def test_listening_addresses_for_every_kind_of_host():
    assert listening_urls("127.0.0.1", 8765, tls=False) == ("ws://127.0.0.1:8765/v1/stream", "http://127.0.0.1:8765/")
    # every interface: the page is opened on this machine (a browser may refuse 0.0.0.0)
    assert listening_urls("0.0.0.0", 80, tls=True) == ("wss://0.0.0.0:80/v1/stream", "https://127.0.0.1:80/")
    assert listening_urls("::", 8765, tls=False) == ("ws://[::]:8765/v1/stream", "http://[::1]:8765/")
    assert listening_urls("fe80::1", 1, tls=False)[1] == "http://[fe80::1]:1/"
    assert listening_urls("asr.lan", 1, tls=False)[1] == "http://asr.lan:1/"


async def test_every_door_logs_the_audio_it_heard(serve_test_server, caplog, speech):
    """The end-of-stream line's seconds of audio and segments, whatever the door: a Realtime session's
    audio waits outside any StreamSession until its commit, a Wyoming request's session is its own, and a
    Deepgram stream has one per channel; each logged 0.0 s of audio (and Deepgram 0 segments)."""
    import base64

    import soxr
    import websockets
    from wyoming.asr import Transcribe, Transcript
    from wyoming.audio import AudioChunk, AudioStart, AudioStop
    from wyoming.client import AsyncTcpClient

    from server_testkit import pcm16

    caplog.set_level(logging.INFO, logger="server")
    async with serve_test_server(wyoming_port=0, partial_interval=0.0) as url:
        port = int(url.http.rsplit(":", 1)[1])
        pcm24 = pcm16(np.clip(soxr.resample(speech.audio, 16000, 24000), -1, 1))
        async with websockets.connect(f"ws://127.0.0.1:{port}/v1/realtime?intent=transcription") as ws:
            await ws.recv()
            await ws.send(json.dumps({"type": "transcription_session.update", "session": {"turn_detection": None}}))
            for i in range(0, len(pcm24), 9600):
                await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                          "audio": base64.b64encode(pcm24[i:i + 9600]).decode()}))
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            while not json.loads(await ws.recv())["type"].endswith("transcription.completed"):  # one item
                pass
        pcm = pcm16(speech.audio)
        async with AsyncTcpClient("127.0.0.1", url.server.wyoming_port) as client:
            await client.write_event(Transcribe(language="en").event())
            await client.write_event(AudioStart(rate=16000, width=2, channels=1).event())
            for i in range(0, len(pcm), 3200):
                await client.write_event(AudioChunk(rate=16000, width=2, channels=1, audio=pcm[i:i + 3200]).event())
            await client.write_event(AudioStop().event())
            while not Transcript.is_type((await client.read_event()).type):
                pass
        async with websockets.connect(f"ws://127.0.0.1:{port}/v1/listen?encoding=linear16&sample_rate=16000") as ws:
            for i in range(0, len(pcm), 3200):
                await ws.send(pcm[i:i + 3200])
            await ws.send(json.dumps({"type": "CloseStream"}))
            with contextlib.suppress(websockets.ConnectionClosed):
                async for _ in ws:
                    pass
        ends = lambda: {r.name: r.fields for r in caplog.records if getattr(r, "fields", {}).get("event") == "stream_end"}
        await eventually(lambda: len(ends()) == 3, timeout=30)
    for door, fields in ends().items():
        assert abs(fields["audio_s"] - speech.duration) < 0.01, (door, fields)
        assert fields["segments"] == len(speech.utterances), (door, fields)
