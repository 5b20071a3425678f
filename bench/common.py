"""Helpers shared by the benchmark commands: run statistics, memory sampling, machine facts, output."""
from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import psutil

from pipeline.audio import SAMPLE_RATE, load_audio
from server.costs import nvidia_smi

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
SPEECH_FIXTURE = FIXTURES / "three_utterances.wav"


def summary(values: list[float]) -> dict[str, float]:
    """median, min, max, stdev (seconds) and the run count of a list of timings."""
    if not values:
        return {"runs": 0}
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
            "max": round(max(values), 4), "stdev": round(statistics.pstdev(values), 4), "runs": len(values)}


def percentiles(values: list[float], points: tuple[int, ...] = (50, 95, 99)) -> dict[str, float | None]:
    if not values:
        return {f"p{p}": None for p in points}
    return {f"p{p}": round(float(np.percentile(values, p)), 4) for p in points}


def time_runs(fn: Callable[[], Any], warmup: int, repeats: int) -> list[float]:
    """Wall seconds of `repeats` calls of fn after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return times


@dataclass
class PeakMemory:
    """Samples a process's resident set size every `interval` seconds while active (a context manager).

    `peak` and `start` are bytes. Polling misses spikes shorter than the interval; fine for session
    creation and inference, whose allocations live for the whole phase.
    """

    pid: int = field(default_factory=os.getpid)
    interval: float = 0.02
    start: int = 0
    peak: int = 0

    def __enter__(self) -> PeakMemory:
        self._process = psutil.Process(self.pid)
        self.start = self.peak = self._process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.peak = max(self.peak, self._process.memory_info().rss)
            except psutil.Error:
                return

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        try:
            self.peak = max(self.peak, self._process.memory_info().rss)
        except psutil.Error:
            pass


def mib(n: int | None) -> float | None:
    return None if n is None else round(n / 2**20, 1)


def cpu_model() -> str:
    """The CPU's model name, with its family and model numbers (a VM may show only a generic name)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']}, model {fields['model']})"
    return name


def machine() -> dict[str, Any]:
    """What the figures were measured on, and how busy it was when they started."""
    import onnxruntime as ort

    load = os.getloadavg() if hasattr(os, "getloadavg") else (None, None, None)
    flags = ""
    try:
        flags = open("/proc/cpuinfo", encoding="utf-8").read()
    except OSError:
        pass
    isa = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "amx_bf16") if f" {f}" in flags]
    return {
        "cpu": cpu_model(), "cores": psutil.cpu_count(logical=False), "threads": psutil.cpu_count(logical=True),
        "isa": isa, "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "os": platform.platform(terse=True), "python": platform.python_version(), "onnxruntime": ort.__version__,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "loadavg_1m": None if load[0] is None else round(load[0], 2),
        "gpus": nvidia_smi("name,memory.total,driver_version") or [],
    }


def speech_audio(seconds: float) -> np.ndarray:
    """Real speech (the committed espeak fixture, repeated) cut to `seconds`: float32 [n] at SAMPLE_RATE.
    Only shapes set the cost of a run on these graphs; real audio keeps the numbers honest anyway."""
    base = load_audio(SPEECH_FIXTURE)
    n = int(round(seconds * SAMPLE_RATE))
    return np.resize(base, n).astype(np.float32)


def emit(result: dict[str, Any], save: Path | None) -> None:
    """Write the result JSON to `save` (if given) and print it as the last line of stdout."""
    text = json.dumps(result, ensure_ascii=False, allow_nan=False, default=str)
    if save is not None:
        save.parent.mkdir(parents=True, exist_ok=True)
        save.write_text(json.dumps(result, indent=2, ensure_ascii=False, default=str) + "\n", encoding="utf-8")
    sys.stdout.flush()
    print(text, flush=True)


def say(message: str) -> None:
    """Progress and tables go to stderr, so the last stdout line is always the JSON."""
    print(message, file=sys.stderr, flush=True)


def command_line() -> str:
    """How this benchmark was invoked, for the report."""
    import shlex

    return "python -m bench " + " ".join(shlex.quote(a) for a in sys.argv[1:])
