"""The Deepgram doors of `python -m bench frameworks` (bench/frameworks.py runs them beside the upload):

    dg-post      POST /v1/listen, one recording at a time (WAV body)
    dg-live      /v1/listen WebSocket, linear16 16 kHz, the recordings one after another (20 ms frames at
                 PACE x real time), CloseStream at the end
    dg-livekit   livekit-plugins-deepgram's STT(base_url=...) with its defaults, stream()
    dg-pipecat   pipecat's DeepgramSTTService(base_url=...) with its defaults
and `timing()`: one live stream at real-time pace with interim results, endpointing and utterance_end_ms, for
the interim results per speech-second and how long after the end silence speech_final and UtteranceEnd come
(UtteranceEnd: after last_word_end + utterance_end_ms, and after the later of that and the VAD's end + the end
silence, since it waits for the final's words).
"""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from pipeline.audio import SAMPLE_RATE

from .framework_drivers import FRAME_MS, livekit_events, livekit_finals
from .silence import joined, pcm16_frames, wav_bytes

DOORS = ("dg-post", "dg-live", "dg-livekit", "dg-pipecat")
LIVE_QUERY = "encoding=linear16&sample_rate=16000&model=nova-3"
ENDPOINTING_MS = 500  # timing(): the end silence asked for (the server's default too)
UTTERANCE_END_MS = 1000  # timing(): Deepgram's smallest


def chunks(audio: list[np.ndarray], gap: float) -> list[bytes]:
    return pcm16_frames(joined(audio, gap), FRAME_MS)


async def post_text(port: int, audio: np.ndarray) -> str:
    body = wav_bytes(audio)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write((f"POST /v1/listen?model=nova-3 HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: audio/wav\r\n"
                  f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body)
    answer = await reader.read()
    writer.close()
    data = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    return data["results"]["channels"][0]["alternatives"][0]["transcript"]


async def live(port: int, frames: list[bytes], query: str, pace: float) -> tuple[list[tuple[float, dict]], list[float]]:
    """Send `frames` at `pace` x real time, then CloseStream; (arrival time, message) of each message and the
    wall time each frame was sent."""
    import websockets

    got: list[tuple[float, dict]] = []
    sent: list[float] = []
    async with websockets.connect(f"ws://127.0.0.1:{port}/v1/listen?{query}",
                                  additional_headers={"Authorization": "Token bench"}, max_size=None) as ws:
        async def read() -> None:
            async for message in ws:
                got.append((time.monotonic(), json.loads(message)))

        reader = asyncio.ensure_future(read())
        start = time.monotonic()
        for n, frame in enumerate(frames):
            await asyncio.sleep(max(0.0, start + n * 0.02 / pace - time.monotonic()))
            await ws.send(frame)
            sent.append(time.monotonic())
        await ws.send(json.dumps({"type": "CloseStream"}))
        await asyncio.wait_for(reader, 600)
    return got, sent


def finals_text(got: list[tuple[float, dict]]) -> str:
    return " ".join(m["channel"]["alternatives"][0]["transcript"] for _, m in got
                    if m["type"] == "Results" and m["is_final"])


async def livekit_text(port: int, frames: list[bytes], pace: float, quiet: float) -> str:
    from livekit.agents import utils
    from livekit.plugins import deepgram

    async with utils.http_context.open():
        stream = deepgram.STT(base_url=f"http://127.0.0.1:{port}/v1/listen", api_key="bench").stream()
        events = await livekit_events(stream, frames, pace, quiet, end_first=False)
    return " ".join(livekit_finals(events))


async def pipecat_text(port: int, frames: list[bytes], pace: float, quiet: float) -> str:
    from pipecat.frames.frames import InputAudioRawFrame, TranscriptionFrame
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.services.deepgram.stt import DeepgramSTTService
    from pipecat.tests.utils import SleepFrame, run_test

    service = DeepgramSTTService(base_url=f"http://127.0.0.1:{port}", api_key="bench")
    sent: list[Any] = []
    for chunk in frames:
        sent += [InputAudioRawFrame(audio=chunk, sample_rate=SAMPLE_RATE, num_channels=1), SleepFrame(sleep=0.02 / pace)]
    down, _ = await run_test(Pipeline([service]), frames_to_send=sent + [SleepFrame(sleep=quiet)], start_timeout=30.0)
    return " ".join(f.text for f in down if isinstance(f, TranscriptionFrame))


def drivers(port: int, audio: list[np.ndarray], gap: float, pace: float,
            quiet: float) -> dict[str, Callable[[], Awaitable[str]]]:
    """Per door of DOORS, what measures it: the joined text of the recordings (the live doors: them one
    after another, each with `gap` s of silence after it)."""
    frames = chunks(audio, gap)

    async def live_text() -> str:
        return finals_text((await live(port, frames, LIVE_QUERY, pace))[0])

    async def post_texts() -> str:
        return " ".join([await post_text(port, a) for a in audio])

    return {"dg-post": post_texts, "dg-live": live_text, "dg-livekit": lambda: livekit_text(port, frames, pace, quiet),
            "dg-pipecat": lambda: pipecat_text(port, frames, pace, quiet)}


async def timing(port: int, audio: list[np.ndarray], gap: float) -> dict[str, Any]:
    """One stream at real-time pace: interim results per speech-second (speech: the finals' spans), and
    seconds from the moment the end silence (or utterance_end_ms after the last word) was sent to the arrival
    of speech_final (UtteranceEnd), median and max."""
    query = (f"{LIVE_QUERY}&interim_results=true&endpointing={ENDPOINTING_MS}&utterance_end_ms={UTTERANCE_END_MS}"
             "&vad_events=true")
    got, sent = await live(port, chunks(audio, gap), query, 1.0)

    def sent_at(stream_seconds: float) -> float:  # when the frame holding this stream time went out
        return sent[min(len(sent) - 1, int(stream_seconds / 0.02))]

    results = [(t, m) for t, m in got if m["type"] == "Results"]
    finals = [(t, m) for t, m in results if m["is_final"] and m["channel"]["alternatives"][0]["transcript"]]
    speech = sum(m["duration"] for _, m in finals)
    interims = sum(1 for _, m in results if not m["is_final"])
    final_lag = [t - sent_at(m["start"] + m["duration"] + ENDPOINTING_MS / 1000) for t, m in finals if m["speech_final"]]
    # UtteranceEnd needs the final's words, which come after the VAD's end silence: where the VAD heard sound
    # after the last word (a breath, a word the model missed), that is later than last_word_end + the wait
    word_lag, due_lag, speech_end = [], [], 0.0
    for t, m in got:
        if m["type"] == "Results" and m["is_final"]:
            speech_end = m["start"] + m["duration"]
        elif m["type"] == "UtteranceEnd":
            word_lag.append(t - sent_at(m["last_word_end"] + UTTERANCE_END_MS / 1000))
            due_lag.append(t - sent_at(max(m["last_word_end"] + UTTERANCE_END_MS / 1000,
                                           speech_end + ENDPOINTING_MS / 1000)))

    def summary(values: list[float]) -> dict[str, Any]:
        if not values:
            return {"count": 0}
        return {"count": len(values), "median": round(float(np.median(values)), 3),
                "p90": round(float(np.percentile(values, 90)), 3), "max": round(max(values), 3)}

    return {"speech_seconds": round(speech, 2), "interims": interims,
            "interims_per_speech_second": round(interims / max(speech, 1e-9), 2),
            "speech_final_after_end_silence": summary(final_lag),
            "utterance_end_after_last_word_and_wait": summary(word_lag),
            "utterance_end_after_wait_and_end_silence": summary(due_lag)}
