"""`python -m bench frameworks`: WER per door, with each framework's own client (issues 25 point 4 and 36).

The recordings are the demo model's held-out espeak-ng set (bench/silence.py renders them, with each
leading silence of --silences, 0.5 s by default, under one --noises kind at --noise-level if asked). They go
through one server we start (with --vad):

    upload           POST /v1/audio/transcriptions, one recording at a time
    upload-5ms       the upload of each recording after 5 (15) ms of digital silence: the same sound on another
    upload-15ms      phase of the 30 ms VAD frames, as in a stream, where it follows the gap. How far these are
                     from upload is the model's own sensitivity to where its audio begins (a word flips on a
                     1 ms shift), no door's doing; at 40 recordings it is often 2-3 words, over the 1-point bar
    upload-24k       the same, each recording resampled to 24 kHz first: what pipecat and LiveKit send (they
                     resample to OpenAI's 24 kHz), so their doors compare with this one; the round trip
                     through 24 kHz alone moves the demo model's WER by about a point
    realtime-null    OpenAI Realtime, turn_detection null, one commit per recording (bench/silence.py)
    realtime-600     OpenAI Realtime, server VAD with prefix_padding_ms 600 (LiveKit's default), then a commit
    pipecat          pipecat's OpenAIRealtimeSTTService in its default mode: its Silero VAD commits each turn
    livekit          livekit-plugins-openai's STT with use_realtime=True (its server VAD, prefix 600 ms)
    wyoming          the `wyoming` package's client on --wyoming-port, one request per recording (Home
                     Assistant's voice commands), 16 kHz PCM16 in 64 ms chunks; its `transcript`
    wyoming-joined   the same, one request holding every recording with GAP s of silence after each (a long
                     dictation with pauses, cut by the server's VAD)
    dg-*             the Deepgram doors (bench/deepgram.py): POST, a raw live stream, LiveKit's and pipecat's
                     Deepgram STT with their defaults; plus interim results per speech-second and the
                     speech_final / UtteranceEnd delays of one real-time live stream ("deepgram_timing")
    funasr-offline   the FunASR doors (bench/more_doors.py), on --funasr-port, as FunASR's funasr_wss_client.py
    funasr-2pass     sends a file: mode "offline" (its final results) and "2pass" (its 2pass-offline results)
    pipecat-file     pipecat's OpenAISTTService with its defaults: each VAD turn uploaded as a file
    livekit-recognize  livekit-plugins-openai's STT.recognize() (use_realtime=False), once per recording
    agents           openai-agents' VoicePipeline with its defaults (StreamedAudioInput, semantic_vad)

The streaming doors (pipecat, pipecat-file, livekit, agents, dg-live, dg-livekit, dg-pipecat) hear
the recordings one after another in one session (20 ms frames at PACE x real time, with GAP s of silence
after each, as docs/openai.md configures them); funasr-2pass gets 60 ms chunks at PACE x real time, one
connection per recording. WER is counted over the joined texts, for every door alike.
--doors picks some of them (the upload, the bar's reference, always: a larger set of recordings for a few
doors is then affordable). The issues' bar (25, 36): each door within 1 WER point of the 16 kHz upload (the
frameworks' that resample to 24 kHz: of upload-24k too).
"""
from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import soxr

from pipeline.audio import SAMPLE_RATE

from .common import command_line, emit, machine, say
from .serverproc import ServerProcess, free_port
from . import deepgram, more_doors, silence
from .framework_drivers import FRAME_MS, livekit_events, livekit_finals, pipecat_transcripts
from .silence import LIVEKIT_VAD, Realtime, joined, pcm16, pcm16_frames, recordings, upload_text

DOORS = ("upload", "upload-5ms", "upload-15ms", "upload-24k", "realtime-null", "realtime-600", "pipecat", "livekit",
         "wyoming", "wyoming-joined",
         *deepgram.DOORS, *more_doors.DOORS)
