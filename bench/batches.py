"""The batch part of `python -m bench model`: what one segment costs when B segments share a run.

An Engine with one container (the ladder's largest, 30 s by default) and the batch sizes of
--batch-sizes (default: the device's grid, pipeline/batching.py) runs B copies of a speech-like clip
filling 3/4 of the container in one engine call, as the server's worker does under load. Per batch
size: median seconds per call and per segment, and the resident memory each (batch, container)
session added while it was created and warmed (engine.stats.session_rss; on a GPU that figure is host
memory only: device memory per session is not measured here). int8 runs one clip per call (its
quantisation ranges span the batch), so int8 has only batch 1.
"""
from __future__ import annotations

import argparse
from typing import Any, Callable

from pipeline.batching import Clip, choose_batch_sizes, parse_batch_sizes
from pipeline.engine import WARMUP_FILL, Engine, EngineOptions

from .common import mib, speech_audio


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch-sizes", type=parse_batch_sizes, default=None,
                        help="batch sizes to time at the largest container (default: the device's grid; "
                             "on CPU 1 only: try 1,4,16 for fp32)")


def batch_tasks(args: argparse.Namespace, precision: str, container: float) -> tuple[list, dict[str, Any], Engine]:
    """(tasks for the interleaved timing rounds, the part's static figures, the engine kept alive)."""
    sizes = choose_batch_sizes(args.batch_sizes, args.device, precision)
    engine = Engine(args.model, EngineOptions(device=args.device, precision=precision, containers=(container,),
                                              batch_sizes=sizes, threads=args.threads)).load()
    audio = speech_audio(container * WARMUP_FILL)
    part: dict[str, Any] = {"container": container, "batch_sizes": list(engine.batch_sizes),
                            "in_graph_decoding": engine.in_graph_decoding,
                            "session_rss_mib": {k: mib(v) for k, v in engine.stats.session_rss.items()}}
    tasks: list[tuple[str, str, Callable[[], Any]]] = []
    for batch in engine.batch_sizes:
        clips = [Clip(audio)] * batch
        tasks.append(("batches", str(batch), lambda e=engine, c=clips: e.transcribe_many(c)))
    return tasks, part, engine


def finish(part: dict[str, Any], timed: dict[str, dict], engine: Engine) -> dict[str, Any]:
    """Per batch size: the call's timing and the median per segment."""
    part["per_batch"] = {b: {**s, "per_segment": round(s["median"] / int(b), 4),
                             "segments_per_second": round(int(b) / s["median"], 2)} for b, s in timed.items()}
    part["unwarmed_calls"] = engine.stats.unwarmed_calls
    return part


def print_batches(part: dict[str, Any]) -> None:
    print(f"batches at {part['container']:g} s ({'in-graph' if part['in_graph_decoding'] else 'host'} decoding):")
    print(f"{'batch':>6} {'call s':>8} {'per seg s':>10} {'seg/s':>7} {'session RSS MiB':>16}")
    for b, s in part["per_batch"].items():
        rss = part["session_rss_mib"].get(f"{b}x{part['container']:g}s")
        print(f"{b:>6} {s['median']:8.3f} {s['per_segment']:10.4f} {s['segments_per_second']:7.2f} {rss!s:>16}")


