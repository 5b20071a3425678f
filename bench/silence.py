"""`python -m bench silence`: word error rate per door, per second of silence or room noise before the
speech (issues 25 and 36).

The recordings are the demo model's held-out set (export/evaluate.py: espeak-ng voices never used in
training saying word sequences absent from its training texts), rendered once per amount of leading
silence (the recipe's own lead replaced by it; its noise, when it has some, covers the silence too).
With --noises, each is also rendered under pink, brown or room noise (export.synth.ROOM_NOISE_KINDS) at
--noise-level dBFS from its first sample to its last, the lead included. Each recording goes through every
door of one server we start (--vad picks its frame VAD), and through the model alone:

    model         pipeline.engine.Engine on the whole recording, no VAD: what the model itself makes of silence
    upload        POST /v1/audio/transcriptions (the segmenter's segments)
    upload-24k    the same recording resampled to 24 kHz (PCM16 WAV), as a Realtime client's audio is
    stream        our own /v1/stream, sent at once, then stop
    realtime-null OpenAI Realtime, turn_detection null: the recording appended, then committed by hand
    realtime-24k  the same at 24 kHz, OpenAI's own rate (every Realtime client's: pipecat, LiveKit, the SDK)
    realtime-600  OpenAI Realtime, server VAD with LiveKit's prefix_padding_ms 600, then a commit

Issue 25's bar: realtime-null and realtime-600 within 1 WER point of upload on the same recordings, and
each door's WER with silence within 1 point of its WER without. Issue 36's: every door within 1 point of
the clean 16 kHz upload, and the upload in noise within 2 points of it.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import json
import multiprocessing
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.audio import SAMPLE_RATE

from .common import command_line, emit, machine, say
from .serverproc import ServerProcess

SILENCES = (0.0, 0.3, 0.5, 1.0, 2.0)
DOORS = ("model", "upload", "upload-24k", "stream", "realtime-null", "realtime-24k", "realtime-600")
CLIENT_RATE = 24000  # OpenAI Realtime's rate
LIVEKIT_VAD = {"type": "server_vad", "prefix_padding_ms": 600, "silence_duration_ms": 500, "threshold": 0.5}
TRANSCRIPTION = "conversation.item.input_audio_transcription"
APPEND_SECONDS = 5.0  # audio per Realtime append event (160 KB of PCM16: well under the 1 MiB message cap)
# Seconds of silence after each recording in a session: a turn ends, and no speaker begins the next one within
# a 0.2 s pause (without it, at a 0 s lead the next recording's speech came at the commit, less than the
# recording's own trail after the previous speech, and the server rightly heard one utterance going on).
TURN_GAP = 1.0
TIMEOUT = 120.0


def pcm16(audio: np.ndarray) -> bytes:
    return np.clip(np.round(audio * 32768), -32768, 32767).astype("<i2").tobytes()


def joined(audio: list[np.ndarray], gap: float = TURN_GAP) -> np.ndarray:
    """The recordings one after another in one session, each followed by `gap` s of digital silence."""
    silence = np.zeros(int(gap * SAMPLE_RATE), np.float32)
    return np.concatenate([x for a in audio for x in (a, silence)])


def pcm16_frames(audio: np.ndarray, ms: int) -> list[bytes]:
    """`audio` as PCM16 frames of `ms` each, as a transport delivers them (a last partial frame dropped)."""
    data, step = pcm16(audio), SAMPLE_RATE * ms // 1000 * 2
    return [data[i:i + step] for i in range(0, len(data) - step + 1, step)]


def wav_bytes(audio: np.ndarray, rate: int = SAMPLE_RATE) -> bytes:
    import io

    import soundfile

    out = io.BytesIO()
    soundfile.write(out, np.frombuffer(pcm16(audio), "<i2"), rate, subtype="PCM_16", format="WAV")
    return out.getvalue()


# ---- recordings ----------------------------------------------------------------------------------------

def recordings(model_dir: Path, count: int, seed: int | None, silences: tuple[float, ...], workers: int,
               noise: str = "none", level: float = -50.0) -> tuple[list[str], dict[float, list[np.ndarray]]]:
    """The held-out texts and, per leading silence, their audio (PCM16-exact float32 at SAMPLE_RATE), under
    `noise` ("none", or one of export.synth.ROOM_NOISE_KINDS at `level` dBFS) from the first sample on."""
    from export import synth

    chosen = heldout_utterances(model_dir, count, seed)
    audio: dict[float, list[np.ndarray]] = {}
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        for silence in silences:
            rendered = pool.map(synth.render, [dataclasses.replace(u, lead=silence) for u in chosen], chunksize=8)
            if noise != "none":  # a seed per recording, the same for every lead
                rendered = [np.clip(a + synth.colored_noise(noise, len(a), level, seed=n), -1, 1)
                            for n, a in enumerate(rendered)]
            audio[silence] = [np.frombuffer(pcm16(a), "<i2").astype(np.float32) / 32768 for a in rendered]
    return [u.text for u in chosen], audio


def at_client_rate(audio: np.ndarray) -> np.ndarray:
    """`audio` resampled to CLIENT_RATE, as a client sends it (PCM16-exact)."""
    import soxr

    resampled = soxr.resample(audio, SAMPLE_RATE, CLIENT_RATE)
    return np.frombuffer(pcm16(resampled), "<i2").astype(np.float32) / 32768


def heldout_utterances(model_dir: Path, count: int, seed: int | None) -> list[Any]:
    """`count` held-out utterance recipes of the model's synthetic source (its seed unless `seed`)."""
    from export import synth
    from pipeline.modeldir import read_model_directory

    source = read_model_directory(model_dir).manifest.source
    train_seed, train_count = int(source.get("seed", 0)), int(source.get("utterances", 0))
    seen = frozenset(u.text for u in synth.sample_utterances(train_count, train_seed))
    return synth.sample_utterances(count, train_seed if seed is None else seed, heldout=True, exclude=seen)


