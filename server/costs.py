"""What a call of each warmed (batch, container) shape costs: the planner's table, from a file
(`--cost-table`), measured by the server itself after its warm-up (`--measure-costs`), or modelled.

`python -m bench model --save` measures the table offline (speech-like clips, interleaved rounds, every
figure printed). `--measure-costs` times the server's own grid right after the warm-up instead, so a GPU
server plans from its own hardware without a run beforehand, and writes the same document to
`--cost-table` when one is named. That matters most on CUDA, where the first run of each session costs
12-14 s (cuDNN's first call of each FSMN conv, 2026-11-26 H100: docs/history.md, "Capacity") and a separate
`bench model` run would pay the whole warm-up again. Each shape runs its warm-up clip (zeros filling
WARMUP_FILL of the container in every row) once untimed, then MEASURE_REPEATS times; the median is its cost.
A call's time is the graph's, which does not depend on the samples (fixed shapes); zeros only make the
host's decoding the cheapest case, which is small beside the graph.
"""
from __future__ import annotations

import logging
import shutil
import statistics
import subprocess
import time
from typing import Any, Mapping

import numpy as np

from pipeline.audio import samples_to_seconds
from pipeline.batching import CALL_OVERHEAD_ROWS, Clip
from pipeline.engine import WARMUP_FILL
from pipeline.engine_options import session_key
from pipeline.planner import CostTable, MeasuredCosts, Shape, cost_table_document, measured_table, modelled_table

log = logging.getLogger(__name__)

MEASURE_REPEATS = 5  # timed calls per shape; a GPU grid of 12 shapes takes a few seconds


def cost_table(engine: Any, tables: Mapping[str, MeasuredCosts]) -> CostTable:
    """The planner's table for the engine's warmed grid: the measured one of its precision and device when
    `tables` has it, else modelled from the device's call overhead (pipeline/batching.py)."""
    overhead = CALL_OVERHEAD_ROWS["cpu" if engine.device == "cpu" else "gpu"]
    measured = tables.get(engine.precision)
    if measured is not None and measured.device != engine.device:
        log.warning("the cost table for %s was measured on %s, not %s: not used", engine.precision, measured.device,
                    engine.device)
        measured = None
    elif measured is None and tables:
        log.warning("the cost table has no %s table (it has %s): costs modelled", engine.precision, ", ".join(tables))
    if measured is None:
        return modelled_table(engine.grid, overhead)
    return measured_table(engine.grid, measured.seconds, overhead,
                          f"measured ({measured.precision} on {measured.device}, {measured.model or 'a model'})")


def measure_costs(engine: Any, repeats: int = MEASURE_REPEATS) -> dict[Shape, float]:
    """Median seconds per call of every (batch, container) shape of the engine's warmed grid."""
    seconds = {}
    for batch, size in engine.grid:
        clips = [Clip(np.zeros(int(size * WARMUP_FILL), np.float32))] * batch
        times = []
        for run in range(repeats + 1):  # the first is not timed: a session's second run can still settle
            began = time.perf_counter()
            engine.transcribe_many(clips, batch=batch)
            if run:
                times.append(time.perf_counter() - began)
        seconds[(batch, size)] = statistics.median(times)
    return seconds


def measured_document(engine: Any, seconds: Mapping[Shape, float]) -> dict[str, Any]:
    """The cost-table document (`bench model --save`'s format) of `seconds`, with what each session took
    to create and warm."""
    extra = {(b, size): session_figures(engine.stats, b, size, engine.device) for b, size in seconds}
    return cost_table_document(seconds, engine.precision, engine.device, engine.provider or "",
                               engine.model.manifest.name, extra)


def session_figures(stats: Any, batch: int, size: int, device: str) -> dict[str, float]:
    """What the session of one shape took while it was created and warmed (pipeline/engine_options.py
    EngineStats): seconds, host memory, and device memory on a GPU (MiB)."""
    key = session_key(batch, samples_to_seconds(size))
    figures = {}
    if key in stats.session_seconds:
        figures["build_seconds"] = round(stats.session_seconds[key], 2)
    if key in stats.session_rss:
        figures["rss_mib"] = round(stats.session_rss[key] / 2**20, 1)
    if key in stats.session_device and device != "cpu":  # the driver's figure means nothing for a CPU session
        figures["device_mib"] = round(stats.session_device[key] / 2**20, 1)
    return figures


def nvidia_smi(query: str) -> list[str] | None:
    """One `nvidia-smi --query-gpu` field per GPU, or None without an NVIDIA driver. ONNX Runtime's Python
    API does not report device memory, so the driver's figure is the one there is."""
    if shutil.which("nvidia-smi") is None:
        return None
    done = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True, timeout=30)
    return [line.strip() for line in done.stdout.splitlines() if line.strip()] if done.returncode == 0 else None


def device_memory_used(device_id: int = 0) -> int | None:
    """Bytes in use on GPU `device_id` (every process's), or None where it cannot be read."""
    used = nvidia_smi("memory.used")
    return int(float(used[device_id]) * 2**20) if used and len(used) > device_id else None
