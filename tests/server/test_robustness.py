"""Robustness end to end: bad input, floods, fast senders, clients that never read, overload, faults,
leaks and shutdown. Each misbehaving client is closed with a clear error (or cut off when it cannot
even take one) while a healthy session next to it gets every final."""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import websockets
from websockets.frames import Frame, Opcode

from pipeline.audio import SAMPLE_RATE, seconds_to_samples
from server.connection import FLOOD_BURST, MAX_FINALS_IN_FLIGHT
from server.protocol import (
    CLOSE_GOING_AWAY,
    CLOSE_INVALID_PAYLOAD,
    CLOSE_NORMAL,
    CLOSE_POLICY,
    CLOSE_TOO_BIG,
    CLOSE_UNSUPPORTED,
    MAX_TEXT_MESSAGE,
)
from server_testkit import eventually, http_get, pcm16, run_stream, send_and_collect

START = json.dumps({"type": "start", "sample_rate": SAMPLE_RATE})
STOP = json.dumps({"type": "stop"})


def metric(text: str, name: str) -> float:
    """One sample (labels included in `name`) of a Prometheus text page; 0 when absent."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


async def metrics_of(url) -> str:
    return (await http_get(url.http, "/metrics"))[2].decode()


@pytest.fixture(scope="module")
def word(speech) -> np.ndarray:
    """The first utterance with 0.5 s before and 1 s of silence after: one segment, float32 [n]."""
    u = speech.utterances[0]
    return speech.audio[int((u["start"] - 0.5) * SAMPLE_RATE):int((u["end"] + 1.0) * SAMPLE_RATE)]


def start_with(**fields) -> str:
    return json.dumps({"type": "start", **fields})


BAD_INPUT = {
    # name: (frames, error code, close code) - beyond tests/server/test_errors.py
    "rate_huge": ([start_with(sample_rate=10**12)], "unsupported_audio", CLOSE_UNSUPPORTED),
    "rate_negative": ([start_with(sample_rate=-16000)], "unsupported_audio", CLOSE_UNSUPPORTED),
    "rate_float": ([start_with(sample_rate=16000.5)], "unsupported_audio", CLOSE_UNSUPPORTED),
    "rate_string": ([start_with(sample_rate="16000")], "unsupported_audio", CLOSE_UNSUPPORTED),
    "rate_bool": ([start_with(sample_rate=True)], "unsupported_audio", CLOSE_UNSUPPORTED),
    "rate_nan": (['{"type": "start", "sample_rate": NaN}'], "unsupported_audio", CLOSE_UNSUPPORTED),
    "channels_zero": ([start_with(channels=0)], "unsupported_audio", CLOSE_UNSUPPORTED),
    "itn_not_bool": ([start_with(itn="yes")], "bad_start", CLOSE_POLICY),
    "type_missing": (['{"sample_rate": 16000}'], "unknown_type", CLOSE_POLICY),
    "empty_text": ([""], "invalid_json", CLOSE_INVALID_PAYLOAD),
    "deeply_nested": (["[" * 50_000], "invalid_json", CLOSE_INVALID_PAYLOAD),
    "inf_samples": ([start_with(format="f32le"), np.full(160, np.inf, "<f4").tobytes()],
                    "invalid_audio", CLOSE_INVALID_PAYLOAD),
    "f32_garbage": ([start_with(format="f32le"), np.random.default_rng(1).bytes(4000)],  # holds NaN bit patterns
                    "invalid_audio", CLOSE_INVALID_PAYLOAD),
    "stereo_odd_frame": ([start_with(channels=2), b"\x01\x02" * 161], "invalid_audio", CLOSE_INVALID_PAYLOAD),
    "garbage_odd_length": ([START, np.random.default_rng(2).bytes(1001)], "invalid_audio", CLOSE_INVALID_PAYLOAD),
    "big_control_message": ([START, json.dumps({"type": "stop", "pad": "x" * MAX_TEXT_MESSAGE})],
                            "message_too_big", CLOSE_TOO_BIG),
}


async def test_more_bad_input_each_closed_clearly_while_a_healthy_session_streams(serve_test_server, word):
    async with serve_test_server() as url:
        healthy = asyncio.ensure_future(run_stream(url, np.tile(word, 3), chunk_seconds=0.02))
        for name, (frames, code, close) in BAD_INPUT.items():
            result = await send_and_collect(url, frames)
            assert [m.get("code") for m in result.messages if m["type"] == "error"] == [code], name
            assert result.messages[-1]["type"] == "error" and len(result.messages[-1]["message"]) > 10, name
            assert (result.close_code, result.close_reason) == (close, code), name
        # random s16le bytes are valid (loud) audio: whatever they give, the stream ends normally
        noise = await send_and_collect(url, [START, np.random.default_rng(3).bytes(32000), STOP])
        ok = await healthy
    assert noise.close_code == CLOSE_NORMAL and noise.messages[-1]["type"] == "done"
    assert ok.close_code == CLOSE_NORMAL and len(ok.of("final")) == 3 and not ok.of("error")


async def test_flood_of_tiny_frames_is_closed_and_starves_nobody(serve_test_server, word):
    """10 000 two-byte frames (one sample each): closed after the burst allowance with too_many_messages."""
    async with serve_test_server() as url:
        healthy = asyncio.ensure_future(run_stream(url, np.tile(word, 2), chunk_seconds=0.02))
        flood = await send_and_collect(url, [START] + [b"\x00\x01"] * 10_000)
        empty = await send_and_collect(url, [START] + [b""] * (FLOOD_BURST + 10))
        ok = await healthy
        text = await metrics_of(url)
    for result in (flood, empty):
        assert [m["type"] for m in result.messages] == ["ready", "error"]
        assert result.messages[1]["code"] == "too_many_messages"
        assert result.close_code == CLOSE_POLICY
    assert metric(text, 'unipad_errors_total{code="too_many_messages"}') == 2
    assert ok.close_code == CLOSE_NORMAL and len(ok.of("final")) == 2


async def test_fast_sender_is_backpressured_not_buffered(serve_test_server, word):
    """Audio far faster than real time while the model is stuck: the server stops reading once
    MAX_FINALS_IN_FLIGHT finals wait, so what it holds stays bounded; afterwards every final arrives."""
    gate = threading.Event()
    segments = 12
    async with serve_test_server(partial_interval=0) as url:
        url.server.engine.fault_hook = lambda call: gate.wait(60)
        sender = asyncio.ensure_future(run_stream(url, np.tile(word, segments), chunk_seconds=0.25))
        await eventually(lambda: any(c._inflight.locked() for c in url.server.connections), timeout=60)
        (connection,) = url.server.connections
        await asyncio.sleep(0.5)  # room to over-read, if the server were going to
        held = connection.session.received_seconds
        bound = (MAX_FINALS_IN_FLIGHT + 1) * len(word) / SAMPLE_RATE + 0.25 * 17  # + websockets' read queue
        assert held <= bound, (held, bound)
        assert held < segments * len(word) / SAMPLE_RATE
        assert url.server.worker.depth <= MAX_FINALS_IN_FLIGHT
        gate.set()
        result = await sender
    assert [f["segment"] for f in result.of("final")] == list(range(segments))
    assert result.close_code == CLOSE_NORMAL


async def raw_client(port: int, frames: list[str | bytes]) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A WebSocket client made by hand on a socket with a tiny receive buffer, which never reads after
    the handshake: the server's messages pile up in the kernel buffers until its sends block."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=1024)
    writer.write(f"GET /v1/stream HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                 "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                 "Sec-WebSocket-Version: 13\r\n\r\n".encode())
    assert b" 101 " in await reader.readuntil(b"\r\n\r\n")
    for frame in frames:
        opcode = Opcode.TEXT if isinstance(frame, str) else Opcode.BINARY
        data = frame.encode() if isinstance(frame, str) else frame
        writer.write(Frame(opcode, data).serialize(mask=True))
    return reader, writer


async def test_client_that_never_reads_is_cut_off(serve_test_server, word):
    """Its outgoing messages are bounded (backpressure stops its audio), and after send_timeout the
    server drops the TCP connection: its memory is freed, other sessions never notice."""
    short = word[seconds_to_samples(0.3):seconds_to_samples(1.2)]  # ~0.7 s of speech, then silence
    unit = np.concatenate([short, np.zeros(seconds_to_samples(0.4), np.float32)])
    async with serve_test_server(send_timeout=1.0, end_silence=0.3, partial_interval=0.1) as url:
        frames = [START] + [pcm16(unit)] * 400
        _, writer = await raw_client(url.port, frames)
        await eventually(lambda: bool(url.server.connections))
        (connection,) = url.server.connections
        # Small buffers on the server's side of this socket too, so a few dozen messages fill them all
        # (a test shortcut: with default buffers it takes megabytes of results).
        connection.ws.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 2048)
        connection.ws.transport.set_write_buffer_limits(high=2048)
        await eventually(lambda: metric_value(url, "not_reading") == 1, timeout=120)
        await eventually(lambda: not url.server.connections)
        writer.transport.abort()
        ok = await run_stream(url, word)
    assert ok.close_code == CLOSE_NORMAL and len(ok.of("final")) == 1


def metric_value(url, reason: str) -> float:
    return url.server.metrics.registry.get_sample_value("unipad_sessions_dropped_total", {"reason": reason}) or 0


async def test_sustained_overload_drops_partials_never_finals(serve_test_server, speech):
    """Eight fast streams and a model slowed to ~50 ms a run: partials degrade, every final arrives."""
    async with serve_test_server(partial_interval=0.2, max_sessions=8) as url:
        url.server.engine.fault_hook = lambda call: time.sleep(0.05)
        results = await asyncio.gather(*(run_stream(url, speech.audio, chunk_seconds=0.1) for _ in range(8)))
        text = await metrics_of(url)
    n = len(speech.utterances)
    for result in results:
        assert [f["segment"] for f in result.of("final")] == list(range(n))
        assert result.messages[-1] == {"type": "done", "segments": n}
    assert metric(text, "unipad_partials_dropped_total") > 0
    assert metric(text, "unipad_segments_total") == 8 * n


async def test_device_failure_rebuilds_the_engine_and_service_continues(serve_test_server, speech):
    """A provider-style failure (what a lost GPU raises) through the engine's hook: the sessions are
    rebuilt, the failed run retried, the final arrives, and the rebuild is counted in /metrics."""
    failed = []

    def lose_device(call: int) -> None:
        if call == 2 and not failed:
            failed.append(call)
            raise RuntimeError("CUDA failure 999: unspecified launch failure (device lost)")

    async with serve_test_server(partial_interval=0) as url:
        url.server.engine.fault_hook = lose_device
        result = await run_stream(url, speech.audio)
        again = await run_stream(url, speech.audio)
        text = await metrics_of(url)
        rebuilds = url.server.engine.stats.rebuilds
    assert failed == [2] and rebuilds == 1
    assert metric(text, "unipad_engine_rebuilds_total") == 1
    for r in (result, again):
        assert [f["segment"] for f in r.of("final")] == list(range(len(speech.utterances)))
        assert not r.of("error")


async def test_disconnect_mid_segment_leaks_no_tasks(serve_test_server, speech):
    async with serve_test_server(partial_interval=0.3) as url:
        await run_stream(url, speech.audio)  # warm every lazy path once
        await eventually(lambda: not url.server.connections)
        before = len(asyncio.all_tasks())
        for _ in range(5):
            async with websockets.connect(url) as ws:
                await ws.send(START)
                await ws.recv()
                await ws.send(pcm16(speech.audio[: seconds_to_samples(speech.utterances[1]["end"] - 0.3)]))
                await ws.recv()  # the first final: the second segment is open and has partials running
        await eventually(lambda: not url.server.connections and url.server.worker.depth == 0)
        await eventually(lambda: len(asyncio.all_tasks()) <= before)
        text = await metrics_of(url)
    assert metric(text, "unipad_sessions_active") == 0


async def test_a_closed_connection_is_freed_without_the_cycle_collector(serve_test_server, speech):
    """Every stream connection the client closed, ours and OpenAI Realtime's, mid-segment or idle, is freed
    as soon as it ends. The cancelled send task kept its CancelledError, whose traceback held the connection:
    a reference cycle that only Python's full collection freed, with the segmenter's buffers. And the worker
    kept its last round's jobs while it waited for the next, and through their delivery their connections."""
    import gc

    from server.streaming import StreamConnection

    def alive() -> int:
        return sum(issubclass(type(o), StreamConnection) for o in gc.get_objects())  # (type: weak proxies)

    async with serve_test_server() as url:
        await run_stream(url, speech.audio)  # warm every lazy path once
        gc.collect()
        gc.disable()
        try:
            for _ in range(3):
                async with websockets.connect(url) as ws:
                    await ws.send(START)
                    await ws.recv()
                    await ws.send(pcm16(speech.audio[: seconds_to_samples(speech.utterances[1]["end"] - 0.3)]))
                    await ws.recv()  # a final: the next segment is open
                async with websockets.connect(f"ws://127.0.0.1:{url.port}/v1/realtime?intent=transcription") as ws:
                    await ws.recv()  # session.created
                async with websockets.connect(url):
                    pass  # gone before it started
            await eventually(lambda: not url.server.connections and url.server.worker.depth == 0)
            await eventually(lambda: alive() == 0, timeout=2.0)
        finally:
            gc.enable()


