"""Qwen3-ASR as the engine's third family: its three graphs on a ladder of fixed shapes.

The engine (pipeline/engine.py) keeps its contract: load() creates and warms every session, a clip that
outgrows the largest container is an InferenceError, each session run goes through the engine's counted,
fault-checked `_infer`. What differs from the one-graph families: the containers are whole numbers of
attention windows up to the export's (qwen3_ladder), batch 1, and three graphs (encoder, prefill, step)
instead of one; each container has its three runners, warmed with it. On a GPU every axis is fixed at
the container's shapes, so no call runs at a shape that was not compiled; on the CPU the axes stay free
(ONNX Runtime's CPU kernels compile nothing per shape) and prefill's prompt and the step's cache follow
the clip.
A clip is decoded greedily (pipeline/qwen3_decoding.py) and its tokens become a Transcript
(pipeline/qwen3_text.py). A partial decodes the open segment like a final.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable

import numpy as np

from .audio import SAMPLE_RATE
from .transcript import Transcript
from .engine_options import EngineOptions
from .errors import ModelLoadError
from .modeldir import ModelDirectory
from .providers import ProviderConfig, SessionRunner
from .qwen3_decoding import (ENCODER, GRAPHS, PREFILL, Qwen3Decoder, Qwen3Shapes, rung_shapes, serving_overrides,
                             window_geometry)
from .qwen3_context import Qwen3Context
from .qwen3_text import qwen3_transcript
from .sessions import SharedWeights, create_session, load_shared_weights, runner_on

ARCHITECTURE = "qwen3-asr"
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
            base = create_session(path, 1, 0, config, threads, shared, device_id, ARCHITECTURE, graph=graph,
                                  prepack=True)
            for shapes in ladder:
                runner = runners[(graph, shapes.container_samples)] = runner_on(base, 1, shapes.container_samples)
                runner.weights = base.weights  # the shared arrays live as long as any runner
            continue
        for shapes in ladder:
            runners[(graph, shapes.container_samples)] = create_session(
                path, 1, shapes.container_samples, config, threads, shared, device_id, ARCHITECTURE, graph=graph,
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
    forced unless "auto", with `context` in its prompt (pipeline/qwen3_context.py); no token times."""
    forced = None if language == "auto" else language
    system = context.system if context is not None else None
    result = qwen3_decoder(model, runners, infer, shapes).decode(audio, language=forced, system=system)
    skipped = frozenset(model.manifest.dimensions["prompt"].get("special_ids", ()))
    return qwen3_transcript(result.tokens, model.tokens, forced, skipped)
