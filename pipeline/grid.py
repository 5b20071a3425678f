"""The grid of sessions a family runs its audio graph on: one warmed session per (batch size, container) pair.

SenseVoice's one graph and a Paraformer's first stage (pipeline/families) both run here:
    sessions    one per pair, every free dimension fixed (pipeline/sessions.py); on the CPU the weights are
                loaded once and shared, or, for a family that says so (Family.one_session_on_cpu), one
                prepacked session serves every shape through a runner per shape (sessions.runner_on)
    warm-up     each session runs once with exactly its shape (a clip of `fill` x the container, zeros)
    infer       clips grouped by container and packed into the grid's batch sizes (pipeline/batching.py), or
                one batch a caller planned; a shape no session was warmed with is refused through the engine
                (an open shape on the CPU gets a runner, counted as cold: pipeline/shapes.py)
Every run goes through the engine's `infer_session` (counted, fault-checked, recovered).
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .audio import samples_to_seconds
from .batching import CALL_OVERHEAD_ROWS, Clip, Run, choose_batch_sizes, pack, plan_batches, planned_run
from .errors import InferenceError, ModelLoadError
from .providers import ProviderConfig, SessionRunner
from .sessions import create_session, footprint, load_shared_weights, open_runner, runner_on

log = logging.getLogger(__name__)

Key = tuple[int, int]  # (batch size, container samples)


def grid_batch_sizes(engine: Any, device: str, precision: str) -> tuple[int, ...]:
    """The batch sizes of the grid: the device's (or the options'), none above the family's Family.max_batch."""
    sizes = choose_batch_sizes(engine.options.batch_sizes, device, precision)
    most = engine.family.max_batch
    return sizes if most is None else tuple(b for b in sizes if b <= most) or (most,)


def grid_line(precision: str, path: Path, policy: Any, batch_sizes: tuple[int, ...], *notes: str) -> str:
    """What the engine logs of a grid family's build."""
    return (f"{precision} graph {path.name}, containers {','.join(f'{c:g}' for c in policy.containers)} s, "
            f"batch sizes {','.join(map(str, batch_sizes))}, {', '.join(notes)}")


