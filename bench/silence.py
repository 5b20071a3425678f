"""`python -m bench silence`: word error rate per door and per second of silence before the speech (issue 25).

The recordings are the demo model's held-out set (export/evaluate.py: espeak-ng voices never used in
training saying word sequences absent from its training texts), rendered once per amount of leading
silence (the recipe's own lead replaced by it; its noise, when it has some, covers the silence too).
Each recording goes through every door of one server we start, and through the model alone:

    model         pipeline.engine.Engine on the whole recording, no VAD: what the model itself makes of silence
    upload        POST /v1/audio/transcriptions (the segmenter's segments)
    stream        our own /v1/stream, sent at once, then stop
    realtime-null OpenAI Realtime, turn_detection null: the recording appended, then committed by hand
    realtime-600  OpenAI Realtime, server VAD with LiveKit's prefix_padding_ms 600, then a commit

The issue's bar: realtime-null and realtime-600 within 1 WER point of upload on the same recordings, and
each door's WER with silence within 1 point of its WER without.
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
DOORS = ("model", "upload", "stream", "realtime-null", "realtime-600")
LIVEKIT_VAD = {"type": "server_vad", "prefix_padding_ms": 600, "silence_duration_ms": 500, "threshold": 0.5}
TRANSCRIPTION = "conversation.item.input_audio_transcription"
APPEND_SECONDS = 5.0  # audio per Realtime append event (160 KB of PCM16: well under the 1 MiB message cap)
TIMEOUT = 120.0


def pcm16(audio: np.ndarray) -> bytes:
    return np.clip(np.round(audio * 32768), -32768, 32767).astype("<i2").tobytes()


def wav_bytes(audio: np.ndarray, rate: int = SAMPLE_RATE) -> bytes:
    import io

    import soundfile

    out = io.BytesIO()
    soundfile.write(out, np.frombuffer(pcm16(audio), "<i2"), rate, subtype="PCM_16", format="WAV")
    return out.getvalue()


# ---- recordings ----------------------------------------------------------------------------------------

def recordings(model_dir: Path, count: int, seed: int | None, silences: tuple[float, ...],
               workers: int) -> tuple[list[str], dict[float, list[np.ndarray]]]:
    """The held-out texts and, per leading silence, their audio (PCM16-exact float32 at SAMPLE_RATE)."""
    from export import synth
    from pipeline.modeldir import read_model_directory

    source = read_model_directory(model_dir).manifest.source
    train_seed, train_count = int(source.get("seed", 0)), int(source.get("utterances", 0))
    seen = frozenset(u.text for u in synth.sample_utterances(train_count, train_seed))
    chosen = synth.sample_utterances(count, train_seed if seed is None else seed, heldout=True, exclude=seen)
    audio: dict[float, list[np.ndarray]] = {}
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        for silence in silences:
            rendered = pool.map(synth.render, [dataclasses.replace(u, lead=silence) for u in chosen], chunksize=8)
            audio[silence] = [np.frombuffer(pcm16(a), "<i2").astype(np.float32) / 32768 for a in rendered]
    return [u.text for u in chosen], audio


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
    """One Realtime session at 16 kHz; `text(audio)` appends a recording, commits it and returns the
    transcripts of every item it made, joined. Each commit starts the server's VAD afresh."""

    def __init__(self, port: int, turn_detection: dict | None) -> None:
        self.uri = f"ws://127.0.0.1:{port}/v1/realtime?intent=transcription"
        self.turn_detection = turn_detection

    async def __aenter__(self) -> Realtime:
        import websockets

        self.ws = await websockets.connect(self.uri, max_size=None)
        await self.ws.send(json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {
            "input": {"format": {"type": "audio/pcm", "rate": SAMPLE_RATE}, "turn_detection": self.turn_detection}}}}))
        while (await self._next())["type"] != "session.updated":
            pass
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.ws.close()

    async def _next(self) -> dict[str, Any]:
        return json.loads(await asyncio.wait_for(self.ws.recv(), TIMEOUT))

    async def text(self, audio: np.ndarray) -> str:
        data = pcm16(audio)
        step = int(APPEND_SECONDS * SAMPLE_RATE) * 2
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
    out: dict[str, list[str]] = {"upload": [], "stream": []}
    for a in audio:
        out["upload"].append(await upload_text(port, a))
        out["stream"].append(await stream_text(port, a))
    for door, vad in (("realtime-null", None), ("realtime-600", LIVEKIT_VAD)):
        async with Realtime(port, vad) as session:
            out[door] = [await session.text(a) for a in audio]
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
    parser.add_argument("--precision", default="int8", help="for the model and the server (default int8)")
    parser.add_argument("--threads", type=int, default=0, help="ONNX Runtime threads of both (0: its default)")
    parser.add_argument("--workers", type=int, default=2, help="processes rendering the speech (default 2)")
    parser.add_argument("--server-log", type=Path, default=None, help="write the started server's log here")
    parser.add_argument("--save", type=Path, default=None, help="also write the JSON result to this file")


def run(args: argparse.Namespace) -> int:
    from pipeline.engine import Engine, EngineOptions

    silences = tuple(float(s) for s in args.silences.split(","))
    if args.utterances < 1 or any(s < 0 for s in silences):
        raise ValueError("--utterances must be at least 1 and --silences at least 0")
    result: dict[str, Any] = {"command": command_line(), "machine": machine(), "model": str(args.model),
                              "precision": args.precision, "utterances": args.utterances, "wer": {}}
    say(f"rendering {args.utterances} held-out recordings x {len(silences)} silences")
    texts, audio = recordings(args.model, args.utterances, args.seed, silences, args.workers)
    engine = Engine(args.model, EngineOptions(device="cpu", precision=args.precision, threads=args.threads)).load()
    server_args = argparse.Namespace(model=args.model, end_silence=0.5, partial_interval=0.0, precision=args.precision,
                                     threads=args.threads, containers=None, server_log=args.server_log)
    server = ServerProcess(server_args, max_sessions=4)
    try:
        asyncio.run(server.wait_ready(300))
        for silence in silences:
            say(f"silence {silence:g} s: the model, then the server's doors")
            hypotheses = {"model": [engine.transcribe(a).text for a in audio[silence]]}
            hypotheses |= asyncio.run(through_server(server.port, audio[silence]))
            result["wer"][f"{silence:g}"] = {door: wer(texts, hypotheses[door]) for door in DOORS}
    finally:
        server.stop()
    report(result, silences)
    emit(result, args.save)
    return 0


def report(result: dict[str, Any], silences: tuple[float, ...], doors: tuple[str, ...] = DOORS) -> None:
    say(f"\nWER by door and leading silence ({result['utterances']} recordings, {result['precision']}; "
        f"{result['machine']['cpu']}, {result['machine']['date']})")
    say("| silence | " + " | ".join(doors) + " |")
    say("|---" * (len(doors) + 1) + "|")
    for silence in silences:
        row = result["wer"][f"{silence:g}"]
        say(f"| {silence:g} s | " + " | ".join(f"{row[d]['wer']:.2%}" for d in doors) + " |")
