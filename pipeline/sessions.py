"""Creating the engine's ONNX Runtime sessions: one per (batch size, container) pair of the grid, and for a
Paraformer's decoder one per (container, token container) (pipeline/families/paraformer/stages.py).

    SessionOptions   intra-op threads, sequential execution, every free dimension fixed with
                     add_free_dimension_override_by_name (batch = the row count, samples = the container),
                     the provider's session entries; on CPU, shared weights via add_initializer
    check            inputs and outputs are the model directory's signature (pipeline/modeldir.py), with
                     or without the in-graph decoding outputs, and no input dimension stayed free
    SessionRunner    (pipeline/providers.py) runs it plainly or through IO binding

Weight sharing: with several sessions on the CPU, the weights are read once (pipeline/initializers.py)
and handed to every session, so the grid costs one copy of the weights plus each session's activations.
"""
from __future__ import annotations

import ctypes
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnxruntime as ort

from .errors import ModelLoadError, ProviderError
from .initializers import read_initializers
from .audio import encoder_frames
from .modeldir import DECODER_FREE_DIMENSIONS, FREE_DIMENSIONS
from .providers import ProviderConfig, SessionRunner

log = logging.getLogger(__name__)

SharedWeights = dict[str, tuple[np.ndarray, ort.OrtValue]]  # the arrays must outlive the sessions


def load_shared_weights(path: Path, skip_prepacked: bool = False) -> SharedWeights:
    """The graph's initializers as OrtValues to share between sessions (read_initializers); {} when they
    cannot be read."""
    try:
        arrays = read_initializers(path, skip_prepacked=skip_prepacked)
    except (OSError, ValueError, KeyError) as exc:
        log.warning("cannot read the weights of %s for sharing (%s); one copy per session", path, exc)
        return {}
    return {name: (a, ort.OrtValue.ortvalue_from_numpy(a)) for name, a in arrays.items()}


def free_dimensions(batch: int, size: int, tokens: int = 0) -> dict[str, int]:
    """The overrides that fix every free dimension: batch and samples, or for a Paraformer decoder
    (`tokens` > 0) batch, the container's encoder frames and the token rows; only the batch with size 0."""
    if not size:
        return {FREE_DIMENSIONS[0]: batch}
    if tokens:
        return dict(zip(DECODER_FREE_DIMENSIONS, (batch, encoder_frames(size), tokens)))
    return dict(zip(FREE_DIMENSIONS, (batch, size)))


