"""The one inference thread: loads and warms the engine, then runs jobs the event loop hands it.

Inference never runs on the event loop, so keepalive pings and other sessions' I/O keep flowing while a
segment is decoded. Scheduling, all under one lock:
  * finals first, in arrival order across sessions (so each session's finals come back in order);
  * at most one pending partial per session: a newer partial replaces the waiting one, a final for the
    same segment discards it; partials run only when no final waits, oldest session first;
  * a final is never dropped; the connection bounds how many finals one session may have in flight,
    so the finals queue is bounded by sessions x that bound;
  * BATCH jobs (segments of an uploaded file, server/openai_http.py) run after every waiting final and take
    turns with partials, so a long file never starves live streams' finals or partials.
Batching: when the engine batches (GPUs), each round is one session call that pipeline/planner.py picks
from the waiting jobs and a cost table of the warmed (batch, container) shapes: jobs of one container,
finals first (partials and batch jobs ride in rows the finals leave spare), the least seconds per job by
the table, a stream's jobs in their order, and the oldest job's container once it has waited the
planner's patience. The table (server/costs.py) is measured here after the warm-up (`--measure-costs`),
or read from `bench model --save` (`--cost-table`), else modelled. With batch size 1 (the CPU
default) a round is one job, exactly the order above. A batch that fails is retried job by job, so one
bad segment costs no other stream its final; a job that still fails gets its own InferenceError.
Punctuation (--punc): a final's or an upload segment's transcript is punctuated here too, right after its
transcription, when its job asks (`punctuate`: the door has a field for it) and the server has a punctuation
model; partials never are (docs/benchmarks.md, "Punctuation"). A failure there costs the text its punctuation,
never the final.
Results go back with `loop.call_soon_threadsafe(job.deliver, ...)`; the connection owns what follows.
"""
from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from pipeline.audio import samples_to_seconds
from pipeline.batching import Clip
from pipeline.planner import CostTable, MeasuredCosts, PlannerOptions, Waiting, next_run, read_cost_tables
from pipeline.punctuation import Punctuator, punctuate_transcript
from pipeline.transcript import after_context, before_cut, starting_at
from pipeline.errors import InferenceError, OverloadError, UnipadError
from pipeline.trim import Context, Said

from .costs import cost_table, measure_costs, measured_document
from .metrics import Metrics

log = logging.getLogger(__name__)

FINAL = "final"
PARTIAL = "partial"
BATCH = "batch"


@dataclass(eq=False)
class Job:
    """One model run for one session.

    `audio` is float32 mono at SAMPLE_RATE whose first sample is at stream second `audio_start`; the
    speech (or partial window) spans stream seconds [start, end]. `arrived` is the monotonic time the
    segment's end-of-speech audio reached the server (finals only; for the latency metric).
    `deliver(job, transcript, error)` is called on the event loop with exactly one of the two set.
    """

    session: str
    kind: str  # FINAL, PARTIAL or BATCH
    segment: int
    start: float
    end: float
    audio_start: float
    audio: np.ndarray
    deliver: Callable[["Job", Any, UnipadError | None], None]
    language: str = "auto"
    itn: bool = False
    hotwords: Any = None  # the stream's ContextGraph (pipeline/hotwords.py); None: greedy decoding
    context: Context | None = None  # the previous segment's end, heard first (pipeline/trim.py)
    said: Said | None = None  # a final's words go here, for the final after it
    cut: float | None = None  # a client's commit inside the speech: words that start after it are dropped
    punctuate: bool = False  # a final or batch job's transcript punctuated, when the server has a punctuation model
    arrived: float = 0.0
    cancelled: bool = False  # set on the loop when the session goes away; the worker then skips it
    submitted: float = field(default_factory=time.monotonic)


