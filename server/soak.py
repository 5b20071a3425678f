"""A bounded soak test: many sessions, >= 1000 segments, unpaced; reports memory slope, lost finals, leaks.

    python -m server.soak --sessions 40 --segments 1000 [--model DIR] [--audio WAV]

Runs a real Server on 127.0.0.1 (its own thread and event loop, like production's one loop) and drives it
from this thread's loop: `--sessions` concurrent clients, each opening streams one after another and
sending `--plays` copies of the recording per stream as fast as the server reads (backpressure paces
them). Every `--sample-every` segments it samples the process RSS. At the end it reports:
    rss_slope_mb_per_100_segments   least-squares slope over the second half of the samples (after warm-up)
    finals_lost                     segments expected (utterances x plays) minus finals received; must be 0
    tasks / threads before, after   on the server's loop / in the process, once every stream is closed
Exit status 0 when nothing was lost or leaked, 1 otherwise. The model defaults to models/demo, else the
tiny test graph (tests/fixtures/tiny_graph.py, a repository checkout only). Not part of the test suite.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import platform
import sys
import tempfile
import threading
import time
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.audio import SAMPLE_RATE, load_audio

from .config import DEFAULT_MODEL_DIR, ServerConfig, validate_config
from .protocol import STREAM_PATH

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_AUDIO = ROOT / "tests" / "fixtures" / "three_utterances.wav"
UTTERANCES = ROOT / "tests" / "fixtures" / "three_utterances.json"
CHUNK_SECONDS = 0.1


@dataclass
class Tally:
    """What the clients saw, and the RSS samples (segments finalised, bytes)."""

    streams: int = 0
    expected: int = 0
    finals: int = 0
    segment_errors: int = 0
    stream_errors: list[str] = field(default_factory=list)
    samples: list[tuple[int, int]] = field(default_factory=list)
    next_sample: int = 0


def rss_bytes() -> int:
    import psutil

    return psutil.Process().memory_info().rss


class ServerThread:
    """A Server on its own thread and loop; `call(coro)` runs a coroutine there and returns its result."""

    def __init__(self, config: ServerConfig) -> None:
        from .server import Server

        self.loop = asyncio.new_event_loop()
        self.server = Server(config)
        self._thread = threading.Thread(target=self.loop.run_forever, name="soak-server", daemon=True)
        self._thread.start()
        self._serving = asyncio.run_coroutine_threadsafe(self.server.serve(install_signal_handlers=False), self.loop)
        self.call(self.server.listening.wait(), timeout=60)
        self.call(self._ready(), timeout=600)
        self.url = f"ws://127.0.0.1:{self.server.port}{STREAM_PATH}"

    async def _ready(self) -> None:
        await self.server.worker.ready

    def call(self, coro: Any, timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def tasks(self) -> int:
        async def count() -> int:
            return len(asyncio.all_tasks()) - 1  # not this one

        return self.call(count())

    def stop(self) -> int:
        self.loop.call_soon_threadsafe(self.server.request_shutdown)
        code = self._serving.result(120)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        return code


async def one_stream(url: str, pcm: bytes, plays: int, per_play: int, tally: Tally, every: int) -> None:
    """One stream: start, the recording `plays` times unpaced, stop; count what comes back."""
    import websockets

    step = int(CHUNK_SECONDS * SAMPLE_RATE) * 2
    finals = 0
    async with websockets.connect(url, max_size=None) as ws:
        await ws.send(json.dumps({"type": "start"}))

        async def read() -> None:
            nonlocal finals
            async for text in ws:
                message = json.loads(text)
                if message["type"] == "final":
                    finals += 1
                    tally.finals += 1
                    if tally.finals >= tally.next_sample:
                        tally.samples.append((tally.finals, rss_bytes()))
                        tally.next_sample += every
                elif message["type"] == "error":
                    if "segment" in message:
                        tally.segment_errors += 1
                    else:
                        tally.stream_errors.append(message["code"])

        reader = asyncio.ensure_future(read())
        for _ in range(plays):
            for i in range(0, len(pcm), step):
                await ws.send(pcm[i:i + step])
        await ws.send(json.dumps({"type": "stop"}))
        await reader
    tally.streams += 1
    tally.expected += plays * per_play


async def drive(url: str, pcm: bytes, per_play: int, args: argparse.Namespace, tally: Tally) -> None:
    """`args.sessions` clients open streams until `args.segments` segments have been sent in all."""
    started = 0  # segments handed to streams (claimed before sending, so the total stops at the target)

    async def client() -> None:
        nonlocal started
        while started < args.segments:
            started += args.plays * per_play
            await one_stream(url, pcm, args.plays, per_play, tally, args.sample_every)

    await asyncio.gather(*(client() for _ in range(args.sessions)))


def slope_per_100(samples: list[tuple[int, int]]) -> float:
    """Least-squares slope of RSS (MB) against segments, times 100, over the second half of the samples."""
    half = samples[len(samples) // 2:]
    if len(half) < 2:
        return float("nan")
    x = np.array([s for s, _ in half], float)
    y = np.array([r for _, r in half], float) / 2**20
    return float(np.polyfit(x, y, 1)[0] * 100)


def heap_report(top: int = 5) -> dict[str, Any]:
    """Traced Python heap before and after a full garbage collection, and its largest sites before it."""
    snapshot = tracemalloc.take_snapshot()
    before = tracemalloc.get_traced_memory()[0]
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return {"heap_traced_mb_before_gc": round(before / 2**20, 1), "heap_traced_mb_after_gc": round(after / 2**20, 1),
            "heap_largest_sites_before_gc": [str(s) for s in snapshot.statistics("lineno")[:top]]}


def default_model() -> Path:
    if (DEFAULT_MODEL_DIR / "manifest.json").is_file():
        return DEFAULT_MODEL_DIR
    sys.path.insert(0, str(ROOT / "tests"))
    from fixtures.tiny_graph import write_tiny_model_dir  # a repository checkout only

    return write_tiny_model_dir(Path(tempfile.mkdtemp(prefix="unipad-soak-")))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m server.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=40, help="concurrent clients")
    p.add_argument("--segments", type=int, default=1000, help="segments to send in all (at least)")
    p.add_argument("--plays", type=int, default=2, help="copies of the recording per stream")
    p.add_argument("--model", type=Path, default=None, help="model directory (default: models/demo, else tiny)")
    p.add_argument("--audio", type=Path, default=DEFAULT_AUDIO, help="recording with a known number of utterances")
    p.add_argument("--utterances", type=int, default=None, help="utterances in --audio (default: from its .json)")
    p.add_argument("--sample-every", type=int, default=50, help="segments between RSS samples")
    p.add_argument("--threads", type=int, default=0, help="ONNX Runtime threads (0: one per core)")
    p.add_argument("--trace-heap", action="store_true", help="trace the Python heap; report what only the GC frees")
    args = p.parse_args(argv)

    per_play = args.utterances or len(json.loads(UTTERANCES.read_text())["speech"])
    pcm = (np.clip(np.round(load_audio(args.audio) * 32767), -32768, 32767).astype("<i2")).tobytes()
    model = args.model or default_model()
    config = validate_config(dataclasses.replace(
        ServerConfig(), model=model, port=0, device="cpu", max_sessions=args.sessions, threads=args.threads,
        log_level="warning"))
    began = time.perf_counter()
    app = ServerThread(config)
    tally = Tally()
    # one stream first, so lazily created state (thread pools, caches) is not counted as a leak
    asyncio.run(drive(app.url, pcm, per_play, argparse.Namespace(**{**vars(args), "sessions": 1,
                                                                       "segments": 1, "plays": 1}), tally))
    time.sleep(0.5)  # the server releases a stream just after its client sees the close
    tasks_before, threads_before, rss_before = app.tasks(), threading.active_count(), rss_bytes()
    tally = Tally(samples=[(0, rss_before)], next_sample=args.sample_every)
    if args.trace_heap:
        tracemalloc.start()
    asyncio.run(drive(app.url, pcm, per_play, args, tally))
    time.sleep(0.5)  # the server releases a stream just after its client sees the close
    tasks_after, threads_after, rss_after = app.tasks(), threading.active_count(), rss_bytes()
    heap = heap_report() if args.trace_heap else {}
    sessions_left = len(app.server.connections)
    exit_code = app.stop()
    elapsed = time.perf_counter() - began

    report = {
        "command": "python -m server.soak " + " ".join(argv if argv is not None else sys.argv[1:]),
        "model": str(model), "machine": f"{platform.machine()}, {platform.processor() or '?'}, "
                                        f"{__import__('os').cpu_count()} CPUs, Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d %H:%M"), "seconds": round(elapsed, 1),
        "streams": tally.streams, "segments_expected": tally.expected, "finals": tally.finals,
        "segment_errors": tally.segment_errors, "stream_errors": tally.stream_errors,
        "finals_lost": tally.expected - tally.finals,
        "rss_mb_before": round(rss_before / 2**20, 1), "rss_mb_after": round(rss_after / 2**20, 1),
        "rss_mb_peak_sampled": round(max(r for _, r in tally.samples) / 2**20, 1),
        "rss_slope_mb_per_100_segments": round(slope_per_100(tally.samples), 3),
        "rss_mb_by_segments": [(n, round(r / 2**20)) for n, r in tally.samples],
        "tasks_before": tasks_before, "tasks_after": tasks_after,
        "threads_before": threads_before, "threads_after": threads_after, "sessions_left": sessions_left,
        "server_exit_code": exit_code, **heap,
    }
    print(json.dumps(report, indent=2))
    ok = (report["finals_lost"] == 0 and not tally.stream_errors and tasks_after <= tasks_before
          and threads_after <= threads_before and sessions_left == 0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