WIRE_RATE = 24000  # OpenAI's Realtime rate, which both frameworks resample to
PACE = 4.0  # frames go out this many times faster than real time
GAP = silence.TURN_GAP  # seconds of silence after each recording (a turn ends)
QUIET = 5.0  # seconds without a new transcript after the last frame: the session is done
PHASES_MS = (5, 15)  # the upload-*ms doors: a sixth and a half of a VAD frame


def frames(audio: list[np.ndarray]) -> list[bytes]:
    """Every recording, each followed by GAP s of silence, as 20 ms PCM16 frames."""
    return pcm16_frames(joined(audio, GAP), FRAME_MS)


async def pipecat_text(port: int, audio: list[np.ndarray]) -> str:
    from pipecat.services.openai.stt import OpenAIRealtimeSTTService

    service = OpenAIRealtimeSTTService(api_key="bench", base_url=f"ws://127.0.0.1:{port}/v1/realtime",
                                       model="gpt-4o-transcribe")
    return " ".join(await pipecat_transcripts(service, frames(audio), PACE, QUIET))


async def livekit_text(port: int, audio: list[np.ndarray]) -> str:
    from livekit.agents import utils
    from livekit.plugins import openai as lk_openai

    async with utils.http_context.open():
        stt = lk_openai.STT(base_url=f"http://127.0.0.1:{port}/v1", api_key="bench", model="gpt-4o-transcribe",
                            use_realtime=True)
        events = await livekit_events(stt.stream(), frames(audio), PACE, QUIET)
    return " ".join(livekit_finals(events))


async def wyoming_text(port: int, audio: list[np.ndarray]) -> str:
    """One Wyoming request per recording in `audio`; the transcripts joined."""
    from wyoming.asr import Transcribe, Transcript
    from wyoming.audio import AudioChunk, AudioStart, AudioStop
    from wyoming.client import AsyncTcpClient

    texts = []
    fmt = {"rate": SAMPLE_RATE, "width": 2, "channels": 1}
    for recording in audio:
        data, step = pcm16(recording), SAMPLE_RATE * 64 // 1000 * 2
        async with AsyncTcpClient("127.0.0.1", port, read_timeout=60.0) as client:  # as Home Assistant does
            await client.write_event(Transcribe(language="en").event())
            await client.write_event(AudioStart(**fmt).event())
            for i in range(0, len(data), step):
                await client.write_event(AudioChunk(**fmt, audio=data[i:i + step]).event())
            await client.write_event(AudioStop().event())
            while not Transcript.is_type((event := await client.read_event()).type):
                pass
            texts.append(Transcript.from_event(event).text)
    return " ".join(texts)


