"""Qwen3-ASR as the engine's third family: its three sessions at the manifest's fixed shapes.

The engine (pipeline/engine.py) keeps its contract: load() creates and warms every session, a clip that
outgrows the container is an InferenceError, each session run goes through the engine's counted,
fault-checked `_infer`. What differs from the one-graph families: one container (the export's, a whole
number of attention windows), batch 1, and three sessions (encoder, prefill, step) instead of a grid;
every free axis is fixed by a free-dimension override, so no call can run at a shape that was not warmed.
A clip is decoded greedily (pipeline/qwen3_decoding.py) and its tokens become a Transcript
(pipeline/qwen3_text.py). A partial decodes the open segment like a final.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .decoding import Transcript
from .errors import ModelLoadError
from .modeldir import ModelDirectory
from .providers import ProviderConfig, SessionRunner
from .qwen3_decoding import ENCODER, GRAPHS, PREFILL, Qwen3Decoder, Qwen3Shapes, serving_overrides
from .qwen3_text import qwen3_transcript
from .sessions import SharedWeights, create_session, load_shared_weights

ARCHITECTURE = "qwen3-asr"
# Exports name prefill's and step's weights by their content (export/qwen3_asr.py), so a name both graphs
# hold is the same tensor and is loaded once; older exports' names (val_N) coincide by chance only.
CONTENT_NAME_PREFIX = "sha1_"
WARMUP_TOKENS = 2  # prefill's token and one step: every graph runs once


def create_qwen3_sessions(model: ModelDirectory, precision: str, config: ProviderConfig, threads: int,
                          device_id: int, share_weights: bool = True) -> dict[str, SessionRunner]:
    """Graph name -> its session, every free axis fixed at the manifest's shapes; on the CPU prefill and
    step use one copy of the decoder's weights that no kernel prepacks (ONNX Runtime ignores a shared name
    a graph lacks)."""
    graphs = model.manifest.graphs.get(precision)
    if not graphs or set(graphs) != set(GRAPHS):
        raise ModelLoadError(f"{model.path}: the manifest names no {precision} {', '.join(GRAPHS)} graphs",
                             precision=precision)
    dims = model.manifest.dimensions
    shapes, overrides = Qwen3Shapes.from_dimensions(dims), serving_overrides(dims)
    decoder: SharedWeights = {}
    if share_weights and config.device == "cpu":  # add_initializer keeps host arrays
        # Not the MatMul weights: each session prepacks its own (shared, they ran unpacked: a quarter slower
        # per token); the rest, mostly the 0.6 GB token embedding, is one copy (docs/benchmarks.md).
        weights = load_shared_weights(model.path / graphs[PREFILL], skip_prepacked=True)
        decoder = {name: weight for name, weight in weights.items() if name.startswith(CONTENT_NAME_PREFIX)}
    return {graph: create_session(model.path / graphs[graph], 1, shapes.container_samples, config, threads,
                                  {} if graph == ENCODER else decoder, device_id, ARCHITECTURE, graph=graph,
                                  overrides=overrides[graph], prepack=True)
            for graph in GRAPHS}


class GraphRun:
    """ONNX Runtime's `run(names, feed)` for Qwen3Decoder, through one of the engine's runs."""

    def __init__(self, runner: SessionRunner, infer: Callable) -> None:
        self.runner, self.infer = runner, infer

    def run(self, _names, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.infer(self.runner, feed, self.runner.output_names)


def qwen3_decoder(model: ModelDirectory, sessions: dict[str, SessionRunner], infer: Callable) -> Qwen3Decoder:
    dims = model.manifest.dimensions
    return Qwen3Decoder({g: GraphRun(s, infer) for g, s in sessions.items()}, dims["prompt"],
                        Qwen3Shapes.from_dimensions(dims))


def warm_up_qwen3(model: ModelDirectory, sessions: dict[str, SessionRunner], infer: Callable, fill: float) -> None:
    """Run encoder, prefill and one step at their shapes (a clip of `fill` x the container, zeros) through
    the engine's warming `infer`; then every session is warmed."""
    decoder = qwen3_decoder(model, sessions, infer)
    container = np.zeros((1, decoder.shapes.container_samples), np.float32)
    decoder.decode_container(container, int(decoder.shapes.container_samples * fill), WARMUP_TOKENS,
                             ignore_eos=True)
    for session in sessions.values():
        session.warmed = True


def transcribe_qwen3(model: ModelDirectory, sessions: dict[str, SessionRunner], infer: Callable,
                     audio: np.ndarray) -> Transcript:
    """One clip (it fits the container) decoded greedily through the engine's `infer`; no token times."""
    return qwen3_transcript(qwen3_decoder(model, sessions, infer).decode(audio).tokens, model.tokens)
