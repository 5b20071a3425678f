"""Client-side helpers for the server tests: raw HTTP GETs, whole-stream WebSocket sessions, one input through
FunASR's protocol, and what a running server's engine hears."""
from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence
from urllib.parse import urlsplit

import numpy as np
import websockets

from pipeline.audio import SAMPLE_RATE


def pcm16(audio: np.ndarray) -> bytes:
    """float32 [n] in [-1, 1] -> s16le bytes."""
    return np.clip(np.round(audio * 32767), -32768, 32767).astype("<i2").tobytes()


def wav16(audio: np.ndarray, rate: int = SAMPLE_RATE) -> bytes:
    """A 16-bit WAV file of the very samples pcm16 sends (a random decoder flips on the last bit), its header
    saying `rate`."""
    import io

    import soundfile

    out = io.BytesIO()
    soundfile.write(out, np.frombuffer(pcm16(audio), "<i2"), rate, format="WAV")
    return out.getvalue()


async def http_get(base: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """One plain HTTP/1.1 GET; returns (status, lower-cased headers, body)."""
    parts = urlsplit(base)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    lines = [f"GET {path} HTTP/1.1", f"Host: {parts.netloc}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
    await writer.drain()
    raw = await reader.read()
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    fields = dict(line.split(": ", 1) for line in header_lines)
    return int(status_line.split()[1]), {k.lower(): v for k, v in fields.items()}, body


@dataclass
class StreamResult:
    messages: list[dict[str, Any]] = field(default_factory=list)
    close_code: int | None = None
    close_reason: str = ""
    arrived: asyncio.Event = field(default_factory=asyncio.Event, repr=False)  # set on each new message

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.messages if m["type"] == kind]

    async def wait_for(self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 60) -> None:
        """Until some received message satisfies `predicate` (no pacing: the test waits for an event)."""
        async def poll() -> None:
            while not any(predicate(m) for m in self.messages):
                self.arrived.clear()
                await self.arrived.wait()
        await asyncio.wait_for(poll(), timeout)


async def run_stream(
    url: str,
    audio: np.ndarray,
    start: dict[str, Any] | None = None,
    chunk_seconds: float = 0.1,
    stop: bool = True,
    pauses: Sequence[tuple[float, Callable[[dict[str, Any]], bool]]] = (),
    **connect: Any,
) -> StreamResult:
    """Send `start`, the audio (float32 at SAMPLE_RATE) as s16le chunks without pacing, `stop`; collect
    every message until the server closes. `pauses`: (seconds, predicate) pairs: once the audio up to
    `seconds` is sent, wait until a message satisfies `predicate` before sending more."""
    result = StreamResult()
    async with websockets.connect(url, **connect) as ws:
        await ws.send(json.dumps({"type": "start", "sample_rate": SAMPLE_RATE, **(start or {})}))
        reader = asyncio.ensure_future(_collect(ws, result))
        data = pcm16(audio)
        step = int(chunk_seconds * SAMPLE_RATE) * 2
        waits = sorted(pauses, key=lambda p: p[0])
        for i in range(0, len(data), step):
            await ws.send(data[i:i + step])
            while waits and (i + step) // 2 >= waits[0][0] * SAMPLE_RATE:
                await result.wait_for(waits.pop(0)[1])
        if stop:
            await ws.send(json.dumps({"type": "stop"}))
        await reader
    return result


async def _collect(ws: Any, result: StreamResult) -> None:
    try:
        async for message in ws:
            result.messages.append(json.loads(message))
            result.arrived.set()
    except websockets.ConnectionClosed:
        pass
    result.close_code, result.close_reason = ws.close_code, ws.close_reason or ""


async def send_and_collect(url: str, frames: list[str | bytes], **connect: Any) -> StreamResult:
    """Send raw frames (no implicit start), then collect messages until the server closes."""
    result = StreamResult()
    async with websockets.connect(url, **connect) as ws:
        reader = asyncio.ensure_future(_collect(ws, result))
        try:
            for frame in frames:
                await ws.send(frame)
        except websockets.ConnectionClosed:
            pass
        await reader
    return result


async def eventually(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll `condition` until true: for server-side cleanup that finishes just after the client sees the close."""
    for _ in range(int(timeout / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    assert condition()


async def funasr_input(port: int, audio: np.ndarray, mode: str, pace: float = 0.0) -> list[dict]:
    """One input through FunASR's runtime protocol on `port` (plain websockets, as FunASR's clients speak it), 0.2 s
    of audio a message and `pace` seconds between them: every message up to the one with is_final: true."""
    async with websockets.connect(f"ws://127.0.0.1:{port}/", subprotocols=["binary"]) as ws:
        await ws.send(json.dumps({"mode": mode, "wav_name": "speech", "wav_format": "pcm", "audio_fs": SAMPLE_RATE,
                                  "is_speaking": True, "chunk_size": [5, 10, 5], "chunk_interval": 10, "itn": True}))
        data = pcm16(audio)
        for i in range(0, len(data), SAMPLE_RATE // 5):
            await ws.send(data[i:i + SAMPLE_RATE // 5])
            await asyncio.sleep(pace)
        await ws.send(json.dumps({"is_speaking": False}))
        messages: list[dict] = []
        while not messages or not messages[-1]["is_final"]:
            messages.append(json.loads(await asyncio.wait_for(ws.recv(), 60)))
    return messages


@contextlib.contextmanager
def watch_clips(server: Any) -> Iterator[list[tuple[np.ndarray, float]]]:
    """What a running server's engine transcribes while the block runs: (a copy of each clip's float32 audio, the
    stream second of its first sample), in order."""
    engine = server.worker.engine
    heard: list[tuple[np.ndarray, float]] = []
    transcribe_many = engine.transcribe_many

    def watched(clips: Sequence[Any], offsets: Sequence[float], *args: Any, **kwargs: Any) -> Any:
        heard.extend((np.array(clip.audio, dtype=np.float32), float(offset)) for clip, offset in zip(clips, offsets))
        return transcribe_many(clips, offsets, *args, **kwargs)

    engine.transcribe_many = watched
    try:
        yield heard
    finally:
        del engine.transcribe_many
