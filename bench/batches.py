"""The batch part of `python -m bench model`: what one call costs at every (batch, container) shape of the
grid, the cost table the server plans its batches from (`--cost-table`, pipeline/planner.py).

`bench model` builds its engine as the server does: the ladder (--containers) times --batch-sizes
(default: the device's, pipeline/batching.py). Each shape runs B copies of a speech-like clip filling 3/4 of
its container in one planned call (`transcribe_many(batch=B)`), as the worker's rounds do. Per shape: median
seconds per call and per segment, and what its session took while it was created and warmed: seconds,
resident memory (engine.stats.session_rss) and, on CUDA, device memory (nvidia-smi around each step,
engine.memory_probe). int8 runs one clip per call (its quantisation ranges span the batch), so int8 has only
batch 1. The part's `cost_table` (median seconds per call) is what `--cost-table` reads.
"""
from __future__ import annotations

import argparse
from typing import Any, Callable

from pipeline.audio import SAMPLE_RATE, samples_to_seconds
from pipeline.batching import Clip, parse_batch_sizes
from pipeline.engine import WARMUP_FILL, Engine
from pipeline.engine_options import session_key
from pipeline.planner import cost_table_document
from server.costs import session_figures

from .common import mib, speech_audio


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch-sizes", type=parse_batch_sizes, default=None,
                        help="batch sizes of the grid, timed at every container (default: the device's grid; "
                             "on CPU 1 only: try 1,4,16 for fp32)")


def shape_key(batch: int, size: int) -> str:
    return session_key(batch, samples_to_seconds(size))  # as engine.stats names sessions


def batch_tasks(engine: Engine) -> tuple[list[tuple[str, str, Callable[[], Any]]], dict[str, Any]]:
    """(tasks for the interleaved timing rounds, the part's static figures) for every shape of the grid."""
    stats = engine.stats
    part: dict[str, Any] = {"grid": [shape_key(b, size) for b, size in engine.grid],
                            "in_graph_decoding": engine.in_graph_decoding, "provider": engine.provider,
                            "session_rss_mib": {k: mib(v) for k, v in stats.session_rss.items()},
                            "session_device_mib": {k: mib(v) for k, v in stats.session_device.items()},
                            "session_seconds": {k: round(v, 2) for k, v in stats.session_seconds.items()}}
    tasks = []
    for batch, size in engine.grid:
        clips = [Clip(speech_audio(size / SAMPLE_RATE * WARMUP_FILL))] * batch
        tasks.append(("batches", shape_key(batch, size),
                      lambda e=engine, c=clips, b=batch: e.transcribe_many(c, batch=b)))
    return tasks, part


def finish(part: dict[str, Any], timed: dict[str, dict], engine: Engine, precision: str, device: str,
           model: str) -> dict[str, Any]:
    """Per shape: the call's timing and the median per segment; the cost table of the medians."""
    per_shape, seconds, extra = {}, {}, {}
    for batch, size in engine.grid:
        key = shape_key(batch, size)
        s = timed[key]
        per_shape[key] = {**s, "per_segment": round(s["median"] / batch, 5),
                          "segments_per_second": round(batch / s["median"], 2)}
        seconds[(batch, size)] = s["median"]
        extra[(batch, size)] = session_figures(engine.stats, batch, size, device)
    part["per_shape"] = per_shape
    part["unwarmed_calls"] = engine.stats.unwarmed_calls
    part["cost_table"] = cost_table_document(seconds, precision, device, engine.provider or "", model, extra)
    return part


def print_batches(part: dict[str, Any]) -> None:
    print(f"grid ({'in-graph' if part['in_graph_decoding'] else 'host'} decoding): seconds per call, and what each "
          f"session took to create and warm")
    print(f"{'shape':>8} {'call s':>8} {'per seg s':>10} {'seg/s':>8} {'build s':>8} {'RSS MiB':>8} {'GPU MiB':>8}")
    for key, s in part["per_shape"].items():
        print(f"{key:>8} {s['median']:8.4f} {s['per_segment']:10.5f} {s['segments_per_second']:8.1f} "
              f"{part['session_seconds'].get(key, '-')!s:>8} {part['session_rss_mib'].get(key, '-')!s:>8} "
              f"{part['session_device_mib'].get(key, '-')!s:>8}")
