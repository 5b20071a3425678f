"""Qwen3-ASR served: its three graphs on a ladder of fixed shapes (the pipeline/families Runtime contract).

The engine (pipeline/engine.py) keeps its contract: load() creates and warms every session, a clip that
outgrows the largest container is an InferenceError, each session run goes through the engine's counted,
fault-checked `infer_session`. What differs from the one-graph families: the containers are whole numbers of
attention windows up to the export's (qwen3_ladder), batch 1, and three graphs (encoder, prefill, step)
instead of one; each container has its three runners, warmed with it. On a GPU every axis is fixed at
the container's shapes, so no call runs at a shape that was not compiled; on the CPU the axes stay free
(ONNX Runtime's CPU kernels compile nothing per shape) and prefill's prompt and the step's cache follow
the clip.
A clip is decoded greedily (decoding.py) and its tokens become a Transcript (text.py), with its hotwords and
an OpenAI request's prompt as the context of its prompt (context.py). A partial decodes the open segment like
a final.
"""
from __future__ import annotations

import functools
import logging
import math
import time
from dataclasses import replace
from typing import Any, Callable, Sequence

import numpy as np

from ...audio import SAMPLE_RATE, samples_to_seconds
from ...batching import Clip
from ...engine_options import EngineOptions
from ...errors import InferenceError, ModelLoadError, ProtocolError
from ...hotwords import Hotword, read_hotwords_file
from ...modeldir import ModelDirectory
from ...providers import ProviderConfig, SessionRunner
from ...sessions import SharedWeights, create_session, load_shared_weights, runner_on
from ...shapes import ShapePolicy, format_containers
from ...transcript import Transcript
from .. import QWEN3_ASR
from .context import ContextEncoder, Qwen3Context, read_contexts
from .decoding import (ENCODER, GRAPHS, PREFILL, Qwen3Decoder, Qwen3Shapes, rung_shapes, serving_overrides,
                       window_geometry)
from .text import qwen3_transcript

log = logging.getLogger(__name__)
# Exports name prefill's and step's weights by their content (export/qwen3_asr.py), so a name both graphs
# hold is the same tensor and is loaded once; older exports' names (val_N) coincide by chance only.
CONTENT_NAME_PREFIX = "sha1_"
WARMUP_TOKENS = 2  # prefill's token and one step: every graph runs once
# On the CPU a step runs over the cache slots in use rounded up to CPU_CACHE_STEP, and prefill over the prompt
# rounded up to CPU_PROMPT_STEP: their cost grows with those lengths (0.6B int8, a 10 s clip, `bench qwen3`
# against --cache-step 0 --prompt-step 0: 34-40 ms a token against 45-47, prefill 0.31-0.33 s against
# 0.45-0.47; docs/benchmarks.md) and their logits do not depend on them. A grown cache is copied, so it
# grows in larger steps. GPUs keep the one prompt and cache they were compiled for.
CPU_CACHE_STEP, CPU_PROMPT_STEP = 64, 16


def qwen3_ladder(dims: dict, device: str, containers: tuple[float, ...] | None = None) -> list[Qwen3Shapes]:
    """The containers a clip may run in, each a whole number of attention windows, up to the export's.
    On the CPU, by default, every whole number of windows: a short clip pays for its own windows and prompt,
    not the whole container's, and decodes exactly as it would in the whole container (padding invariance:
    `verify`). Elsewhere the export's container alone: one shape to compile. `containers` (seconds) are
    rounded up to whole windows; the export's container is always one (the segmenter cuts to it). On the
    CPU prefill's prompt and the step's cache follow the clip (CPU_PROMPT_STEP, CPU_CACHE_STEP)."""
    steps = dict(cache_step=CPU_CACHE_STEP, prompt_step=CPU_PROMPT_STEP) if device == "cpu" else {}
    top = replace(Qwen3Shapes.from_dimensions(dims), **steps)
    window, _ = window_geometry(dims)
    most = top.container_samples // window
    if containers:
        counts = {min(most, max(1, math.ceil(c * SAMPLE_RATE / window))) for c in containers}
    else:
        counts = set(range(1, most)) if device == "cpu" else set()
    return [replace(rung_shapes(dims, k), **steps) for k in sorted(counts - {most})] + [top]


