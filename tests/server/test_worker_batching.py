"""The worker's rounds on a real engine (CPU fp32, batches of 1 and 4): jobs that wait together run as one
batch, on a ladder each in the container that holds it as the cost table plans (pipeline/planner.py), a
server that measures its own table plans from it and writes it, and a batch that fails is retried job by
job so that only the bad job gets an error."""
from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from pipeline.audio import SAMPLE_RATE, seconds_to_samples
from pipeline.engine import Engine, EngineOptions
from pipeline.errors import ProtocolError
from pipeline.planner import cost_table_document, read_cost_tables
from server.metrics import Metrics
from server_testkit import http_get
from server.worker import FINAL, PARTIAL, Job, Worker


def clip(seconds: float, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(seconds_to_samples(seconds)) * 0.1).astype(np.float32)


async def run_round(engine: Engine, specs: list[tuple[str, str]], cost_tables=None) -> tuple[dict, Worker]:
    """Queue one job per (kind, language) before the worker starts, so they all wait together; returns
    {segment: (transcript, error)} once each was delivered."""
    loop = asyncio.get_running_loop()
    worker = Worker(engine, loop, Metrics(), max_finals=64, cost_tables=cost_tables)
    results: dict[int, tuple] = {}
    finished = asyncio.Event()

    def deliver(job: Job, transcript, error) -> None:
        results[job.segment] = (transcript, error)
        if len(results) == len(specs):
            finished.set()

    for i, (kind, language) in enumerate(specs):
        worker.submit(Job(session=f"s{i}", kind=kind, segment=i, start=0.0, end=1.0, audio_start=0.0,
                          audio=clip(0.5 + 0.4 * i, i), deliver=deliver, language=language))
    worker.start()
    try:
        await worker.ready
        await asyncio.wait_for(finished.wait(), 120)
    finally:
        worker.stop(timeout=30)
    return results, worker


@pytest.fixture
def engine(tiny_model_dir) -> Engine:
    return Engine(tiny_model_dir, EngineOptions(device="cpu", precision="fp32", containers=(2.0,), batch_sizes=(1, 4)))


async def test_waiting_jobs_run_as_one_batch(engine):
    results, _ = await run_round(engine, [(FINAL, "en"), (PARTIAL, "auto"), (FINAL, "auto")])
    assert engine.stats.calls == 1 and engine.stats.last_batch == 4 and engine.stats.unwarmed_calls == 0
    for i, (transcript, error) in results.items():
        assert error is None
        assert transcript == engine.transcribe(clip(0.5 + 0.4 * i, i), ("en", "auto", "auto")[i])


async def test_jobs_run_in_the_smallest_container_that_holds_them_as_the_table_plans(tiny_model_dir):
    engine = Engine(tiny_model_dir, EngineOptions(device="cpu", precision="fp32", containers=(1.0, 2.0),
                                                  batch_sizes=(1, 4)))
    one, two = SAMPLE_RATE, 2 * SAMPLE_RATE
    measured = {(1, one): 0.010, (4, one): 0.012, (1, two): 0.020, (4, two): 0.024}
    tables = read_cost_tables(cost_table_document(measured, "fp32", "cpu", "CPUExecutionProvider", "tiny"))
    specs = [(FINAL, "auto")] * 4  # 0.5, 0.9 s (the 1 s container), 1.3, 1.7 s (the 2 s one)
    results, worker = await run_round(engine, specs, tables)
    assert worker.table.source.startswith("measured") and dict(worker.table.seconds) == measured
    # two calls, each a batch of 4 holding two finals: the 1 s container first (cheaper per final), then 2 s
    assert engine.stats.calls == 2 and engine.stats.rows == 4 and engine.stats.spare_rows == 4
    assert engine.stats.last_container == two and engine.stats.unwarmed_calls == 0
    for i, (transcript, error) in results.items():
        assert error is None and transcript == engine.transcribe(clip(0.5 + 0.4 * i, i), "auto")


async def test_a_server_that_measures_its_costs_plans_from_them_and_writes_them(serve_test_server, tiny_model_dir,
                                                                                tmp_path):
    saved = tmp_path / "costs.json"
    async with serve_test_server(tiny_model_dir, device="cpu", precision="fp32", containers=(2.0, 30.0),
                                 batch_sizes=(1, 4), measure_costs=True, cost_table=saved) as url:
        status, _, body = await http_get(url.http, "/readyz")
        table, engine = url.server.worker.table, url.server.engine
    assert status == 200
    name = engine.model.manifest.name
    assert json.loads(body)["costs"] == table.source == f"measured (fp32 on cpu, {name}), 4 shapes measured"
    assert set(table.seconds) == set(engine.grid) and all(s > 0 for s in table.seconds.values())
    document = json.loads(saved.read_text())  # what `--cost-table` reads back, with each session's figures
    assert read_cost_tables(document)["fp32"].seconds == table.seconds
    assert all(call["build_seconds"] > 0 and call["rss_mib"] is not None and "device_mib" not in call
               for call in document["calls"])
    assert engine.stats.unwarmed_calls == 0


async def test_a_failed_batch_is_retried_job_by_job(engine):
    def fail_the_batch(call: int) -> None:
        if call == 1:
            raise RuntimeError("the batch blew up")

    engine.fault_hook = fail_the_batch
    specs = [(FINAL, "en"), (FINAL, "auto"), (PARTIAL, "auto")]
    results, _ = await run_round(engine, specs)
    assert engine.stats.calls == 1 + len(specs)  # the batch, then each job alone
    engine.fault_hook = None
    for i, (transcript, error) in results.items():
        assert error is None and transcript == engine.transcribe(clip(0.5 + 0.4 * i, i), specs[i][1])

    specs = [(FINAL, "en"), (FINAL, "xx"), (FINAL, "auto")]  # "xx" fails alone too: only it gets the error
    results, _ = await run_round(engine, specs)
    assert isinstance(results[1][1], ProtocolError) and results[1][0] is None
    for i in (0, 2):
        transcript, error = results[i]
        assert error is None and transcript == engine.transcribe(clip(0.5 + 0.4 * i, i), specs[i][1])
    assert engine.stats.unwarmed_calls == 0