async def test_shutdown_stops_accepting_while_it_drains(serve_test_server, word):
    running, release = threading.Event(), threading.Event()

    def stuck(call: int) -> None:
        running.set()
        release.wait(60)

    try:
        async with serve_test_server(partial_interval=0) as url:
            url.server.engine.fault_hook = stuck
            async with websockets.connect(url) as ws:
                await ws.send(START)
                await ws.recv()
                await ws.send(pcm16(word))
                assert await asyncio.to_thread(running.wait, 30)
                url.server.request_shutdown()
                await eventually(lambda: url.server.readiness()[1]["status"] == "shutting_down")
                with pytest.raises((OSError, websockets.InvalidStatus, websockets.InvalidHandshake)):
                    async with websockets.connect(url, open_timeout=10):
                        pass
                release.set()
                messages = [json.loads(m) async for m in ws]
                assert ws.close_code == CLOSE_GOING_AWAY
        assert [m["type"] for m in messages] == ["final", "done"]
    finally:
        release.set()


# ---- silence and noise give no text ------------------------------------------------------------------

def noise(kind: str, dbfs: float, seconds: float = 10.0, seed: int = 0) -> np.ndarray:
    """float32 [n] white, pink (1/f) or brown (1/f^2) noise with an RMS of `dbfs` dB full scale."""
    rng = np.random.default_rng(seed)
    n = seconds_to_samples(seconds)
    if kind == "silence":
        return np.zeros(n, np.float32)
    exponent = {"white": 0, "pink": 1, "brown": 2}[kind]
    freqs = np.fft.rfftfreq(n)
    freqs[0] = freqs[1]
    spectrum = (rng.standard_normal(len(freqs)) + 1j * rng.standard_normal(len(freqs))) / freqs ** (exponent / 2)
    x = np.fft.irfft(spectrum, n)
    x *= 10 ** (dbfs / 20) / np.sqrt(np.mean(x ** 2))
    return np.clip(x, -1, 1).astype(np.float32)


QUIET = [("silence", -120), ("white", -40), ("pink", -40), ("brown", -40)]
LOUD = [("white", -20), ("pink", -25), ("brown", -10)]  # the segmenter opens segments on these


async def test_silence_and_quiet_noise_give_no_segments(serve_test_server):
    async with serve_test_server() as url:
        results = await asyncio.gather(*(run_stream(url, noise(k, db), chunk_seconds=0.5) for k, db in QUIET))
    for (kind, _), result in zip(QUIET, results):
        assert [m["type"] for m in result.messages] == ["ready", "done"], kind


DEMO_MODEL = Path(__file__).resolve().parents[2] / "models" / "demo"


@pytest.mark.skipif(not (DEMO_MODEL / "manifest.json").is_file(), reason="needs the trained demo model (models/demo)")
async def test_loud_noise_gives_no_words_with_the_demo_model(serve_test_server):
    async with serve_test_server(model=DEMO_MODEL, partial_interval=0) as url:
        results = await asyncio.gather(*(run_stream(url, noise(k, db), chunk_seconds=0.5) for k, db in LOUD + QUIET))
    for (kind, db), result in zip(LOUD + QUIET, results):
        assert [f["text"] for f in result.of("final") if f["text"].strip()] == [], (kind, db)