class SessionGrid:
    """The sessions of one graph over the (batch, container) pairs of `engine.policy` x `batch_sizes`."""

    def __init__(self, engine: Any, path: Path, batch_sizes: tuple[int, ...], config: ProviderConfig,
                 one_session: bool) -> None:
        self.engine, self.path, self.batch_sizes = engine, path, batch_sizes
        self.one_session = one_session
        self.sessions: dict[Key, SessionRunner] = {}
        self.shared: dict = {}  # weights shared by the CPU sessions; must outlive them
        self._build(config)

    def _build(self, config: ProviderConfig) -> None:
        engine, stats = self.engine, self.engine.stats
        grid = [(b, size) for size in engine.policy.sizes for b in self.batch_sizes]
        if engine.options.share_weights and config.device == "cpu" and len(grid) > 1 and not self.one_session:
            self.shared = load_shared_weights(self.path)
            stats.shared_weight_bytes = sum(a.nbytes for a, _ in self.shared.values())

        def create(batch: int, size: int) -> SessionRunner:
            before = footprint(engine.memory_probe)
            runner = create_session(self.path, batch, size, config, engine.options.threads, self.shared,
                                    engine.options.device_id or 0, engine.family)
            stats.note_session(batch, samples_to_seconds(size), before, footprint(engine.memory_probe))
            log.info("created batch %d x %.3g s in %.2f s", batch, samples_to_seconds(size),
                     time.perf_counter() - before[0])
            return runner

        try:
            if self.one_session:
                base = create(1, 0)
                self.sessions = {key: runner_on(base, *key) for key in grid}
            else:
                self.sessions = {key: create(*key) for key in grid}
        except ModelLoadError:
            if not self.shared:
                raise
            log.warning("sharing weights between sessions failed; loading one copy per session")
            self.shared, stats.shared_weight_bytes = {}, 0
            self.sessions = {key: create(*key) for key in grid}

    def describe(self) -> str:
        """How the weights are held, for the engine's log line."""
        return (f"{self.engine.stats.shared_weight_bytes / 2**20:.0f} MiB of weights shared" if self.shared
                else "one session per graph" if self.one_session else "weights per session")

    @property
    def output_names(self) -> tuple[str, ...]:
        return next(iter(self.sessions.values())).output_names

    def warm_up(self, prompt: tuple[int, int], fill: float) -> None:
        """Run each session once with exactly its shape: a clip of `fill` x its container, `prompt` (language
        id, textnorm id) in every row."""
        engine = self.engine
        for (batch, size), session in self.sessions.items():
            before = footprint(engine.memory_probe)
            feed = pack([np.zeros(int(size * fill), np.float32)] * batch, [prompt] * batch, batch, size)
            engine.infer_session(session, feed, session.output_names, warming=True)
            session.warmed = True
            engine.stats.note_session(batch, samples_to_seconds(size), before, footprint(engine.memory_probe))
            log.info("warmed batch %d x %.3g s in %.2f s", batch, samples_to_seconds(size),
                     time.perf_counter() - before[0])

    @property
    def ready(self) -> bool:
        return bool(self.sessions) and all(s.warmed for s in self.sessions.values())

    @property
    def grid(self) -> tuple[Key, ...]:
        return tuple(key for key, session in self.sessions.items() if session.warmed)

    def infer(self, clips: Sequence[Clip], batch: int | None, names: Callable[[SessionRunner], tuple[str, ...]],
              row_output: Callable[[dict[str, np.ndarray], int, Run], Any]) -> list[Any]:
        """Run `clips` (see the module doc); `names(session)`: the outputs a run fetches; `row_output(outputs,
        row, run)`: what one clip gets back from its run. Any failure raises for the whole call."""
        engine, policy = self.engine, self.engine.policy
        audios, prompts, containers = [], [], []
        for clip in clips:
            audio = np.asarray(clip.audio, dtype=np.float32)
            if audio.ndim != 1:
                raise ValueError(f"audio must be mono [samples], got shape {audio.shape}")
            prompts.append((engine.language_id(clip.language), engine.textnorm_id(clip.itn)))
            try:
                containers.append(policy.container_for(len(audio)))
            except ValueError as exc:
                engine.stats.failures += 1
                raise InferenceError(str(exc), samples=len(audio)) from None
            audios.append(audio)
        results: list[Any] = [None] * len(audios)
        overhead = CALL_OVERHEAD_ROWS["cpu" if engine.device == "cpu" else "gpu"]
        runs = [planned_run(containers, batch)] if batch is not None else plan_batches(containers, self.batch_sizes,
                                                                                         overhead)
        for run in runs:
            feed = pack([audios[i] for i in run.rows], [prompts[i] for i in run.rows], run.batch, run.size)
            outputs = self.run(run, feed, names)
            for row, index in enumerate(run.rows):
                results[index] = row_output(outputs, row, run)
        return results

    def run(self, run: Run, feed: dict[str, np.ndarray],
            names: Callable[[SessionRunner], tuple[str, ...]]) -> dict[str, np.ndarray]:
        """One call at `run`'s shape; UnwarmedShapeError (through the engine) for a shape no session was warmed
        with."""
        engine = self.engine
        session = self.sessions.get((run.batch, run.size))
        if session is None and engine.policy.step:  # an open shape (CPU): the one session runs it
            session = open_runner(self.sessions, (run.batch, run.size), run.batch, run.size, engine.stats)
        if session is None or not session.warmed:
            engine.refuse_unwarmed(f"{run.batch} x {run.size} samples", ",".join(f"{b}x{s}" for b, s in self.sessions),
                                   samples=run.size, batch=run.batch)
        fetched = names(session)
        outputs = dict(zip(fetched, engine.infer_session(session, feed, fetched)))
        engine.stats.rows += len(run.rows)
        engine.stats.spare_rows += run.batch - len(run.rows)
        return outputs

    def key_of(self, runner: SessionRunner) -> Key | None:
        return next((key for key, s in self.sessions.items() if s is runner), None)

    def runner_at(self, key: Key) -> SessionRunner | None:
        """The runner at `key`; an open shape (CPU) gets one again."""
        runner = self.sessions.get(key)
        if runner is None and self.engine.policy.step:
            runner = open_runner(self.sessions, key, key[0], key[1], self.engine.stats)
        return runner