# ---- doors ---------------------------------------------------------------------------------------------

async def upload_text(port: int, audio: np.ndarray, rate: int = SAMPLE_RATE) -> str:
    """POST /v1/audio/transcriptions (multipart, response_format json) of `audio` at `rate`; the text."""
    boundary = uuid.uuid4().hex
    body = (f'--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper-1\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
            'Content-Type: audio/wav\r\n\r\n').encode() + wav_bytes(audio, rate) + f"\r\n--{boundary}--\r\n".encode()
    head = (f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n"
            f"Content-Type: multipart/form-data; boundary={boundary}\r\nContent-Length: {len(body)}\r\n\r\n")
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head.encode() + body)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), TIMEOUT)
    finally:
        writer.close()
    status_line, _, rest = answer.partition(b"\r\n")
    if b" 200 " not in status_line + b" ":
        raise RuntimeError(f"upload answered {status_line.decode(errors='replace')}: {rest[-300:]!r}")
    return json.loads(answer.partition(b"\r\n\r\n")[2])["text"]


async def stream_text(port: int, audio: np.ndarray) -> str:
    from clients.client import connect

    async with connect(f"ws://127.0.0.1:{port}", sample_rate=SAMPLE_RATE) as stream:
        await stream.send(np.frombuffer(pcm16(audio), "<i2"))
        await stream.stop()
    return " ".join(f.text for f in stream.finals)


