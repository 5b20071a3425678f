"""`python -m bench qwen3 DIR`: CPU figures of a Qwen3-ASR model directory at its serving shapes.

Sessions fixed at the manifest's shapes, as served. Printed (one JSON object): encoder seconds per container,
prefill seconds, milliseconds per decoded token, the whole utterance (encoder + prefill + tokens) for a
clip of --seconds, and the peak RSS of this process. Random weights never stop early, so the utterance
decodes exactly --tokens tokens.
"""
from __future__ import annotations

import argparse
import json
import resource
import time

import numpy as np

from pipeline.modeldir import read_model_directory
from pipeline.qwen3_decoding import ENCODER, Qwen3Decoder, Qwen3Shapes, audio_slots

from export.onnx_export import deterministic_waveform
from export.sensevoice import user_path
from export.verify_qwen3 import sessions


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_dir", type=user_path, help="a directory written by `python -m export qwen3-asr`")
    parser.add_argument("--precision", default="int8", help="fp32 or int8 (default int8)")
    parser.add_argument("--seconds", type=float, default=10.0, help="utterance length (default 10)")
    parser.add_argument("--tokens", type=int, default=24, help="tokens to decode (default 24)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure; the best is kept (default 3)")


def run(args: argparse.Namespace) -> int:
    directory = read_model_directory(args.model_dir)
    dims = directory.manifest.dimensions
    shapes = Qwen3Shapes.from_dimensions(dims)
    made, _ = sessions(directory, args.precision, "cpu", shapes.container_samples, shapes.prompt_slots,
                       audio_slots(dims, shapes), shapes.cache_slots)
    decoder = Qwen3Decoder(made, dims["prompt"], shapes)
    if not 0 < args.seconds * 16000 <= shapes.container_samples or args.tokens < 2:
        raise ValueError(f"--seconds must fit the {shapes.container_samples / 16000:g} s container and --tokens be >= 2")
    audio = deterministic_waveform(args.seconds, seed=3)
    container = np.zeros((1, shapes.container_samples), np.float32)
    container[0, : len(audio)] = audio
    feed = {"audio": container, "audio_lengths": np.array([len(audio)], np.int32)}

    def best(fn) -> float:
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    encoder = best(lambda: made[ENCODER].run(None, feed))
    first = best(lambda: decoder.decode(audio, 1))
    whole = best(lambda: decoder.decode(audio, args.tokens))
    figures = {
        "precision": args.precision, "container_seconds": shapes.container_samples / 16000,
        "prompt_slots": shapes.prompt_slots, "cache_slots": shapes.cache_slots,
        "encoder_s": encoder, "prefill_s": first - encoder, "ms_per_token": 1000 * (whole - first) / (args.tokens - 1),
        f"whole_{args.seconds:g}s_utterance_s": whole, "tokens": len(decoder.decode(audio, args.tokens).tokens),
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }
    print(json.dumps(figures))
    return 0
