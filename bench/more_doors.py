"""The doors issue 36 adds to `python -m bench frameworks` (bench/frameworks.py runs them beside the others):

    funasr-offline     our FunASR runtime protocol (--funasr-port), driven as FunASR's funasr_wss_client.py
                       sends a file: one connection per recording, its first message {"mode": "offline",
                       "chunk_size": [5, 10, 5], "chunk_interval": 10, ...}, 60 ms PCM chunks, then
                       {"is_speaking": false}; the "offline" results' texts joined
    funasr-2pass       the same in mode "2pass", the chunks at PACE x real time (the client paces 2pass by
                       the clock); the "2pass-offline" results' texts joined
    pipecat-file       pipecat's OpenAISTTService (a SegmentedSTTService: each turn its Silero VAD marks is
                       uploaded to /v1/audio/transcriptions as a WAV) with its defaults, in real time (each
                       upload goes out when its turn ends, which is how the server knows the pieces of one
                       stream: server/upload_sequence.py; faster, `bench frameworks --file-pace`, every
                       piece stands alone)
    pipecat-file-0.8   the same with the VAD's stop_secs 0.8 (VADParams(stop_secs=0.8)), as docs/openai.md
                       advises for this service: its default 0.2 cuts at pauses between words, and a word
                       that begins as the cut is confirmed loses its onset to the previous upload
    livekit-recognize  livekit-plugins-openai's STT with its defaults for a non-streaming call
                       (use_realtime=False): recognize() once per recording, as an agent calls it once per
                       finished utterance
    agents             openai-agents' VoicePipeline with its defaults (StreamedAudioInput: semantic_vad at
                       24 kHz), the recordings one after another; its turns' transcripts joined
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import numpy as np

from pipeline.audio import SAMPLE_RATE

from .framework_drivers import FRAME_MS, agents_chunks, agents_turns, pipecat_transcripts
from .silence import TIMEOUT, pcm16

DOORS = ("funasr-offline", "funasr-2pass", "pipecat-file", "pipecat-file-0.8", "livekit-recognize", "agents")
REAL_TIME = 1.0  # the pace of the doors that upload pieces of one stream
ADVISED_STOP_SECS = 0.8  # pipecat's Silero VAD for a service that uploads each turn (docs/openai.md)
FUNASR_CHUNK = {"chunk_size": [5, 10, 5], "chunk_interval": 10}  # funasr_wss_client.py's defaults: 60 ms a chunk
FUNASR_CHUNK_BYTES = SAMPLE_RATE * 60 // 1000 * 2
FUNASR_FINALS = {"offline": "offline", "2pass": "2pass-offline"}  # the mode asked -> its final results' mode
KEY = "bench"


async def funasr_text(port: int, audio: list[np.ndarray], mode: str, pace: float) -> str:
    """Each recording on a connection of its own, as funasr_wss_client.py sends one file; the final
    results' texts joined (pipeline.transcript.join_texts: FunASR's spacing)."""
    import websockets

    from pipeline.transcript import join_texts

    texts: list[str] = []
    for n, recording in enumerate(audio):
        data, messages = pcm16(recording), []
        async with websockets.connect(f"ws://127.0.0.1:{port}", subprotocols=["binary"], max_size=None) as ws:
            async def read() -> None:  # alongside the sending: 2pass answers partials as the audio comes
                while not (messages and messages[-1].get("is_final")):
                    messages.append(json.loads(await ws.recv()))

            reader = asyncio.ensure_future(read())
            await ws.send(json.dumps({"mode": mode, **FUNASR_CHUNK, "encoder_chunk_look_back": 4,
                                      "decoder_chunk_look_back": 0, "audio_fs": SAMPLE_RATE, "wav_name": f"bench{n}",
                                      "wav_format": "pcm", "is_speaking": True, "hotwords": "", "itn": True}))
            for i in range(0, len(data), FUNASR_CHUNK_BYTES):
                await ws.send(data[i:i + FUNASR_CHUNK_BYTES])
                # the client's own sleeps: 1 ms between offline chunks, a chunk's duration in 2pass
                await asyncio.sleep(0.001 if mode == "offline" else 0.06 / pace)
            await ws.send(json.dumps({"is_speaking": False}))
            await asyncio.wait_for(reader, TIMEOUT)
        texts += [m["text"] for m in messages if m.get("mode") == FUNASR_FINALS[mode]]
    return join_texts(texts)


async def pipecat_file_text(port: int, frames: list[bytes], pace: float, quiet: float,
                            stop_secs: float | None = None) -> str:
    from pipecat.services.openai.stt import OpenAISTTService

    service = OpenAISTTService(api_key=KEY, base_url=f"http://127.0.0.1:{port}/v1")
    return " ".join(await pipecat_transcripts(service, frames, pace, quiet, stop_secs=stop_secs))


async def livekit_recognize_text(port: int, audio: list[np.ndarray]) -> str:
    from livekit import rtc
    from livekit.agents import stt as agents_stt
    from livekit.plugins import openai as lk_openai

    stt = lk_openai.STT(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, use_realtime=False)
    step = SAMPLE_RATE * FRAME_MS // 1000
    texts = []
    for recording in audio:
        data = pcm16(recording)
        frames = [rtc.AudioFrame(data[i:i + step * 2], sample_rate=SAMPLE_RATE, num_channels=1,
                                 samples_per_channel=len(data[i:i + step * 2]) // 2)
                  for i in range(0, len(data), step * 2)]
        event = await stt.recognize(frames)
        if event.type != agents_stt.SpeechEventType.FINAL_TRANSCRIPT:
            raise RuntimeError(f"LiveKit's recognize() gave {event.type}")
        texts.append(event.alternatives[0].text)
    return " ".join(texts)


async def agents_text(port: int, frames: list[bytes], pace: float) -> str:
    turns, events = await agents_turns(f"http://127.0.0.1:{port}/v1", KEY, agents_chunks(frames), pace)
    if errors := [e for e in events if e.type == "voice_stream_event_error"]:
        raise RuntimeError(f"openai-agents' voice pipeline failed: {errors}")
    return " ".join(turns)


def drivers(port: int, funasr_port: int, audio: list[np.ndarray], frames: list[bytes], pace: float,
            quiet: float, file_pace: float = REAL_TIME) -> dict[str, Callable[[], Awaitable[str]]]:
    """Per door of DOORS, what measures it: the joined text of the recordings; `frames`: them one after
    another, with their gaps, as 20 ms PCM16 frames (bench/frameworks.py's frames()); `file_pace`: the
    pipecat file doors' (faster than real time, each piece stands alone)."""
    return {"funasr-offline": lambda: funasr_text(funasr_port, audio, "offline", pace),
            "funasr-2pass": lambda: funasr_text(funasr_port, audio, "2pass", pace),
            "pipecat-file": lambda: pipecat_file_text(port, frames, file_pace, quiet),
            "pipecat-file-0.8": lambda: pipecat_file_text(port, frames, file_pace, quiet, ADVISED_STOP_SECS),
            "livekit-recognize": lambda: livekit_recognize_text(port, audio),
            "agents": lambda: agents_text(port, frames, pace)}