class Realtime:
    """One Realtime session at `rate`; `text(audio)` appends a recording (at `rate`) and TURN_GAP s of silence,
    commits them and returns the transcripts of every item it made, joined. Each commit starts the server's
    VAD afresh."""

    def __init__(self, port: int, turn_detection: dict | None, rate: int = SAMPLE_RATE) -> None:
        self.uri = f"ws://127.0.0.1:{port}/v1/realtime?intent=transcription"
        self.turn_detection = turn_detection
        self.rate = rate

    async def __aenter__(self) -> Realtime:
        import websockets

        self.ws = await websockets.connect(self.uri, max_size=None)
        await self.ws.send(json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {
            "input": {"format": {"type": "audio/pcm", "rate": self.rate}, "turn_detection": self.turn_detection}}}}))
        while (await self._next())["type"] != "session.updated":
            pass
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.ws.close()

    async def _next(self) -> dict[str, Any]:
        return json.loads(await asyncio.wait_for(self.ws.recv(), TIMEOUT))

    async def text(self, audio: np.ndarray) -> str:
        data = pcm16(np.concatenate([audio, np.zeros(int(TURN_GAP * self.rate), np.float32)]))
        step = int(APPEND_SECONDS * self.rate) * 2
        for i in range(0, len(data), step):
            await self.ws.send(json.dumps({"type": "input_audio_buffer.append",
                                           "audio": base64.b64encode(data[i:i + step]).decode()}))
        await self.ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        # An unknown event: its error comes after every item the commit made was committed.
        await self.ws.send(json.dumps({"type": "bench.mark", "event_id": "mark"}))
        items: list[str] = []
        texts: dict[str, str] = {}
        marked = False
        while not marked or len(texts) < len(items):
            event = await self._next()
            if event["type"] == "input_audio_buffer.committed":
                items.append(event["item_id"])
            elif event["type"] == f"{TRANSCRIPTION}.completed":
                texts[event["item_id"]] = event["transcript"]
            elif event["type"] == f"{TRANSCRIPTION}.failed":
                raise RuntimeError(f"a Realtime item failed: {event['error']}")
            elif event["type"] == "error":
                if event["error"].get("event_id") == "mark":
                    marked = True
                elif event["error"]["code"] != "input_audio_buffer_commit_empty":  # server VAD took it all
                    raise RuntimeError(f"Realtime error: {event['error']}")
        return " ".join(t for t in (texts[i] for i in items) if t)


async def through_server(port: int, audio: list[np.ndarray]) -> dict[str, list[str]]:
    """The texts of every recording at each server door."""
    out: dict[str, list[str]] = {"upload": [], "upload-24k": [], "stream": []}
    client = [at_client_rate(a) for a in audio]
    for a, a24 in zip(audio, client):
        out["upload"].append(await upload_text(port, a))
        out["upload-24k"].append(await upload_text(port, a24, CLIENT_RATE))
        out["stream"].append(await stream_text(port, a))
    for door, vad, rate, sent in (("realtime-null", None, SAMPLE_RATE, audio),
                                  ("realtime-24k", None, CLIENT_RATE, client),
                                  ("realtime-600", LIVEKIT_VAD, SAMPLE_RATE, audio)):
        async with Realtime(port, vad, rate) as session:
            out[door] = [await session.text(a) for a in sent]
    return out


# ---- the command ---------------------------------------------------------------------------------------

def wer(references: list[str], hypotheses: list[str]) -> dict[str, Any]:
    from export.evaluate import normalize, word_errors

    errors = sum(word_errors(r, h) for r, h in zip(references, hypotheses))
    words = sum(len(normalize(r)) for r in references)
    return {"wer": round(errors / max(1, words), 4), "errors": errors, "words": words}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, default=Path(__file__).resolve().parents[1] / "models" / "demo",
                        help="model directory with a synthetic training source (default: models/demo)")
    parser.add_argument("--utterances", type=int, default=200, help="held-out recordings (default 200)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the held-out set (default: the model's)")
    parser.add_argument("--silences", default=",".join(f"{s:g}" for s in SILENCES),
                        help="seconds of silence before the speech, comma-separated (default 0,0.3,0.5,1,2)")
    parser.add_argument("--noises", default="none",
                        help="none and/or pink, brown, room, comma-separated: the noise under each recording "
                             "(default none: digital silence)")
    parser.add_argument("--noise-level", type=float, default=-50.0, help="the noise's RMS in dBFS (default -50)")
    parser.add_argument("--vad", default="webrtc", help="the server's --vad: webrtc or silero (default webrtc)")
    parser.add_argument("--precision", default="int8", help="for the model and the server (default int8)")
    parser.add_argument("--threads", type=int, default=0, help="ONNX Runtime threads of both (0: its default)")
    parser.add_argument("--workers", type=int, default=2, help="processes rendering the speech (default 2)")
    parser.add_argument("--server-log", type=Path, default=None, help="write the started server's log here")
    parser.add_argument("--save", type=Path, default=None, help="also write the JSON result to this file")