class Worker:
    """Owns the engine and the thread that calls it. `start()` begins loading; await `ready`."""

    def __init__(self, engine: Any, loop: asyncio.AbstractEventLoop, metrics: Metrics, max_finals: int,
                 cost_tables: Mapping[str, MeasuredCosts] | None = None,
                 planner: PlannerOptions = PlannerOptions(), measure_costs: bool = False,
                 save_costs: Path | None = None, punctuator: Punctuator | None = None) -> None:
        self.engine = engine
        self.punctuator = punctuator  # --punc: warmed up after the engine, run after a final's transcription
        self.cost_tables = dict(cost_tables or {})  # precision -> measured table (pipeline/planner.py)
        self.measure_costs = measure_costs  # time the warmed grid before ready (server/costs.py) ...
        self.save_costs = save_costs  # ... and write that table here
        self.planner = planner
        self.table: CostTable | None = None  # the planner's table of the warmed grid, once loaded (batching only)
        self.loop = loop
        self.metrics = metrics
        self.max_finals = max_finals
        self.ready: asyncio.Future[None] = loop.create_future()  # done (or failed) once warmed up
        self._cond = threading.Condition()
        self._finals: deque[Job] = deque()
        self._partials: OrderedDict[str, Job] = OrderedDict()  # session -> its one pending partial
        self._batch: deque[Job] = deque()  # bounded by each upload's own jobs in flight
        self._partials_turn = True  # partials and batch jobs alternate when both wait
        self._stopping = False
        self._rebuilds = 0  # engine rebuilds already counted in the metric
        self._thread = threading.Thread(target=self._run, name="unipad-worker", daemon=True)

    # ---- event-loop side -----------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue a job (never blocks). A final evicts its segment's pending partial."""
        with self._cond:
            if job.kind == FINAL:
                if len(self._finals) >= self.max_finals:
                    # Unreachable while connections respect their per-session bound; fail loudly, not silently.
                    raise OverloadError(f"inference queue full ({self.max_finals} finals waiting)")
                pending = self._partials.get(job.session)
                if pending is not None and pending.segment <= job.segment:
                    del self._partials[job.session]
                    self.metrics.partials_dropped.inc()
                self._finals.append(job)
            elif job.kind == BATCH:
                self._batch.append(job)
            else:
                if job.session in self._partials:
                    self.metrics.partials_dropped.inc()
                self._partials[job.session] = job  # a replacement keeps the session's place in line
            self._update_depth()
            self._cond.notify()

    def cancel_session(self, session: str) -> None:
        """Forget a session's waiting jobs (its connection is gone); a running one is marked and discarded."""
        with self._cond:
            self._partials.pop(session, None)
            for job in self._finals:
                if job.session == session:
                    job.cancelled = True
            self._finals = deque(j for j in self._finals if not j.cancelled)
            self._batch = deque(j for j in self._batch if j.session != session)
            self._update_depth()

    def stop(self, timeout: float | None = None) -> None:
        """Stop after the job now running; waiting jobs are abandoned (connections are closed by then)."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive() and timeout != 0:
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        """The thread is still at work (e.g. loading a model past stop()'s timeout)."""
        return self._thread.is_alive()

    @property
    def depth(self) -> int:
        with self._cond:
            return len(self._finals) + len(self._partials) + len(self._batch)

    # ---- worker thread -------------------------------------------------------------------------------

    def _update_depth(self) -> None:
        self.metrics.queue_depth.labels(FINAL).set(len(self._finals))
        self.metrics.queue_depth.labels(PARTIAL).set(len(self._partials))
        self.metrics.queue_depth.labels(BATCH).set(len(self._batch))

    def _call_loop(self, callback: Callable[..., Any], *args: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop closed under us (forced exit): nobody is waiting any more
            pass

    def _run(self) -> None:
        try:
            self.engine.load()
            if self.punctuator is not None:
                self.punctuator.warm_up()
        except BaseException as exc:  # noqa: BLE001 - reported to the loop, which decides to exit
            log.error("model load failed: %s", exc)
            self._call_loop(_set_exception, self.ready, exc)
            return
        self._update_unwarmed()
        self._plan_on_grid()
        self._call_loop(_set_result, self.ready)
        while True:
            round_ = self._next_jobs()
            if round_ is None:
                return
            self._execute(*round_)
            # not kept while the next round is awaited: its jobs hold their audio and, through their delivery,
            # their connections, which would outlive their clients until any other job ran
            round_ = None

    def _plan_on_grid(self) -> None:
        """The planner's table for the engine's warmed grid (again after a rebuild); None without batching."""
        if max(getattr(self.engine, "batch_sizes", None) or (1,)) == 1:
            if self.measure_costs:
                log.info("costs not measured: batch size 1 runs one clip per call, so there are no batches to plan")
            self.table = None
            return
        if self.measure_costs:
            self._measure_costs()
        self.table = cost_table(self.engine, self.cost_tables)
        log.info("batching on %d shapes, costs %s", len(self.table.seconds), self.table.source)

    def _measure_costs(self) -> None:
        """Time every shape of the warmed grid (again after a rebuild: another device, other costs) and
        plan from that table; write it where --cost-table says, if it does."""
        began = time.perf_counter()
        document = measured_document(self.engine, measure_costs(self.engine))
        self.cost_tables = read_cost_tables(document)
        log.info("measured the costs of %d shapes in %.1f s", len(document["calls"]), time.perf_counter() - began)
        if self.save_costs is not None:
            try:
                self.save_costs.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
            except OSError as exc:  # the table is in use all the same; only the file is missing
                log.error("could not write the measured cost table to %s: %s", self.save_costs, exc.strerror or exc)

    def _next_jobs(self) -> tuple[list[Job], int | None] | None:
        """One round: its jobs and the planned batch (None: one job, in the order of the queues)."""
        with self._cond:
            while not self._stopping and not self._finals and not self._partials and not self._batch:
                self._cond.wait()
            if self._stopping:
                return None
            if self.table is not None:
                jobs, batch = self._planned(self.table)
            elif self._finals:
                jobs, batch = [self._finals.popleft()], None
            elif self._partials and (self._partials_turn or not self._batch):
                jobs, batch = [self._partials.popitem(last=False)[1]], None
                self._partials_turn = False
            else:
                jobs, batch = [self._batch.popleft()], None
                self._partials_turn = True
            self._update_depth()
            return jobs, batch

    def _planned(self, table: CostTable) -> tuple[list[Job], int]:
        """The planner's run over every waiting job (under the lock); its jobs leave the queues."""
        partials, batch = list(self._partials.values()), list(self._batch)
        first, second = (partials, batch) if self._partials_turn or not batch else (batch, partials)
        others = [j for pair in zip(first, second) for j in pair] + first[len(second):] + second[len(first):]
        jobs = list(self._finals) + others
        now = time.monotonic()
        run = next_run([Waiting(len(j.audio), j.kind == FINAL, now - j.submitted, j.session) for j in jobs], table,
                       self.planner)
        chosen = [jobs[i] for i in run.clips]  # type: ignore[union-attr]  (jobs wait: never None)
        taken = {id(j) for j in chosen}
        self._finals = deque(j for j in self._finals if id(j) not in taken)
        self._batch = deque(j for j in self._batch if id(j) not in taken)
        for job in chosen:
            if job.kind == PARTIAL:
                del self._partials[job.session]
        kinds = {job.kind for job in chosen}
        if (PARTIAL in kinds) != (BATCH in kinds):  # the lane that was served gives the other its turn
            self._partials_turn = BATCH in kinds
        return chosen, run.batch  # type: ignore[union-attr]

    def _execute(self, jobs: list[Job], batch: int | None = None) -> None:
        jobs = [job for job in jobs if not job.cancelled]
        if not jobs:
            return
        began = time.perf_counter()
        try:
            results = [(t, None) for t in self._transcribe(jobs, batch)]
        except Exception as exc:  # noqa: BLE001 - sorted out job by job below
            if len(jobs) == 1:
                results = [(None, self._error(jobs[0], exc))]
            else:
                log.warning("a batch of %d jobs failed (%s); retrying them one by one", len(jobs), exc)
                results = [self._one(job) for job in jobs]
        share = (time.perf_counter() - began) / len(jobs)  # a batch's time, shared by its jobs
        for job, (transcript, error) in zip(jobs, results):
            self.metrics.inference_seconds.labels(job.kind).observe(share)
            self.metrics.audio_seconds.labels(job.kind).inc(samples_to_seconds(len(job.audio)))
        self._update_unwarmed()
        for job, (transcript, error) in zip(jobs, results):
            if not job.cancelled:
                self._call_loop(job.deliver, job, transcript, error)

    def _transcribe(self, jobs: list[Job], batch: int | None = None) -> list[Any]:
        clips = [Clip(job.audio, job.language, job.itn, job.hotwords) for job in jobs]
        offsets = [job.audio_start for job in jobs]
        transcripts = (self.engine.transcribe_many(clips, offsets) if batch is None else
                       self.engine.transcribe_many(clips, offsets, batch=batch))
        out = []
        for t, job in zip(transcripts, jobs):  # in submission order: a final's words are kept before the next's
            if job.context is not None:
                t = after_context(t, job.context.start, job.context.end, job.context.previous.since(job.context.start))
            t = starting_at(t, job.start)  # words start at the speech
            out.append(t if job.cut is None else before_cut(t, job.cut))
            if job.said is not None:
                job.said.words = out[-1].words
            if job.punctuate and job.kind != PARTIAL and self.punctuator is not None:
                out[-1] = self._punctuated(out[-1], job)
        return out

    def _punctuated(self, transcript: Any, job: Job) -> Any:
        """The transcript with its punctuation; as it was when the punctuation model fails (logged)."""
        try:
            return punctuate_transcript(self.punctuator, transcript)
        except Exception as exc:  # noqa: BLE001 - the final's text must not be lost for its punctuation
            log.error("punctuation failed (session %s, segment %d): %s: %s", job.session, job.segment,
                      type(exc).__name__, exc)
            return transcript

    def _one(self, job: Job) -> tuple[Any, UnipadError | None]:
        try:
            return self._transcribe([job])[0], None
        except Exception as exc:  # noqa: BLE001 - one bad segment must not stop the worker
            return None, self._error(job, exc)

    @staticmethod
    def _error(job: Job, exc: Exception) -> UnipadError:
        if isinstance(exc, UnipadError):
            return exc
        log.error("inference failed (session %s, segment %d)", job.session, job.segment, exc_info=exc)
        return InferenceError(f"inference failed: {type(exc).__name__}: {exc}", segment=job.segment)

    def _update_unwarmed(self) -> None:
        self.metrics.unwarmed_shape_calls.set(unwarmed_shape_calls(self.engine))
        self.metrics.cold_shape_calls.set(int(getattr(self.engine.stats, "cold_shape_calls", 0)))
        rebuilds = int(getattr(self.engine.stats, "rebuilds", 0))
        if rebuilds > self._rebuilds:  # the engine counts; the metric follows (a counter only goes up)
            self.metrics.engine_rebuilds.inc(rebuilds - self._rebuilds)
            log.warning("the engine rebuilt its sessions (%d so far); now on %s", rebuilds, self.engine.provider)
            self._rebuilds = rebuilds
            self._plan_on_grid()  # a rebuild on another device has another grid


def unwarmed_shape_calls(engine: Any) -> int:
    """The engine's count of runs at a shape no session was warmed with."""
    return int(engine.stats.unwarmed_calls)


def _set_result(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _set_exception(future: asyncio.Future[None], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
