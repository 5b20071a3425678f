"""`python -m bench vad`: where the segmenter starts segments in room noise, per frame VAD (issue 36).

No server and no model: the held-out recordings (bench/silence.py's, rendered without the recipe's own
noise) with `--lead` seconds before the speech and 0.5 s after it, under pink, brown or room noise
(export.synth.ROOM_NOISE_KINDS) at each `--levels` dBFS or under digital silence ("none"), at 16 kHz or
after a 16 -> 24 -> 16 kHz round trip (a Realtime client's rate, PCM16 on the wire), through
pipeline.segmenter.Segmenter with each VAD (webrtc modes, Silero). Per condition:

    early      how far before the speech the first segment that reaches it starts, in seconds (min, median,
               90th percentile, max; negative: after the speech began; the model hears the server's
               pre-roll, 0.3 s, before that start)
    noise      segments that hold no speech (before or after it): each reaches the model as noise
    missed     recordings whose speech no segment reaches
    alone      segments in 30 s of the noise alone

The speech's bounds are the clean rendering's (samples above 0.2 % of its peak).
"""
from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.audio import SAMPLE_RATE

from .common import command_line, emit, machine, say

LEVELS = (-60.0, -50.0, -40.0)
NOISES = ("none", "pink", "brown", "room")
RATES = (16000, 24000)
VADS = ("webrtc:0", "webrtc:1", "webrtc:2", "webrtc:3", "silero:0.5")
TAIL = 0.5  # seconds after the speech
ALONE_SECONDS = 30.0
SPEECH_THRESHOLD = 0.002  # of the peak: where the clean speech starts and ends


def vad_options(spec: str) -> Any:
    """'webrtc:MODE' or 'silero:THRESHOLD' -> SegmenterOptions (no partials)."""
    from pipeline.segmenter_options import SegmenterOptions, validate_options

    kind, _, value = spec.partition(":")
    options = SegmenterOptions(partial_interval=0.0, vad=kind)
    if kind == "webrtc":
        options = dataclasses.replace(options, vad_aggressiveness=int(value or 3))
    elif kind == "silero" and value:
        options = dataclasses.replace(options, vad_threshold=float(value))
    validate_options(options)
    return options


def render_clean(u: Any) -> np.ndarray:
    from export import synth

    return synth.render(dataclasses.replace(u, snr_db=None))


def recordings(model_dir: Path, count: int, lead: float, workers: int) -> list[tuple[np.ndarray, float, float]]:
    """(audio, speech start, speech end) of each held-out recording, `lead` s before its speech."""
    from .silence import heldout_utterances

    chosen = [dataclasses.replace(u, lead=0.0, trail=0.0) for u in heldout_utterances(model_dir, count, None)]
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        rendered = pool.map(render_clean, chosen, chunksize=8)
    out = []
    for audio in rendered:
        loud = np.flatnonzero(np.abs(audio) > SPEECH_THRESHOLD * np.abs(audio).max())
        speech = audio[loud[0]: loud[-1] + 1]
        padded = np.concatenate([np.zeros(int(lead * SAMPLE_RATE), np.float32), speech,
                                 np.zeros(int(TAIL * SAMPLE_RATE), np.float32)])
        out.append((padded, lead, lead + len(speech) / SAMPLE_RATE))
    return out


def noisy(audio: np.ndarray, noise: str, level: float, seed: int) -> np.ndarray:
    from export.synth import colored_noise

    if noise == "none":
        return audio
    return np.clip(audio + colored_noise(noise, len(audio), level, seed), -1.0, 1.0).astype(np.float32)


def segments(audio: np.ndarray, options: Any) -> list[tuple[float, float]]:
    from pipeline.trim import segments_in

    return [(s.start, s.end) for s in segments_in(audio, options)]