def create_qwen3_sessions(model: ModelDirectory, precision: str, config: ProviderConfig, threads: int,
                          device_id: int, ladder: list[Qwen3Shapes],
                          share_weights: bool = True) -> dict[tuple[str, int], SessionRunner]:
    """(graph name, container samples) -> its runner for each container of `ladder`. On the CPU one
    session per graph with free axes serves every container and cache size (it compiles nothing per shape,
    and each prepacked weight is held once; sessions.runner_on), and prefill and step use one copy of the
    decoder's weights that no kernel prepacks (ONNX Runtime ignores a shared name a graph lacks). On a GPU
    a session per graph and container, every free axis fixed at its shapes."""
    graphs = model.manifest.graphs.get(precision)
    if not graphs or set(graphs) != set(GRAPHS):
        raise ModelLoadError(f"{model.path}: the manifest names no {precision} {', '.join(GRAPHS)} graphs",
                             precision=precision)
    dims = model.manifest.dimensions
    decoder: SharedWeights = {}
    if share_weights and config.device == "cpu":  # add_initializer keeps host arrays
        # Not the MatMul weights: each session prepacks its own (shared, they ran unpacked: a quarter slower
        # per token); the rest, mostly the 0.6 GB token embedding, is one copy (docs/benchmarks.md).
        weights = load_shared_weights(model.path / graphs[PREFILL], skip_prepacked=True)
        decoder = {name: weight for name, weight in weights.items() if name.startswith(CONTENT_NAME_PREFIX)}
    runners: dict[tuple[str, int], SessionRunner] = {}
    for graph in GRAPHS:
        path, shared = model.path / graphs[graph], {} if graph == ENCODER else decoder
        if config.device == "cpu":
            base = create_session(path, 1, 0, config, threads, shared, device_id, QWEN3_ASR, graph=graph,
                                  prepack=True)
            for shapes in ladder:
                runner = runners[(graph, shapes.container_samples)] = runner_on(base, 1, shapes.container_samples)
                runner.weights = base.weights  # the shared arrays live as long as any runner
            continue
        for shapes in ladder:
            runners[(graph, shapes.container_samples)] = create_session(
                path, 1, shapes.container_samples, config, threads, shared, device_id, QWEN3_ASR, graph=graph,
                overrides=serving_overrides(dims, shapes)[graph], prepack=True)
    return runners


def build_qwen3(model: ModelDirectory, precision: str, config: ProviderConfig,
                options: EngineOptions) -> tuple[dict[tuple[str, int], SessionRunner], dict[int, Qwen3Shapes]]:
    """The engine's runners (create_qwen3_sessions) on `config`'s device and its ladder, by container samples."""
    ladder = qwen3_ladder(model.manifest.dimensions, config.device, options.containers)
    runners = create_qwen3_sessions(model, precision, config, options.threads, options.device_id or 0, ladder,
                                    options.share_weights)
    return runners, {shapes.container_samples: shapes for shapes in ladder}


