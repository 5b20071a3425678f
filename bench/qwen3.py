"""`python -m bench qwen3 DIR`: CPU figures of a Qwen3-ASR model directory at its serving shapes.

The engine's own sessions (pipeline/families/qwen3_asr/runtime.py: the CPU's ladder of containers, or --containers;
prefill and step sharing one copy of the decoder's weights unless --no-share-weights), as served: the clip
runs in the smallest container that holds it. Printed (one JSON object): encoder seconds per container,
prefill seconds, milliseconds per decoded token, the whole utterance (encoder + prefill + tokens) for a
clip of --seconds, and the peak RSS of this process. Each stage is timed around its own session calls
(best run of --repeat), never as a difference of two whole runs, which noise can make negative. Random
weights never stop early, so the utterance decodes exactly --tokens tokens. Also printed: the largest
logit difference and whether the tokens agree with the same clip decoded in the largest container over
its whole prompt and cache.
"""
from __future__ import annotations

import argparse
import json
import resource
import time
from dataclasses import replace

from pipeline.modeldir import read_model_directory
from pipeline.providers import provider_config
from pipeline.families.qwen3_asr.decoding import ENCODER, PREFILL, STEP, Qwen3Decoder
from pipeline.families.qwen3_asr.runtime import CPU_CACHE_STEP, CPU_PROMPT_STEP, create_qwen3_sessions, qwen3_ladder
from pipeline.shapes import parse_containers

from export.onnx_export import deterministic_waveform
from export.sensevoice import user_path


class TimedSession:
    """An InferenceSession that adds up the time and count of its run() calls."""

    def __init__(self, session) -> None:
        self.session = session
        self.reset()

    def reset(self) -> None:
        self.seconds, self.calls = 0.0, 0

    def run(self, outputs, feed):
        start = time.perf_counter()
        try:
            return self.session.run(outputs, feed)
        finally:
            self.seconds += time.perf_counter() - start
            self.calls += 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_dir", type=user_path, help="a directory written by `python -m export qwen3-asr`")
    parser.add_argument("--precision", default="int8", help="fp32 or int8 (default int8)")
    parser.add_argument("--seconds", type=float, default=10.0, help="utterance length (default 10)")
    parser.add_argument("--tokens", type=int, default=24, help="tokens to decode (default 24)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure; the best is kept (default 3)")
    parser.add_argument("--containers", type=parse_containers, default=None,
                        help="container lengths in seconds, rounded up to whole attention windows (default: "
                             "every whole number of windows up to the export's, as the server on the CPU)")
    parser.add_argument("--share-weights", action=argparse.BooleanOptionalAction, default=True,
                        help="prefill and step share the decoder's weights, as the server's default (default on)")
    parser.add_argument("--cache-step", type=int, default=CPU_CACHE_STEP,
                        help=f"the step's cache grows in this many slots; 0: the whole cache from the first step "
                             f"(default {CPU_CACHE_STEP}, as the server on the CPU)")
    parser.add_argument("--prompt-step", type=int, default=CPU_PROMPT_STEP,
                        help=f"prefill runs over the prompt rounded up to this many slots; 0: the container's "
                             f"whole prompt (default {CPU_PROMPT_STEP}, as the server on the CPU)")


def run(args: argparse.Namespace) -> int:
    directory = read_model_directory(args.model_dir)
    dims = directory.manifest.dimensions
    ladder = [replace(shapes, cache_step=args.cache_step, prompt_step=args.prompt_step)
              for shapes in qwen3_ladder(dims, "cpu", args.containers)]
    if (not 0 < args.seconds * 16000 <= ladder[-1].container_samples or args.tokens < 2
            or min(args.cache_step, args.prompt_step) < 0):
        raise ValueError(f"--seconds must fit the {ladder[-1].container_samples / 16000:g} s container, "
                         "--tokens be >= 2 and --cache-step and --prompt-step >= 0")
    shapes = next(s for s in ladder if s.container_samples >= args.seconds * 16000)
    runners = create_qwen3_sessions(directory, args.precision, provider_config("cpu"), 0, 0, ladder,
                                    args.share_weights)
    decoder = Qwen3Decoder({}, dims["prompt"], shapes)
    audio = deterministic_waveform(args.seconds, seed=3)

    decoder.sessions = {graph: TimedSession(runners[(graph, shapes.container_samples)].session)
                        for graph in (ENCODER, PREFILL, STEP)}  # `runners` keeps the shared weights alive
    runs = []
    for _ in range(args.repeat):
        for timed in decoder.sessions.values():
            timed.reset()
        start = time.perf_counter()
        result = decoder.decode(audio, args.tokens)
        whole = time.perf_counter() - start
        steps = decoder.sessions[STEP]
        runs.append((whole, decoder.sessions[ENCODER].seconds, decoder.sessions[PREFILL].seconds,
                     1000 * steps.seconds / max(steps.calls, 1)))
    whole, encoder, prefill, ms_per_token = (min(figure) for figure in zip(*runs))
    # The same clip in the largest container, whole prompt and cache, the same sessions: what the ladder and
    # the clip-sized prompt and cache must not change.
    largest = Qwen3Decoder({g: runners[(g, ladder[-1].container_samples)].session for g in (ENCODER, PREFILL, STEP)},
                           dims["prompt"], replace(ladder[-1], cache_step=0, prompt_step=0)).decode(audio, args.tokens)
    logits = [(result.first_logits, largest.first_logits), *zip(result.step_logits, largest.step_logits)]
    figures = {
        "precision": args.precision, "share_weights": args.share_weights,
        "container_seconds": shapes.container_samples / 16000, "prompt_slots": shapes.prompt_slots,
        "cache_slots": shapes.cache_slots, "cache_step": shapes.cache_step, "prompt_step": shapes.prompt_step,
        "encoder_s": encoder, "prefill_s": prefill, "ms_per_token": ms_per_token,
        f"whole_{args.seconds:g}s_utterance_s": whole, "tokens": len(result.tokens),
        "largest_container_max_abs_diff": max(float(abs(a - b).max()) for a, b in logits),
        "largest_container_tokens_equal": result.tokens == largest.tokens,
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }
    print(json.dumps(figures))
    return 0