def session_options(batch: int, size: int, config: ProviderConfig, threads: int, shared: SharedWeights,
                    tokens: int = 0, overrides: dict[str, int] | None = None,
                    prepack: bool = False) -> ort.SessionOptions:
    """`overrides`: sizes of free axes named otherwise (the several graphs of Qwen3-ASR); `prepack`: the
    shared weights include none that a kernel prepacks (load_shared_weights(skip_prepacked=True)), so the
    session's own weights are prepacked as without sharing."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.enable_mem_pattern = config.enable_mem_pattern
    for name, value in {**free_dimensions(batch, size, tokens), **(overrides or {})}.items():
        so.add_free_dimension_override_by_name(name, value)
    for key, value in config.session_config.items():
        so.add_session_config_entry(key, value)
    if shared and not prepack:
        # Prepacking would give every session its own packed copy of each shared weight (measured: sharing
        # with prepacking used more memory than no sharing at all), so shared weights stay unpacked.
        so.add_session_config_entry("session.disable_prepacking", "1")
    if shared:
        for name, (_, value) in shared.items():
            so.add_initializer(name, value)
    return so


def create_session(path: Path, batch: int, size: int, config: ProviderConfig, threads: int,
                   shared: SharedWeights, device_id: int, family: Any, tokens: int = 0, graph: str = "",
                   overrides: dict[str, int] | None = None, prepack: bool = False) -> SessionRunner:
    """One session of `family`'s (a pipeline.families Family) graph (`tokens` > 0: a Paraformer decoder's, for that many token rows; `size` 0: one
    session for every shape of the grid, see runner_on; `graph` and `overrides`: which graph of a several-graph
    family, and its free axes' sizes; `prepack`: see session_options); ModelLoadError (the graph) or
    ProviderError (the device) when it fails."""
    try:
        session = ort.InferenceSession(str(path), session_options(batch, size, config, threads, shared, tokens,
                                                                  overrides, prepack),
                                       providers=list(config.providers),
                                       provider_options=list(config.provider_options))
    except Exception as exc:  # ORT raises its own classes (InvalidProtobuf, Fail, EPFail, ...)
        if config.device != "cpu":
            raise ProviderError(f"{config.provider} failed to create a session: {exc}", device=config.device) from exc
        raise ModelLoadError(f"{path}: ONNX Runtime cannot load it: {exc}", path=str(path)) from exc
    started = session.get_providers()[0]
    if started != config.provider:  # a provider that fails to initialise only warns
        raise ProviderError(f"{config.device} requested, but ONNX Runtime started {started} instead of "
                            f"{config.provider} (see its warnings above)", device=config.device)
    if config.device != "cpu":
        session.disable_fallback()  # a GPU failure must raise (we rebuild), not silently run on CPU
    check_signature(session, path, family, graph or ("decoder" if tokens > 0 else ""), fixed=bool(size))
    runner = SessionRunner(session, batch, size, config, device_id)
    runner.weights = shared  # the session reads these arrays in place: they live as long as it does
    return runner


def runner_on(runner: SessionRunner, batch: int, size: int) -> SessionRunner:
    """Another runner, for one shape of the grid, on `runner`'s session (created with size 0: only the
    batch fixed). On the CPU, which compiles nothing per shape, one session then serves every shape of a
    graph: calls still come only in the grid's shapes, each warmed through its own runner, and the session
    holds one prepacked copy of the weights. Weights shared with add_initializer instead cannot be
    prepacked, so every run repacks them (measured, full-size Paraformer int8 on 2 cores: a 1 s clip's
    encoder 0.077 s against 0.049 s; fp32 loses more)."""
    return SessionRunner(runner.session, batch, size, runner.config, runner.device_id)


def open_runner(runners: dict, key: tuple, batch: int, size: int, stats) -> SessionRunner:
    """A runner for a shape no one warmed, on the one session all of `runners` share (open shapes, CPU only:
    pipeline/shapes.py), kept in `runners` under `key` and counted in stats.cold_shape_calls."""
    runner = runners[key] = runner_on(next(iter(runners.values())), batch, size)
    runner.warmed = True  # the CPU provider compiles nothing for a shape: its first run is an ordinary run
    stats.cold_shape_calls += 1
    return runner


def check_signature(session: ort.InferenceSession, path: Path, family: Any, graph: str = "",
                    fixed: bool = True) -> None:
    """ModelLoadError unless the session's inputs and outputs are `graph`'s of `family` (a pipeline.families
    Family), and, `fixed`, no input dimension escaped the overrides."""
    inputs = {i.name: i.shape for i in session.get_inputs()}
    outputs = [o.name for o in session.get_outputs()]
    input_names, output_names = family.signature(graph)
    optional = family.optional_outputs
    if set(inputs) != set(input_names) or set(outputs) not in (set(output_names), set(output_names) | set(optional)):
        raise ModelLoadError(f"{path}: inputs {sorted(inputs)} and outputs {outputs} are not "
                             f"{list(input_names)} -> {list(output_names)}"
                             + (f" (plus, optionally, {list(optional)})" if optional else ""), path=str(path))
    free = {name: shape for name, shape in inputs.items() if not all(isinstance(d, int) for d in shape)}
    if free and fixed:  # a dimension not named batch/samples escaped the overrides: shapes would not be static
        raise ModelLoadError(f"{path}: inputs with free dimensions other than "
                             f"{DECODER_FREE_DIMENSIONS if graph == 'decoder' else FREE_DIMENSIONS}: {free}")


def release_free_memory() -> None:
    """Hand freed heap memory back to the OS (glibc only). Loading parses each graph once per session;
    glibc keeps those freed buffers, which showed as 2-3x the weights in RSS after load (measured)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: nothing to do


def process_rss() -> int | None:
    """This process's resident set size in bytes (Linux /proc; None where unknown)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def footprint(device_probe: Callable[[], int | None] | None = None) -> tuple[float, int | None, int | None]:
    """(now in seconds, this process's resident bytes, the device's bytes in use per `device_probe`), for
    EngineStats.note_session."""
    return time.perf_counter(), process_rss(), device_probe() if device_probe is not None else None