def measure(options: Any, records: list[tuple[np.ndarray, float, float]], noise: str, level: float,
            rate: int) -> dict[str, Any]:
    from export.synth import round_trip

    early, noise_segments, missed = [], 0, 0
    for i, (clean, start, end) in enumerate(records):
        found = segments(round_trip(noisy(clean, noise, level, seed=i), rate), options)
        speech = [s for s in found if s[0] < end and s[1] > start]
        noise_segments += len(found) - len(speech)
        if speech:
            early.append(start - speech[0][0])
        else:
            missed += 1
    alone = 0
    if noise != "none":
        alone = len(segments(round_trip(noisy(np.zeros(int(ALONE_SECONDS * SAMPLE_RATE), np.float32), noise, level,
                                              seed=10_000), rate), options))
    stats = [round(float(v), 3) for v in np.percentile(early, [0, 50, 90, 100])] if early else [None] * 4
    return {"early_min": stats[0], "early_p50": stats[1], "early_p90": stats[2], "early_max": stats[3],
            "noise_segments": noise_segments,
            "missed": missed, "alone": alone}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, default=Path(__file__).resolve().parents[1] / "models" / "demo",
                        help="model directory whose held-out set is used (default: models/demo)")
    parser.add_argument("--utterances", type=int, default=60, help="held-out recordings (default 60)")
    parser.add_argument("--lead", type=float, default=1.0, help="seconds of noise before the speech (default 1)")
    parser.add_argument("--levels", default=",".join(f"{v:g}" for v in LEVELS), help="noise dBFS, comma-separated")
    parser.add_argument("--noises", default=",".join(NOISES), help="none (digital silence), pink, brown, room")
    parser.add_argument("--rates", default=",".join(map(str, RATES)), help="client rates (24000: a round trip)")
    parser.add_argument("--vads", default=",".join(VADS), help="webrtc:MODE or silero:THRESHOLD, comma-separated")
    parser.add_argument("--workers", type=int, default=2, help="processes rendering the speech (default 2)")
    parser.add_argument("--save", type=Path, default=None, help="also write the JSON result to this file")


def run(args: argparse.Namespace) -> int:
    levels = tuple(float(v) for v in args.levels.split(","))
    noises, rates = tuple(args.noises.split(",")), tuple(int(r) for r in args.rates.split(","))
    if args.utterances < 1 or args.lead < 0 or not set(noises) <= set(NOISES):
        raise ValueError(f"--utterances must be at least 1, --lead at least 0, --noises of {', '.join(NOISES)}")
    vads = {spec: vad_options(spec) for spec in args.vads.split(",")}
    result: dict[str, Any] = {"command": command_line(), "machine": machine(), "utterances": args.utterances,
                              "lead": args.lead, "rows": []}
    say(f"rendering {args.utterances} held-out recordings")
    records = recordings(args.model, args.utterances, args.lead, args.workers)
    conditions = [(n, lv, r) for r in rates for n in noises for lv in (levels if n != "none" else (None,))]
    for spec, options in vads.items():
        for noise, level, rate in conditions:
            row = {"vad": spec, "noise": noise, "level": level, "rate": rate}
            row |= measure(options, records, noise, level or 0.0, rate)
            result["rows"].append(row)
            say(f"  {spec} {noise} {level} dBFS {rate} Hz: {row}")
    report(result)
    emit(result, args.save)
    return 0


def report(result: dict[str, Any]) -> None:
    say(f"\nSegment starts in noise ({result['utterances']} recordings, {result['lead']:g} s before the speech; "
        f"{result['machine']['cpu']}, {result['machine']['date']})")
    say("| vad | noise | dBFS | rate | early min / p50 / p90 / max (s) | noise segments | missed | in 30 s of noise alone |")
    say("|---|---|---|---|---|---|---|---|")
    for r in result["rows"]:
        level = "-" if r["level"] is None else f"{r['level']:g}"
        say(f"| {r['vad']} | {r['noise']} | {level} | {r['rate'] // 1000} kHz | {r['early_min']} / {r['early_p50']} / "
            f"{r['early_p90']} / "
            f"{r['early_max']} | {r['noise_segments']} | {r['missed']} | {r['alone']} |")
