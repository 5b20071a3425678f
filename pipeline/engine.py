"""The inference engine: a model directory's sessions on one device, warmed at fixed shapes, run by one thread.

    Engine(model_dir, EngineOptions).load()
        provider    auto: CUDA, then DirectML, then CPU (pipeline/providers.py); an explicit device that
                    cannot start raises ProviderError, auto falls back with a warning
        precision   auto: int8 on CPU when exported, fp16 on GPUs when exported, else fp32
        family      the manifest's architecture (pipeline/families): its Runtime builds the sessions (SenseVoice
                    and a Paraformer's first stage on the grid of (batch size, container) pairs, pipeline/grid.py;
                    a Paraformer's decoder per token container; Qwen3-ASR's three graphs on a ladder), warms them,
                    runs and decodes; the engine hands it `infer_session` for every run
        warm-up     each session runs once with exactly its shape before the engine is ready
        CUDA graphs where the family replays them by default (SenseVoice) or when asked
                    (engine_options.replays_cuda_graphs), captured in the warm-up; plain runs where the capture fails
    engine.infer([Clip], topk=False, full=False) -> [ClipOutput]   per-frame outputs (Family.per_frame_outputs);
                a clip's output does not depend on its batch-mates
    engine.transcribe_many([Clip], offsets) -> [Transcript];  engine.transcribe(audio, ...) -> Transcript
    engine.run(audio float32 [n]) -> (logprobs float32 [frames, vocab], valid frames)   (CTC models)
    engine.transcribe(..., hotwords=engine.hotword_graph(words))   the family's use of hotwords (a CTC beam
                search biased to them, or Qwen3-ASR's prompt context)

The engine is synchronous and thread-confined: the server runs it on its one worker thread. The one exception
is `hotword_graph`, which the server calls on its event loop when a stream starts: it reads only the model's
tokens, never a session (a few hundred hotwords spell in milliseconds).
A call whose padded shape no session was warmed with is refused (UnwarmedShapeError) and counted: on
DirectML it would compile throwaway kernels on every such call (open shapes on the CPU run, counted as cold).
Errors: ModelLoadError (directory, graph), ProviderError (explicit device), InferenceError (a run),
ProtocolError code "bad_start" (a language the model does not know; the server should check it with
`language_id` when a stream starts).
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import onnxruntime as ort

from . import recovery
from .batching import Clip, ClipOutput, Run, pack
from .engine_options import (INT8_DRIFT_WARNING, PRECISION_CHOICES, EngineOptions, EngineStats, choose_precision,
                             default_containers, int8_drifts, replays_cuda_graphs)
from .errors import InferenceError, ProtocolError, ProviderError, UnwarmedShapeError, quoted
from .families import Family, Runtime, family_for
from .families.sensevoice.beam_search import DEFAULT_BEAM
from .hotwords import Hotword
from .modeldir import OUTPUT_NAMES, read_model_directory
from .providers import PROVIDERS, SessionRunner, devices_to_try, is_device_failure, provider_config
from .sessions import process_rss, release_free_memory
from .shapes import ShapePolicy
from .transcript import Transcript

__all__ = ["PRECISION_CHOICES", "WARMUP_FILL", "Engine", "EngineOptions", "EngineStats", "choose_precision",
           "default_containers"]

log = logging.getLogger(__name__)

WARMUP_FILL = 0.75  # warm-up length as a fraction of the container: a typical clip, not an empty one


class Engine:
    """Runs the model of one model directory on fixed shapes. Call load() before use."""

    warmup_fill = WARMUP_FILL

    def __init__(self, model_dir: str | Path, options: EngineOptions = EngineOptions()) -> None:
        self.options = options
        self.model = read_model_directory(model_dir)  # ModelLoadError when missing or invalid
        self.family: Family = family_for(self.model)  # ModelLoadError when no family serves it
        self.stats = EngineStats()
        # Called with the call number (1, 2, ...) before each run; raising there is a real inference failure
        # (tests use it to inject faults).
        self.fault_hook: Callable[[int], None] | None = None
        # Bytes in use on the device, read around each session's creation and warm-up (bench: nvidia-smi).
        self.memory_probe: Callable[[], int | None] | None = None
        self.device: str | None = None
        self.cuda_graph = False  # whether the sessions replay CUDA graphs (engine_options.replays_cuda_graphs)
        self.provider: str | None = None
        self.precision: str | None = None
        self.runtime: Runtime = self.family.runtime_class()(self)  # the family's half, made anew by each build

    # ---- loading ------------------------------------------------------------------------------------

    def load(self, warm_up: bool = True) -> Engine:
        """Create every session on the chosen provider and warm each one (see module doc).

        `warm_up=False` leaves the engine not ready (every run refused): only for tests and measurements.
        """
        start, self.stats.rss_before_load = time.perf_counter(), process_rss()
        devices = devices_to_try(self.options.device)
        for i, device in enumerate(devices):
            try:
                self._build_and_warm(device, warm_up)
                break
            except (ProviderError, InferenceError) as exc:
                if self.options.device != "auto" or device == "cpu" or i == len(devices) - 1:
                    raise
                log.warning("%s could not run the model (%s); falling back to %s", PROVIDERS[device], exc,
                            devices[i + 1])
        release_free_memory()
        self.stats.load_seconds = time.perf_counter() - start
        self.stats.rss_after_load = process_rss()
        return self

    def _build(self, device: str, graphs: bool = True) -> None:
        """Create the family's sessions on `device` (replacing any existing ones); `graphs` False: no CUDA
        graphs, whatever the options."""
        self.stats.shared_weight_bytes, self.stats.session_rss = 0, {}
        drifts = int8_drifts(self.model.manifest, device)
        precision = choose_precision(self.options.precision, device, self.model.manifest.files, drifts)
        if drifts:
            log.warning(INT8_DRIFT_WARNING, self.model.path, precision)
        self.model.onnx_path(precision)  # ModelLoadError when that precision was not exported
        if precision == "fp16" and device == "cpu":
            log.warning("fp16 graph on the CPU provider: many operators lack fp16 CPU kernels (slow)")
        self.cuda_graph = graphs and replays_cuda_graphs(self.options, device, self.family)
        config = provider_config(device, self.options.device_id, self.cuda_graph,
                                 self.options.allow_tf32, self.options.dml_performance_preference,
                                 cpu_spin_us=self.options.cpu_spin_us)
        self.runtime = self.family.runtime_class()(self)
        described = self.runtime.build(device, precision, config)
        self.device, self.provider, self.precision = device, config.provider, precision
        log.info("engine: %s%s, %s", self.provider, " with CUDA graphs" if self.cuda_graph else "", described)

    def _build_and_warm(self, device: str, warm_up: bool) -> None:
        """_build and warm_up (a GPU that starts but cannot run fails there); where CUDA graphs were on by
        default and fail (a node the provider places on the CPU: no capture), the sessions again without them."""
        for graphs in (True, False):
            try:
                self._build(device, graphs)
                if warm_up:
                    self.warm_up()
                return
            except (ProviderError, InferenceError) as exc:
                if not self.cuda_graph or self.options.cuda_graph is not None:
                    raise
                log.warning("CUDA graphs failed (%s); running the sessions without them", exc)

    def warm_up(self) -> None:
        """Run each session once with exactly its shape; afterwards the engine is ready."""
        self.runtime.warm_up()

    def rebuild(self, device: str | None = None) -> None:
        """Drop every session and create and warm them again (on `device`, default the current one)."""
        device = device or self.device or "cpu"
        log.warning("rebuilding the engine's sessions on %s (was %s)", device, self.provider)
        self._build_and_warm(device, True)
        release_free_memory()
        self.stats.rebuilds += 1

    # ---- state ------------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self.runtime.ready

    @property
    def policy(self) -> ShapePolicy | None:
        """The audio containers (pipeline/shapes.py); None before load."""
        return self.runtime.policy

    @property
    def containers(self) -> tuple[float, ...]:
        """Container lengths in seconds (empty before load)."""
        return self.policy.containers if self.policy else ()

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        return self.runtime.batch_sizes

    @property
    def in_graph_decoding(self) -> bool:
        """Whether the graph outputs best ids and top-k (pipeline/modeldir.py DECODING_OUTPUT_NAMES)."""
        return self.runtime.in_graph_decoding

    @property
    def grid(self) -> tuple[tuple[int, int], ...]:
        """The warmed (batch, container samples) shapes, the only ones a caller may plan runs in."""
        return self.runtime.grid

    def session_for(self, size: int, batch: int = 1) -> ort.InferenceSession:
        """The ONNX Runtime session of `batch` rows of `size` samples on the grid (for inspection and tests)."""
        return self.runtime.session_for(size, batch)

    def language_id(self, language: str) -> int:
        """The prompt id of a language code; ProtocolError("bad_start") when the model does not know it."""
        languages = self.model.manifest.languages
        if language not in languages:
            raise ProtocolError(f"unknown language {quoted(language)}; this model knows {', '.join(languages)}",
                                code="bad_start", language=quoted(language))
        return int(languages[language])

    def textnorm_id(self, itn: bool) -> int:
        return int(self.model.manifest.textnorms["withitn" if itn else "woitn"])

    # ---- inference ----------------------------------------------------------------------------------

    def infer(self, clips: Sequence[Clip], topk: bool = False, full: bool = False,
              batch: int | None = None) -> list[ClipOutput]:
        """Run clips together: grouped by container, packed into the grid's batch sizes (spare rows are
        silence), one ClipOutput per clip in order. `topk`: also the per-frame top-k ids and log-probs;
        `full`: also the full log-probs [frames, vocab]. A Paraformer gives a ParaformerOutput per clip.
        `batch`: the clips share one container and run in one call of this many rows (a run the caller
        planned, pipeline/planner.py); else the engine splits them (batching.plan_batches).
        Any failure raises for the whole call (the caller may retry clip by clip)."""
        if self.policy is None:
            raise InferenceError("the engine is not loaded; call load() first")
        return self.runtime.infer(clips, topk, full, batch)

    def run(self, audio: np.ndarray, language: str = "auto", itn: bool = False) -> tuple[np.ndarray, int]:
        """audio float32 [n] at SAMPLE_RATE -> (logprobs float32 [frames, vocab], valid frames) (CTC models).

        The clip is zero-padded into the smallest container that holds it; the graph gets its true length.
        """
        out = self.infer([Clip(audio, language, itn)], full=True)[0]
        return out.logprobs, out.length  # type: ignore[return-value]

    def run_padded(self, padded: np.ndarray, length: int, language_id: int, textnorm_id: int) -> tuple[np.ndarray, int]:
        """Run one already padded clip, float32 [samples] with `length` valid samples, batch 1 (CTC models);
        `samples` must be a warmed container, else UnwarmedShapeError (counted and logged)."""
        if not self.family.per_frame_outputs or self.policy is None:
            raise InferenceError(f"run_padded needs a loaded model with per-frame outputs ({self.family.architecture})")
        feed = pack([padded[:length]], [(language_id, textnorm_id)], 1, len(padded))
        feed["audio"][0] = padded  # the padding as given (callers test that it does not matter)
        outputs = self.runtime.sessions.run(Run(1, len(padded), (0,)), feed, lambda _: OUTPUT_NAMES)
        return outputs[OUTPUT_NAMES[0]][0], int(outputs[OUTPUT_NAMES[1]][0])

    def transcribe_many(self, clips: Sequence[Clip], offsets: Sequence[float] | None = None,
                        batch: int | None = None) -> list[Transcript]:
        """Each clip decoded by its family (`batch`: see infer()): CTC greedily, or for a clip with hotwords a
        beam search biased towards them; token times are seconds from each clip's offset (its first sample)."""
        if self.policy is None:
            raise InferenceError("the engine is not loaded; call load() first")
        return self.runtime.transcribe_many(clips, offsets if offsets is not None else [0.0] * len(clips), batch)

    def transcribe(self, audio: np.ndarray, language: str = "auto", itn: bool = False, offset: float = 0.0,
                   hotwords: Any = None, beam: int = DEFAULT_BEAM) -> Transcript:
        """One clip through transcribe_many(); `hotwords` from hotword_graph()."""
        return self.transcribe_many([Clip(audio, language, itn, hotwords, beam)], [offset])[0]

    def hotword_graph(self, hotwords: tuple[Hotword, ...], prompt: str = "") -> Any:
        """What the family decodes `hotwords` (and an OpenAI request's `prompt`) with, None for none;
        ProtocolError bad_start if one cannot be taken (a word the model cannot spell, a family without
        hotwords). Called on the server's event loop when a stream starts, beside the worker's runs: it reads
        only the model's tokens (a CTC model's speller, Qwen3-ASR's tokenizer), never a session."""
        return self.runtime.hotword_graph(hotwords, prompt)

    def refuse_unwarmed(self, shape: str, grid: str, **details) -> None:
        """Count and refuse a call of a shape no session was warmed with."""
        self.stats.unwarmed_calls += 1
        self.stats.failures += 1
        log.error("refused a call of %s: no session warmed with that shape (grid %s)", shape, grid)
        raise UnwarmedShapeError(f"no session was warmed for {shape}", **details)

    def infer_session(self, session: SessionRunner, feed: dict[str, np.ndarray], names: tuple[str, ...],
                      warming: bool = False, recover: bool = True) -> list[np.ndarray]:
        """One run of one session, the only way a family runs one: counted (not while `warming`), through the
        fault hook, and on a device failure the engine is rebuilt and the run retried once (pipeline/recovery.py)."""
        if not warming:
            self.stats.calls += 1
        t = time.perf_counter()
        try:
            if self.fault_hook is not None and not warming:
                self.fault_hook(self.stats.calls)
            outputs = session.run(feed, names)
        except Exception as exc:
            self.stats.failures += 1
            # A device failure (lost GPU, out of memory) rebuilds every session; on CPU too, where a fresh
            # session frees a poisoned arena. The retry runs with recover=False: one rebuild per call.
            if recover and not warming and is_device_failure(exc):
                return recovery.recover(self, session, feed, names, exc)
            raise InferenceError(f"inference on {self.provider} failed: {exc}", container=session.size,
                                 batch=session.batch) from exc
        elapsed = time.perf_counter() - t
        if not warming:
            self.stats.inference_seconds += elapsed
            self.stats.last_inference_seconds = elapsed
            self.stats.last_container, self.stats.last_batch = session.size, session.batch
        return outputs