def drivers(port: int, audio: list[np.ndarray], wyoming_port: int, funasr_port: int,
            file_pace: float = more_doors.REAL_TIME) -> dict[str, Callable[[], Awaitable[str]]]:
    """Per door of DOORS, what measures it: the joined text of the recordings."""
    async def uploads(recordings: list[np.ndarray], rate: int = SAMPLE_RATE) -> str:
        return " ".join([await upload_text(port, a, rate) for a in recordings])

    async def realtime(vad: dict | None) -> str:
        async with Realtime(port, vad) as session:
            return " ".join([await session.text(a) for a in audio])

    out = {"upload": lambda: uploads(audio),
           "upload-24k": lambda: uploads([soxr.resample(a, SAMPLE_RATE, WIRE_RATE) for a in audio], WIRE_RATE),
           "realtime-null": lambda: realtime(None), "realtime-600": lambda: realtime(LIVEKIT_VAD),
           "pipecat": lambda: pipecat_text(port, audio), "livekit": lambda: livekit_text(port, audio),
           "wyoming": lambda: wyoming_text(wyoming_port, audio),
           "wyoming-joined": lambda: wyoming_text(wyoming_port, [joined(audio, GAP)])}
    for ms in PHASES_MS:
        lead = np.zeros(ms * SAMPLE_RATE // 1000, np.float32)
        out[f"upload-{ms}ms"] = lambda lead=lead: uploads([np.concatenate([lead, a]) for a in audio])
    out |= more_doors.drivers(port, funasr_port, audio, frames(audio), PACE, QUIET, file_pace)
    return out | deepgram.drivers(port, audio, GAP, PACE, QUIET)


async def through_doors(port: int, audio: list[np.ndarray], wyoming_port: int, funasr_port: int,
                        doors: tuple[str, ...] = DOORS, file_pace: float = more_doors.REAL_TIME) -> dict[str, str]:
    """The joined texts of the recordings at each of `doors`."""
    measure = drivers(port, audio, wyoming_port, funasr_port, file_pace)
    return {door: await measure[door]() for door in doors}


def wer(reference: str, hypothesis: str) -> dict[str, Any]:
    from export.evaluate import normalize, word_errors

    errors, words = word_errors(reference, hypothesis), len(normalize(reference))
    return {"wer": round(errors / max(1, words), 4), "errors": errors, "words": words}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    silence.add_arguments(parser)  # the same recordings and server settings as `python -m bench silence`
    parser.add_argument("--doors", default=",".join(DOORS),
                        help="the doors to measure, comma-separated (default: all); upload, the bar's reference, "
                             "always")
    parser.add_argument("--file-pace", type=float, default=more_doors.REAL_TIME,
                        help="times real time for the pipecat file doors (default: real time, as a live pipeline "
                             "sends; faster, each piece stands alone, as every upload did before joining)")
    parser.set_defaults(utterances=40, silences="0.5")


def run(args: argparse.Namespace) -> int:
    from export.synth import ROOM_NOISE_KINDS

    silences = tuple(float(s) for s in args.silences.split(","))
    if args.utterances < 1 or any(s < 0 for s in silences) or args.file_pace <= 0:
        raise ValueError("--utterances must be at least 1, --silences at least 0 and --file-pace above 0")
    if "," in args.noises or args.noises not in ("none", *ROOM_NOISE_KINDS):
        raise ValueError(f"--noises: one noise at a time here (none, {', '.join(ROOM_NOISE_KINDS)})")
    asked = {d.strip() for d in args.doors.split(",") if d.strip()}
    if unknown := sorted(asked - set(DOORS)):
        raise ValueError(f"--doors: no door {', '.join(unknown)} (there are {', '.join(DOORS)})")
    doors = tuple(d for d in DOORS if d in asked | {"upload"})
    say(f"rendering {args.utterances} held-out recordings x {len(silences)} silences, noise {args.noises}")
    texts, audio = recordings(args.model, args.utterances, args.seed, silences, args.workers, args.noises,
                              args.noise_level)
    wyoming_port, funasr_port = free_port(), free_port()
    # partials on (the server's default interval): the Deepgram timing counts interim results; no door's
    # final text depends on them
    server_args = argparse.Namespace(model=args.model, end_silence=0.5, partial_interval=0.5, precision=args.precision,
                                     threads=args.threads, containers=None, server_log=args.server_log,
                                     options=("--wyoming-port", str(wyoming_port), "--funasr-port", str(funasr_port),
                                              "--vad", args.vad))
    server = ServerProcess(server_args, max_sessions=4)
    result: dict[str, Any] = {"command": command_line(), "machine": machine(), "model": str(args.model),
                              "precision": args.precision, "utterances": args.utterances, "vad": args.vad,
                              "noise": args.noises, "noise_level": args.noise_level, "file_pace": args.file_pace,
                              "wer": {}}
    try:
        asyncio.run(server.wait_ready(300))
        for lead in silences:
            say(f"silence {lead:g} s: {', '.join(doors)}")
            hypotheses = asyncio.run(through_doors(server.port, audio[lead], wyoming_port, funasr_port, doors,
                                                   args.file_pace))
            result["wer"][silence.row_key(args.noises, lead)] = {door: wer(" ".join(texts), hypotheses[door])
                                                                 for door in doors}
        if set(doors) & set(deepgram.DOORS):
            say("deepgram timing: one live stream at real-time pace")
            result["deepgram_timing"] = asyncio.run(deepgram.timing(server.port, audio[silences[0]], GAP))
            say(json.dumps(result["deepgram_timing"]))
    finally:
        server.stop()
    silence.report(result, doors)
    emit(result, args.save)
    return 0
