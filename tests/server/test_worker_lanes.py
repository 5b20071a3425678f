"""The worker's lanes with the real engine: finals first, then partials and uploads' BATCH jobs in turn, so
a long upload neither delays live finals nor starves live partials."""
from __future__ import annotations

import asyncio

import numpy as np

from pipeline.audio import SAMPLE_RATE
from pipeline.engine import Engine, EngineOptions
from server.metrics import Metrics
from server.worker import BATCH, FINAL, PARTIAL, Job, Worker


async def test_finals_first_then_partials_and_batch_jobs_take_turns(test_model_dir):
    loop = asyncio.get_running_loop()
    order: list[str] = []
    everything = loop.create_future()
    worker = Worker(Engine(test_model_dir, EngineOptions(containers=(2.0,), threads=1)), loop, Metrics(),
                    max_finals=8)

    def deliver(job: Job, transcript, error) -> None:
        assert error is None and isinstance(transcript.text, str)
        order.append(f"{job.kind}:{job.session}")
        if len(order) == 7:
            everything.set_result(None)

    def job(kind: str, session: str, segment: int = 0) -> Job:
        return Job(session=session, kind=kind, segment=segment, start=0.0, end=1.0, audio_start=0.0,
                   audio=np.zeros(SAMPLE_RATE, np.float32), deliver=deliver)

    for n in range(3):  # an upload has three segments queued before the live streams speak
        worker.submit(job(BATCH, "upload", n))
    worker.submit(job(PARTIAL, "live1"))
    worker.submit(job(PARTIAL, "live2"))
    worker.submit(job(FINAL, "live1"))  # evicts live1's waiting partial
    worker.submit(job(FINAL, "live3"))
    worker.submit(job(BATCH, "gone"))
    worker.cancel_session("gone")  # a request that went away takes its jobs with it
    assert worker.depth == 6
    worker.submit(job(PARTIAL, "live4"))
    worker.start()
    try:
        await asyncio.wait_for(everything, 120)
    finally:
        worker.stop(timeout=10)
    assert order == ["final:live1", "final:live3", "partial:live2", "batch:upload", "partial:live4",
                     "batch:upload", "batch:upload"]
