"""`python -m bench streamcost`: what one stream costs the server's event loop in the sans-I/O pipeline, per
second of audio, without a model or a network.

Each stream is one of `bench load`'s meetings (its utterances, pauses and quiet room), sent as `--chunk`
second messages at the client's `--rates` through pipeline.stream.StreamSession.feed (decode, resample,
VAD, segmenter), and every partial and final through pipeline.trim.prepared, as server/streaming.py does
for each message. CPU seconds (process time, one thread) over `--streams` streams, per stream-second of
audio, for each stage, and what 512 streams would take of one core. The loop's other costs (websockets'
framing, the send loop) are not in it: `py-spy record --threads` on a server under `bench load` shows those
(docs/benchmarks.md, "CPU streams").
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.audio import SAMPLE_RATE, AudioFormat
from pipeline.segmenter import PartialDue, SegmentFinished, SegmenterOptions
from pipeline.stream import StreamSession
from pipeline.trim import prepared

from .common import command_line, emit, machine, say
from .load import load_utterances, meeting

AT_STREAMS = 512  # issue 34's aim for one GPU server


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--streams", type=int, default=40, help="streams run one after another")
    parser.add_argument("--seconds", type=float, default=30.0, help="audio per stream")
    parser.add_argument("--chunk", type=float, default=0.1, help="seconds of audio per message")
    parser.add_argument("--rates", default="16000,24000", help="client sample rates, comma-separated")
    parser.add_argument("--save", type=Path, default=None, help="also write the JSON result here")


def pcm_at(audio: np.ndarray, rate: int) -> bytes:
    """The meeting as s16le at `rate` (linear interpolation: the cost, not the sound, is measured)."""
    if rate != SAMPLE_RATE:
        n = int(len(audio) * rate / SAMPLE_RATE)
        audio = np.interp(np.arange(n) * SAMPLE_RATE / rate, np.arange(len(audio)), audio).astype(np.float32)
    return (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()


def cost(rate: int, args: argparse.Namespace) -> dict[str, Any]:
    options, utterances = SegmenterOptions(), load_utterances()
    step = int(round(args.chunk * rate)) * 2
    feed = prepare = 0.0
    seconds, jobs = 0.0, 0
    for seed in range(args.streams):
        pcm = pcm_at(meeting(seed, args.seconds, utterances).audio, rate)
        session = StreamSession(AudioFormat(sample_rate=rate), options)
        for begin in range(0, len(pcm), step):
            t0 = time.process_time()
            events = session.feed(pcm[begin:begin + step])
            t1 = time.process_time()
            for event in events:
                if isinstance(event, (PartialDue, SegmentFinished)):
                    prepared(event, options)
                    jobs += 1
            feed, prepare = feed + t1 - t0, prepare + time.process_time() - t1
        seconds += len(pcm) / 2 / rate
    per = {"feed": feed / seconds * 1e3, "prepared": prepare / seconds * 1e3}
    per["total"] = per["feed"] + per["prepared"]
    return {"rate": rate, "stream_seconds": round(seconds, 1), "jobs": jobs,
            "ms_per_stream_second": {k: round(v, 4) for k, v in per.items()},
            f"core_share_at_{AT_STREAMS}": round(per["total"] * AT_STREAMS / 1e3, 3)}


def run(args: argparse.Namespace) -> int:
    if args.streams < 1 or args.seconds <= 0 or not 0 < args.chunk <= 1:
        raise ValueError("--streams must be at least 1, --seconds above 0 and --chunk in (0, 1] s")
    result: dict[str, Any] = {"command": "streamcost", "argv": command_line(), "machine": machine(),
                              "streams": args.streams, "seconds": args.seconds, "chunk": args.chunk, "rates": []}
    say(f"{'rate':>6} {'feed ms/s':>10} {'prepared':>9} {'total':>7} {f'core at {AT_STREAMS}':>12}")
    for rate in (int(r) for r in args.rates.split(",")):
        row = cost(rate, args)
        result["rates"].append(row)
        ms = row["ms_per_stream_second"]
        say(f"{rate:>6} {ms['feed']:>10.3f} {ms['prepared']:>9.3f} {ms['total']:>7.3f} "
            f"{row[f'core_share_at_{AT_STREAMS}'] * 100:>11.0f}%")
    emit(result, args.save)
    return 0
