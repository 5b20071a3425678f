"""Write espeak-ng speech clips of given lengths: the real-ish audio on which precisions are compared.

    python -m bench.speech_clips --out /tmp/clips [--lengths 1,2,3.5,5,8,12,20,29] [--seed S]

Each clip is sentences of the demo vocabulary (export/synth.py: random_text, a few voices), spoken by
espeak-ng with short pauses between them, resampled to 16 kHz and cut to its length; seeded, so the same
arguments give the same files. `python -m export verify DIR --agreement-audio /tmp/clips/*.wav` then
compares every precision with fp32 on them (issue 40: int8's token counts against fp32's).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

DEFAULT_LENGTHS = (1.0, 2.0, 3.5, 5.0, 8.0, 12.0, 20.0, 29.0)
DEFAULT_SEED = 40
VOICES = ("en-us", "en", "en-gb-x-rp", "en-029")
PAUSE_SECONDS = 0.3


def speech(seconds: float, rng: np.random.Generator) -> np.ndarray:
    """Sentences until `seconds` are filled, cut to exactly that many samples (float32, 16 kHz)."""
    import soxr

    from export.synth import ESPEAK_RATE, espeak, random_text
    from pipeline.audio import SAMPLE_RATE

    target, pieces, total = int(seconds * SAMPLE_RATE), [], 0
    while total < target:
        voice = VOICES[int(rng.integers(len(VOICES)))]
        audio = soxr.resample(espeak(random_text(rng), voice, int(rng.integers(150, 200))), ESPEAK_RATE, SAMPLE_RATE)
        pieces += [audio, np.zeros(int(PAUSE_SECONDS * SAMPLE_RATE), np.float32)]
        total += len(pieces[-2]) + len(pieces[-1])
    return np.concatenate(pieces)[:target].astype(np.float32)


def main(argv: list[str] | None = None) -> int:
    import soundfile

    from pipeline.audio import SAMPLE_RATE

    parser = argparse.ArgumentParser(prog="bench.speech_clips", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="directory for the WAV files")
    parser.add_argument("--lengths", default=",".join(f"{s:g}" for s in DEFAULT_LENGTHS), help="seconds per clip")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    written = []
    for seconds in (float(s) for s in args.lengths.split(",")):
        path = args.out / f"speech_{seconds:g}s.wav"
        soundfile.write(path, speech(seconds, rng), SAMPLE_RATE, subtype="PCM_16")
        written.append(str(path))
    print(json.dumps({"clips": written, "seed": args.seed}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