class GraphRun:
    """ONNX Runtime's `run(names, feed)` for Qwen3Decoder, through one of the engine's runs."""

    def __init__(self, runner: SessionRunner, infer: Callable) -> None:
        self.runner, self.infer = runner, infer

    def run(self, _names, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.infer(self.runner, feed, self.runner.output_names)


def qwen3_decoder(model: ModelDirectory, runners: dict[tuple[str, int], SessionRunner], infer: Callable,
                  shapes: Qwen3Shapes) -> Qwen3Decoder:
    """The decoder at one container of the ladder, its runs through the engine's `infer`."""
    return Qwen3Decoder({g: GraphRun(runners[(g, shapes.container_samples)], infer) for g in GRAPHS},
                        model.manifest.dimensions["prompt"], shapes)


def warm_up_qwen3(model: ModelDirectory, runners: dict[tuple[str, int], SessionRunner], infer: Callable,
                  ladder: list[Qwen3Shapes], fill: float) -> None:
    """Run encoder, prefill and one step at each container's shapes (a clip of `fill` x the container,
    zeros) through the engine's warming `infer`; then every runner is warmed."""
    for shapes in ladder:
        decoder = qwen3_decoder(model, runners, infer, shapes)
        container = np.zeros((1, shapes.container_samples), np.float32)
        decoder.decode_container(container, int(shapes.container_samples * fill), WARMUP_TOKENS, ignore_eos=True)
    for runner in runners.values():
        runner.warmed = True


def transcribe_qwen3(model: ModelDirectory, runners: dict[tuple[str, int], SessionRunner], infer: Callable,
                     shapes: Qwen3Shapes, audio: np.ndarray, language: str = "auto",
                     context: Qwen3Context | None = None) -> Transcript:
    """One clip (it fits `shapes`' container) decoded greedily through the engine's `infer`, its language
    forced unless "auto", with `context` in its prompt (context.py); no token times."""
    forced = None if language == "auto" else language
    system = context.system if context is not None else None
    result = qwen3_decoder(model, runners, infer, shapes).decode(audio, language=forced, system=system)
    skipped = frozenset(model.manifest.dimensions["prompt"].get("special_ids", ()))
    return qwen3_transcript(result.tokens, model.tokens, forced, skipped)


class Runtime:
    """A Qwen3-ASR model's runners on its ladder, greedy decoding and prompt contexts."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.policy: ShapePolicy | None = None
        self.batch_sizes: tuple[int, ...] = ()
        self.in_graph_decoding = False
        self.runners: dict[tuple[str, int], SessionRunner] = {}  # (graph, container samples) -> runner
        self.shapes: dict[int, Qwen3Shapes] = {}  # container samples -> its shapes
        self._contexts: ContextEncoder | None = None  # hotwords and prompts as its prompt's context

    def build(self, device: str, precision: str, config: ProviderConfig) -> str:
        engine = self.engine
        self.runners, self.shapes = build_qwen3(engine.model, precision, config, engine.options)
        self.batch_sizes = (engine.family.max_batch,)  # its decoder runs one clip a call
        self.policy = ShapePolicy(tuple(samples_to_seconds(size) for size in self.shapes))
        return (f"{precision} graphs {', '.join(engine.model.manifest.graphs[precision].values())}, "
                f"containers {format_containers(self.policy.containers)} s, batch 1")

    def warm_up(self) -> None:
        t = time.perf_counter()
        engine = self.engine
        warm_up_qwen3(engine.model, self.runners, functools.partial(engine.infer_session, warming=True),
                      list(self.shapes.values()), engine.warmup_fill)
        log.info("warmed encoder, prefill and step in %.2f s", time.perf_counter() - t)
        self._contexts = read_contexts(engine.model)  # its tokenizer now, not on the first stream with hotwords

    @property
    def ready(self) -> bool:
        return bool(self.runners) and all(r.warmed for r in self.runners.values())

    @property
    def grid(self) -> tuple[tuple[int, int], ...]:
        return tuple((1, size) for size in self.shapes) if self.ready else ()

    def infer(self, clips: Sequence[Clip], topk: bool, full: bool, batch: int | None) -> list:
        raise InferenceError("Qwen3-ASR gives no per-frame outputs: use transcribe_many()")

    def transcribe_many(self, clips: Sequence[Clip], offsets: Sequence[float], batch: int | None) -> list[Transcript]:
        """Clip by clip whatever `batch` says; no token times, so no offsets."""
        return [self._transcribe(clip.audio, clip.language, clip.hotwords) for clip in clips]

    def _transcribe(self, audio: np.ndarray, language: str, context: Qwen3Context | None) -> Transcript:
        """One clip through encoder, prefill and steps in the smallest container that holds it."""
        engine = self.engine
        if not engine.ready:
            raise InferenceError("the engine is not loaded and warmed; call load() first")
        audio = np.asarray(audio, dtype=np.float32)
        try:
            size = self.policy.container_for(len(audio))
        except ValueError as exc:
            engine.stats.failures += 1
            raise InferenceError(str(exc), samples=len(audio)) from None
        if not all(runner.warmed for (_, samples), runner in self.runners.items() if samples == size):
            engine.refuse_unwarmed(f"{size} samples", ",".join(map(str, self.shapes)), samples=size)
        engine.language_id(language)  # a language the model cannot be told is the caller's error
        transcript = transcribe_qwen3(engine.model, self.runners, engine.infer_session, self.shapes[size], audio,
                                      language, context)
        engine.stats.rows += 1
        return transcript

    def hotword_graph(self, hotwords: tuple[Hotword, ...], prompt: str) -> Qwen3Context | None:
        """The hotwords and an OpenAI request's `prompt` as its prompt's context (context.py)."""
        self._contexts = self._contexts or ContextEncoder(self.engine.model)
        return self._contexts.context(hotwords, prompt)

    def key_of(self, runner: SessionRunner) -> tuple[str, int] | None:
        return next((key for key, r in self.runners.items() if r is runner), None)

    def runner_at(self, key: tuple[str, int]) -> SessionRunner | None:
        return self.runners.get(key)


def read_hotwords(path: Any, directory: ModelDirectory) -> tuple[Hotword, ...]:
    """The server-wide hotwords file as the context of its prompt (ValueError when they do not fit it): its
    byte-level tokens spell anything."""
    words = read_hotwords_file(path)
    try:
        ContextEncoder(directory).context(words)
    except ProtocolError as exc:
        raise ValueError(f"--hotwords {path}: {exc}") from None
    return words
