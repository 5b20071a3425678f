"""The batch part of `python -m bench model`: what one segment costs when B segments share a run.

An Engine with one container (the ladder's largest, 30 s by default) and the batch sizes of
--batch-sizes (default: the device's grid, pipeline/batching.py) runs B copies of a speech-like clip
filling 3/4 of the container in one engine call, as the server's worker does under load. Per batch
size: median seconds per call and per segment, and the resident memory each (batch, container)
session added while it was created and warmed (engine.stats.session_rss, host memory). On CUDA each
batch size gets an Engine of its own, so that the GPU memory its session took (created and warmed: the
weights and ONNX Runtime's arena, as nvidia-smi reports it) is read off alone. int8 runs one clip per
call (its quantisation ranges span the batch), so int8 has only batch 1.
"""
from __future__ import annotations

import argparse
from typing import Any, Callable

from pipeline.batching import Clip, choose_batch_sizes, parse_batch_sizes
from pipeline.engine import WARMUP_FILL, Engine, EngineOptions

from .common import device_memory_used, mib, speech_audio


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch-sizes", type=parse_batch_sizes, default=None,
                        help="batch sizes to time at the largest container (default: the device's grid; "
                             "on CPU 1 only: try 1,4,16 for fp32)")


def batch_tasks(args: argparse.Namespace, precision: str, container: float) -> tuple[list, dict[str, Any], list]:
    """(tasks for the interleaved timing rounds, the part's static figures, the engines kept alive)."""
    sizes = choose_batch_sizes(args.batch_sizes, args.device, precision)
    per_size = args.device == "cuda"  # one engine per batch size, for each session's device memory
    # Every grid holds batch 1 (a lone clip), so batch b's session is (1, b)'s engine less (1,)'s.
    groups = [(1,)] + [(1, b) for b in sizes if b > 1] if per_size else [sizes]
    engines, device_mib, lone = [], {}, 0
    for group in groups:
        before = device_memory_used() if per_size else None
        engine = Engine(args.model, EngineOptions(device=args.device, precision=precision, containers=(container,),
                                                  batch_sizes=group, threads=args.threads)).load()
        after = device_memory_used() if per_size else None
        if before is not None and after is not None:
            used = after - before
            if group == (1,):
                lone = used
            else:
                used -= lone
            device_mib[f"{group[-1]}x{container:g}s"] = mib(used)
        engines.append(engine)
    audio = speech_audio(container * WARMUP_FILL)
    part: dict[str, Any] = {"container": container, "batch_sizes": sorted({b for e in engines for b in e.batch_sizes}),
                            "in_graph_decoding": engines[0].in_graph_decoding, "provider": engines[0].provider,
                            "session_rss_mib": {k: mib(v) for e in engines for k, v in e.stats.session_rss.items()},
                            "session_device_mib": device_mib}
    tasks: list[tuple[str, str, Callable[[], Any]]] = []
    for engine in engines:
        for batch in engine.batch_sizes[-1:] if per_size else engine.batch_sizes:
            clips = [Clip(audio)] * batch
            tasks.append(("batches", str(batch), lambda e=engine, c=clips: e.transcribe_many(c)))
    return tasks, part, engines


def finish(part: dict[str, Any], timed: dict[str, dict], engines: list[Engine]) -> dict[str, Any]:
    """Per batch size: the call's timing and the median per segment."""
    part["per_batch"] = {b: {**s, "per_segment": round(s["median"] / int(b), 4),
                             "segments_per_second": round(int(b) / s["median"], 2)} for b, s in timed.items()}
    part["unwarmed_calls"] = sum(e.stats.unwarmed_calls for e in engines)
    return part


def print_batches(part: dict[str, Any]) -> None:
    print(f"batches at {part['container']:g} s ({'in-graph' if part['in_graph_decoding'] else 'host'} decoding):")
    print(f"{'batch':>6} {'call s':>8} {'per seg s':>10} {'seg/s':>7} {'session RSS MiB':>16} {'GPU MiB':>8}")
    for b, s in part["per_batch"].items():
        key = f"{b}x{part['container']:g}s"
        rss, gpu = part["session_rss_mib"].get(key), part.get("session_device_mib", {}).get(key, "-")
        print(f"{b:>6} {s['median']:8.4f} {s['per_segment']:10.4f} {s['segments_per_second']:7.2f} {rss!s:>16} "
              f"{gpu!s:>8}")