def run(args: argparse.Namespace) -> int:
    from pipeline.engine import Engine, EngineOptions

    from export.synth import ROOM_NOISE_KINDS
    from pipeline.vad import VADS

    silences = tuple(float(s) for s in args.silences.split(","))
    noises = tuple(args.noises.split(","))
    if args.utterances < 1 or any(s < 0 for s in silences):
        raise ValueError("--utterances must be at least 1 and --silences at least 0")
    if not set(noises) <= {"none", *ROOM_NOISE_KINDS} or args.vad not in VADS:
        raise ValueError(f"--noises takes none, {', '.join(ROOM_NOISE_KINDS)}; --vad {' or '.join(VADS)}")
    result: dict[str, Any] = {"command": command_line(), "machine": machine(), "model": str(args.model),
                              "precision": args.precision, "utterances": args.utterances, "vad": args.vad,
                              "noise_level": args.noise_level, "wer": {}}
    engine = Engine(args.model, EngineOptions(device="cpu", precision=args.precision, threads=args.threads)).load()
    server_args = argparse.Namespace(model=args.model, end_silence=0.5, partial_interval=0.0, precision=args.precision,
                                     threads=args.threads, containers=None, server_log=args.server_log,
                                     options=("--vad", args.vad))
    server = ServerProcess(server_args, max_sessions=4)
    try:
        asyncio.run(server.wait_ready(300))
        for noise in noises:
            say(f"rendering {args.utterances} held-out recordings x {len(silences)} leads, noise {noise}")
            texts, audio = recordings(args.model, args.utterances, args.seed, silences, args.workers, noise,
                                      args.noise_level)
            for silence in silences:
                say(f"{noise} {silence:g} s: the model, then the server's doors")
                hypotheses = {"model": [engine.transcribe(a).text for a in audio[silence]]}
                hypotheses |= asyncio.run(through_server(server.port, audio[silence]))
                result["wer"][row_key(noise, silence)] = {door: wer(texts, hypotheses[door]) for door in DOORS}
    finally:
        server.stop()
    report(result)
    emit(result, args.save)
    return 0


def row_key(noise: str, silence: float) -> str:
    """A result row's key: the lead alone in silence (as before noise was measured), else 'noise lead'."""
    return f"{silence:g}" if noise == "none" else f"{noise} {silence:g}"


def report(result: dict[str, Any], doors: tuple[str, ...] = DOORS) -> None:
    vad = f", --vad {result['vad']}" if "vad" in result else ""
    noise = f"; noise at {result['noise_level']:g} dBFS" if "noise_level" in result else ""
    say(f"\nWER by door and what precedes the speech ({result['utterances']} recordings, {result['precision']}{vad}"
        f"{noise}; {result['machine']['cpu']}, {result['machine']['date']})")
    say("| before the speech | " + " | ".join(doors) + " |")
    say("|---" * (len(doors) + 1) + "|")
    for key, row in result["wer"].items():
        noise, _, lead = key.rpartition(" ")
        say(f"| {noise or 'silence'} {lead} s | " + " | ".join(f"{row[d]['wer']:.2%}" for d in doors) + " |")
