"""How pipecat, LiveKit and openai-agents are driven against the server, shared by `python -m bench frameworks`
(bench/frameworks.py, bench/more_doors.py) and the framework tests (tests/frameworks/), so the WER a door
gets is measured the way its test drives it.

No transport, no room: 16 kHz PCM16 audio frames of 20 ms go straight into each framework's STT, as its
transport would push them, at `pace` x real time (real time is not needed; the order and the gaps are)."""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np

from pipeline.audio import SAMPLE_RATE

FRAME_MS = 20  # what transports deliver
AGENTS_RATE = 24000  # what openai-agents' StreamedAudioInput session declares (audio/pcm, rate 24000)


async def pipecat_transcripts(service: Any, frames: list[bytes], pace: float, quiet: float,
                              start_timeout: float = 30.0, stop_secs: float | None = None) -> list[str]:
    """`frames` through pipecat's Silero VAD (VADProcessor: it marks the turns, as a transport's VAD would)
    and `service`, with pipecat's own test harness (run_test); the TranscriptionFrames' texts. `quiet` s
    after the last frame let the last turn's answer come back before the EndFrame. `stop_secs`: the VAD's
    (None: pipecat's default)."""
    from pipecat.audio.vad.silero import SileroVADAnalyzer
    from pipecat.audio.vad.vad_analyzer import VADParams
    from pipecat.frames.frames import InputAudioRawFrame, TranscriptionFrame
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.processors.audio.vad_processor import VADProcessor
    from pipecat.tests.utils import SleepFrame, run_test

    sent: list[Any] = []
    for frame in frames:
        sent += [InputAudioRawFrame(audio=frame, sample_rate=SAMPLE_RATE, num_channels=1),
                 SleepFrame(sleep=FRAME_MS / 1000 / pace)]
    vad = SileroVADAnalyzer(params=None if stop_secs is None else VADParams(stop_secs=stop_secs))
    down, _ = await run_test(Pipeline([VADProcessor(vad_analyzer=vad), service]),
                             frames_to_send=sent + [SleepFrame(sleep=quiet)], start_timeout=start_timeout)
    return [frame.text for frame in down if isinstance(frame, TranscriptionFrame)]


def livekit_frames(frames: list[bytes]) -> list[Any]:
    """16 kHz PCM16 frames as LiveKit's rtc.AudioFrame."""
    from livekit import rtc

    return [rtc.AudioFrame(frame, sample_rate=SAMPLE_RATE, num_channels=1, samples_per_channel=len(frame) // 2)
            for frame in frames]


async def livekit_events(stream: Any, frames: list[bytes], pace: float, quiet: float, *, end_first: bool = True,
                         done: Callable[[list[Any]], bool] = lambda events: False) -> list[Any]:
    """`frames` pushed into a LiveKit STT `stream()` (an agent session's way); every SpeechEvent it gives,
    until done(events) or `quiet` s pass without a new one. The input is ended before that wait (end_first:
    the stream stays open for the last answer) or after it (Deepgram's stream stops reading at the end)."""
    events: list[Any] = []

    async def read() -> None:
        async for event in stream:
            events.append(event)

    reader = asyncio.ensure_future(read())
    for frame in livekit_frames(frames):
        stream.push_frame(frame)
        await asyncio.sleep(FRAME_MS / 1000 / pace)
    if end_first:
        stream.end_input()
    heard, since = -1, time.monotonic()
    while not done(events) and (len(events) != heard or time.monotonic() - since < quiet):
        if len(events) != heard:
            heard, since = len(events), time.monotonic()
        await asyncio.sleep(0.1)
    if not end_first:
        stream.end_input()
    await stream.aclose()
    reader.cancel()
    return events


def livekit_finals(events: list[Any]) -> list[str]:
    from livekit.agents import stt as agents_stt

    return [e.alternatives[0].text for e in events if e.type == agents_stt.SpeechEventType.FINAL_TRANSCRIPT]


def agents_chunks(frames: list[bytes]) -> list[np.ndarray]:
    """16 kHz PCM16 frames as StreamedAudioInput takes them: int16 arrays of 20 ms at AGENTS_RATE."""
    import soxr

    audio = np.frombuffer(b"".join(frames), np.int16).astype(np.float32) / 32768
    audio = (np.clip(soxr.resample(audio, SAMPLE_RATE, AGENTS_RATE), -1, 1) * 32767).astype(np.int16)
    step = AGENTS_RATE * FRAME_MS // 1000
    return [audio[i:i + step] for i in range(0, len(audio) - step + 1, step)]


async def agents_turns(base_url: str, api_key: str, chunks: list[np.ndarray],
                       pace: float) -> tuple[list[str], list[Any]]:
    """openai-agents' VoicePipeline with its defaults over a StreamedAudioInput (its STT session: model
    gpt-transcribe, turn_detection semantic_vad, 24 kHz PCM16); only the base URL and the key are ours. The
    workflow keeps each turn's transcript and says nothing, so no speech is synthesised. The input's end
    (add_audio(None)) commits what is left. Returns the turns' transcripts and the pipeline's events."""
    from agents.voice import (OpenAIVoiceModelProvider, StreamedAudioInput, VoicePipeline, VoicePipelineConfig,
                              VoiceWorkflowBase)

    turns: list[str] = []

    class KeepTranscripts(VoiceWorkflowBase):
        async def run(self, transcription: str) -> AsyncIterator[str]:
            turns.append(transcription)
            return
            yield  # an async generator with nothing to say

    pipeline = VoicePipeline(workflow=KeepTranscripts(), config=VoicePipelineConfig(
        model_provider=OpenAIVoiceModelProvider(base_url=base_url, api_key=api_key),
        tracing_disabled=True))  # traces would be uploaded to OpenAI's platform
    audio = StreamedAudioInput()
    result = await pipeline.run(audio)
    for chunk in chunks:
        await audio.add_audio(chunk)
        await asyncio.sleep(FRAME_MS / 1000 / pace)
    await audio.add_audio(None)
    events = [event async for event in result.stream()]
    return turns, events
