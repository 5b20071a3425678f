"""The inference engine: one warmed-up ONNX Runtime session per container shape.

    Engine(model_dir, EngineOptions).load()
        provider    auto: CUDA, then DirectML, then CPU (pipeline/providers.py); an explicit device that
                    cannot start raises ProviderError, auto falls back with a warning
        precision   auto: int8 on CPU when exported, fp16 on GPUs when exported, else fp32
        sessions    one per container (pipeline/shapes.py), every free dimension fixed with
                    add_free_dimension_override_by_name (batch=1, samples=container); on CPU with several
                    containers the weights are loaded once and shared through SessionOptions.add_initializer
        warm-up     each session runs once with exactly its shape before the engine is ready
    engine.run(audio float32 [n]) -> (logprobs float32 [frames, vocab], valid frames)
    engine.transcribe(audio, language, itn, offset) -> pipeline.decoding.Transcript
    engine.transcribe(..., hotwords=engine.hotword_graph(words))   beam search biased to the hotwords

The engine is synchronous and thread-confined: the server calls it from its one worker thread.
A call whose padded shape no session was warmed with is refused (UnwarmedShapeError) and counted: on
DirectML it would compile throwaway kernels on every such call.
Errors: ModelLoadError (directory, graph), ProviderError (explicit device), InferenceError (a run),
ProtocolError code "bad_start" (a language the model does not know; the server should check it with
`language_id` when a stream starts).
"""
from __future__ import annotations

import ctypes
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import onnxruntime as ort

from .audio import samples_to_seconds
from .beam_search import DEFAULT_BEAM, beam_search, top_k
from .decoding import Transcript, decode_ctc
from .errors import InferenceError, ModelLoadError, ProtocolError, ProviderError, UnwarmedShapeError
from .hotwords import ContextGraph, Hotword, Speller
from .initializers import read_initializers
from .modeldir import FREE_DIMENSIONS, read_model_directory, signature
from .paraformer_decoding import ParaformerOutput, decode_paraformer
from .providers import (DEVICES, PROVIDERS, ProviderConfig, SessionRunner, candidate_devices, conflicting_runtimes,
                        is_device_failure, provider_config)
from .shapes import DEFAULT_CPU_CONTAINERS, DEFAULT_GPU_CONTAINERS, ShapePolicy

log = logging.getLogger(__name__)

PRECISION_CHOICES = ("auto", "fp32", "int8", "fp16")
INSTALL_HINTS = {"cuda": "install onnxruntime-gpu instead of onnxruntime",
                 "directml": "install onnxruntime-directml instead of onnxruntime (Windows x64)", "cpu": ""}
WARMUP_FILL = 0.75  # warm-up length as a fraction of the container: a typical clip, not an empty one


@dataclass(frozen=True)
class EngineOptions:
    device: str = "auto"  # "auto" | "cpu" | "cuda" | "directml"; see providers.resolve_device for the CLI/env
    precision: str = "auto"  # "auto" | "fp32" | "int8" | "fp16"
    containers: tuple[float, ...] | None = None  # seconds; None: the provider's default (pipeline/shapes.py)
    threads: int = 0  # intra_op_num_threads; 0: ONNX Runtime's default (one per physical core)
    device_id: int | None = None  # GPU / DirectML adapter index; None: CUDA 0, DirectML by preference
    cuda_graph: bool = False  # CUDA only: capture each session's graph once and replay it (IO binding)
    dml_performance_preference: str = "high_performance"
    share_weights: bool = True  # one copy of the weights for all CPU sessions

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.precision not in PRECISION_CHOICES:
            raise ValueError(f"precision must be one of {', '.join(PRECISION_CHOICES)}, got {self.precision!r}")
        if self.containers is not None:
            ShapePolicy(self.containers)  # raises ValueError when invalid
        if self.threads < 0:
            raise ValueError(f"threads must be >= 0, got {self.threads}")


@dataclass
class EngineStats:
    """Counters of one engine (mutated only by its thread; read anywhere for metrics)."""

    calls: int = 0  # run() calls that reached a session
    failures: int = 0  # runs that raised InferenceError (the unwarmed ones included)
    unwarmed_calls: int = 0
    rebuilds: int = 0
    inference_seconds: float = 0.0  # total wall time inside ONNX Runtime
    last_inference_seconds: float = 0.0
    last_container: int = 0  # samples
    load_seconds: float = 0.0
    rss_before_load: int | None = None  # bytes, process resident set size
    rss_after_load: int | None = None
    shared_weight_bytes: int = 0  # weights held once for all sessions (0: each session has its own)


def choose_precision(requested: str, device: str, available: dict) -> str:
    """auto: int8 on CPU (an int8 graph is a CPU optimisation), fp16 on GPUs, else fp32."""
    if requested != "auto":
        return requested
    preferred = "int8" if device == "cpu" else "fp16"
    return preferred if preferred in available else "fp32"


def default_containers(device: str) -> tuple[float, ...]:
    return DEFAULT_CPU_CONTAINERS if device == "cpu" else DEFAULT_GPU_CONTAINERS


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


class Engine:
    """Runs the model of one model directory on fixed container shapes. Call load() before use."""

    def __init__(self, model_dir: str | Path, options: EngineOptions = EngineOptions()) -> None:
        self.options = options
        self.model = read_model_directory(model_dir)  # ModelLoadError when missing or invalid
        self.stats = EngineStats()
        # Called with the call number (1, 2, ...) before each run; raising there is a real inference failure
        # (tests use it to inject faults).
        self.fault_hook: Callable[[int], None] | None = None
        self.device: str | None = None
        self.provider: str | None = None
        self.precision: str | None = None
        self.policy: ShapePolicy | None = None
        self._sessions: dict[int, SessionRunner] = {}
        self._shared: dict[str, tuple[np.ndarray, ort.OrtValue]] = {}  # must outlive the sessions
        self._speller: Speller | None = None  # hotword spelling, made on first use

    # ---- loading ------------------------------------------------------------------------------------

    def load(self, warm_up: bool = True) -> Engine:
        """Create every container's session on the chosen provider and warm each one (see module doc).

        `warm_up=False` leaves the engine not ready (every run refused): only for tests and measurements.
        """
        start, self.stats.rss_before_load = time.perf_counter(), process_rss()
        conflict = conflicting_runtimes()
        if conflict:
            log.warning("%s are installed together; they overwrite each other, so the provider that loads is "
                        "an accident: uninstall all of them and install one", " and ".join(conflict))
        available = ort.get_available_providers()
        devices = candidate_devices(self.options.device, available)
        missing = [d for d in devices if PROVIDERS[d] not in available]
        if missing:  # an explicit device this build lacks (auto only lists built ones)
            raise ProviderError(
                f"{missing[0]} requested, but this onnxruntime {ort.__version__} build has only "
                f"{', '.join(available)} ({INSTALL_HINTS[missing[0]]})", device=missing[0])
        for i, device in enumerate(devices):
            try:
                self._build(device)
                if warm_up:
                    self.warm_up()  # a GPU that starts but cannot run fails here
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

    def _build(self, device: str) -> None:
        """Create the sessions of every container on `device` (replacing any existing ones)."""
        self._sessions, self._shared = {}, {}
        self.stats.shared_weight_bytes = 0
        precision = choose_precision(self.options.precision, device, self.model.manifest.files)
        path = self.model.onnx_path(precision)  # ModelLoadError when that precision was not exported
        if precision == "fp16" and device == "cpu":
            log.warning("fp16 graph on the CPU provider: many operators lack fp16 CPU kernels (slow)")
        policy = ShapePolicy(self.options.containers or default_containers(device))
        config = provider_config(device, self.options.device_id, self.options.cuda_graph and device == "cuda",
                                 self.options.dml_performance_preference)
        if self.options.share_weights and device == "cpu" and len(policy.sizes) > 1:
            self._load_shared(path)
        try:
            sessions = {size: self._create(path, size, config) for size in policy.sizes}
        except ModelLoadError:
            if not self._shared:
                raise
            log.warning("sharing weights between sessions failed; loading one copy per session")
            self._shared, self.stats.shared_weight_bytes = {}, 0
            sessions = {size: self._create(path, size, config) for size in policy.sizes}
        self._sessions, self.policy = sessions, policy
        self.device, self.provider, self.precision = device, config.provider, precision
        log.info("engine: %s, %s graph %s, containers %s s, %s", self.provider, precision, path.name,
                 ",".join(f"{c:g}" for c in policy.containers),
                 f"{self.stats.shared_weight_bytes / 2**20:.0f} MiB of weights shared" if self._shared
                 else "weights per session")

    def _load_shared(self, path: Path) -> None:
        try:
            arrays = read_initializers(path)
        except (OSError, ValueError, KeyError) as exc:
            log.warning("cannot read the weights of %s for sharing (%s); one copy per session", path, exc)
            return
        self._shared = {name: (a, ort.OrtValue.ortvalue_from_numpy(a)) for name, a in arrays.items()}
        self.stats.shared_weight_bytes = sum(a.nbytes for a in arrays.values())

    def _session_options(self, size: int, config: ProviderConfig) -> ort.SessionOptions:
        so = ort.SessionOptions()
        so.intra_op_num_threads = self.options.threads
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.enable_mem_pattern = config.enable_mem_pattern
        batch, samples = FREE_DIMENSIONS
        so.add_free_dimension_override_by_name(batch, 1)
        so.add_free_dimension_override_by_name(samples, size)
        for key, value in config.session_config.items():
            so.add_session_config_entry(key, value)
        if self._shared:
            # Prepacking would give every session its own packed copy of each weight (measured: sharing
            # with prepacking used more memory than no sharing at all), so shared weights stay unpacked.
            so.add_session_config_entry("session.disable_prepacking", "1")
            for name, (_, value) in self._shared.items():
                so.add_initializer(name, value)
        return so

    def _create(self, path: Path, size: int, config: ProviderConfig) -> SessionRunner:
        try:
            session = ort.InferenceSession(str(path), self._session_options(size, config),
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
        self._check_signature(session, path)
        return SessionRunner(session, size, config, self.options.device_id or 0)

    def _check_signature(self, session: ort.InferenceSession, path: Path) -> None:
        inputs = {i.name: i.shape for i in session.get_inputs()}
        outputs = [o.name for o in session.get_outputs()]
        input_names, output_names = signature(self.model.manifest.architecture)
        if set(inputs) != set(input_names) or set(outputs) != set(output_names):
            raise ModelLoadError(f"{path}: inputs {sorted(inputs)} and outputs {outputs} are not "
                                 f"{list(input_names)} -> {list(output_names)}", path=str(path))
        free = {name: shape for name, shape in inputs.items() if not all(isinstance(d, int) for d in shape)}
        if free:  # a dimension not named batch/samples escaped the overrides: shapes would not be static
            raise ModelLoadError(f"{path}: inputs with free dimensions other than {FREE_DIMENSIONS}: {free}")

    def warm_up(self) -> None:
        """Run each session once with exactly its container shape; afterwards the engine is ready."""
        for size, session in self._sessions.items():
            audio = np.zeros(size, np.float32)
            t = time.perf_counter()
            feed = self._feed(audio, int(size * WARMUP_FILL), self.language_id("auto"), self.textnorm_id(False))
            for _ in range(2 if session.config.io_binding else 1):  # CUDA captures its graph on run 2
                self._infer(session, feed, warming=True)
            session.warmed = True
            log.info("warmed the %.3g s container in %.2f s", samples_to_seconds(size), time.perf_counter() - t)

    def rebuild(self, device: str | None = None) -> None:
        """Drop every session and create and warm them again (on `device`, default the current one)."""
        device = device or self.device or "cpu"
        log.warning("rebuilding the engine's sessions on %s (was %s)", device, self.provider)
        self._build(device)
        self.warm_up()
        release_free_memory()
        self.stats.rebuilds += 1

    # ---- state ------------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return bool(self._sessions) and all(s.warmed for s in self._sessions.values())

    @property
    def containers(self) -> tuple[float, ...]:
        """Container lengths in seconds (empty before load)."""
        return self.policy.containers if self.policy else ()

    def session_for(self, size: int) -> ort.InferenceSession:
        """The ONNX Runtime session of the container of `size` samples (for inspection and tests)."""
        return self._sessions[size].session

    def language_id(self, language: str) -> int:
        """The prompt id of a language code; ProtocolError("bad_start") when the model does not know it."""
        languages = self.model.manifest.languages
        if language not in languages:
            raise ProtocolError(f"unknown language {language!r}; this model knows {', '.join(languages)}",
                                code="bad_start", language=language)
        return int(languages[language])

    def textnorm_id(self, itn: bool) -> int:
        return int(self.model.manifest.textnorms["withitn" if itn else "woitn"])

    # ---- inference ----------------------------------------------------------------------------------

    def run(self, audio: np.ndarray, language: str = "auto", itn: bool = False) -> tuple[np.ndarray, int]:
        """audio float32 [n] at SAMPLE_RATE -> (logprobs float32 [frames, vocab], valid frames)."""
        logprobs, lengths = self.run_outputs(audio, language, itn)[:2]
        return logprobs[0], int(lengths[0])

    def run_outputs(self, audio: np.ndarray, language: str = "auto", itn: bool = False) -> list[np.ndarray]:
        """audio float32 [n] at SAMPLE_RATE -> the graph's outputs, batch of one (SenseVoice: logprobs and
        lengths; Paraformer: pipeline/paraformer_decoding.py). The clip is zero-padded into the smallest
        container that holds it; the graph gets its true length.
        """
        audio = np.asarray(audio, dtype=np.float32)
        if audio.ndim != 1:
            raise ValueError(f"audio must be mono [samples], got shape {audio.shape}")
        lang, norm = self.language_id(language), self.textnorm_id(itn)
        if self.policy is None:
            raise InferenceError("the engine is not loaded; call load() first")
        try:
            size = self.policy.container_for(len(audio))
        except ValueError as exc:
            self.stats.failures += 1
            raise InferenceError(str(exc), samples=len(audio)) from None
        padded = np.zeros(size, np.float32)
        padded[: len(audio)] = audio
        return self.infer_padded(padded, len(audio), lang, norm)

    def run_padded(self, padded: np.ndarray, length: int, language_id: int, textnorm_id: int) -> tuple[np.ndarray, int]:
        """Run one already padded clip, float32 [samples] with `length` valid samples; `samples` must be a
        warmed container, else UnwarmedShapeError (counted and logged)."""
        logprobs, lengths = self.infer_padded(padded, length, language_id, textnorm_id)[:2]
        return logprobs[0], int(lengths[0])

    def infer_padded(self, padded: np.ndarray, length: int, language_id: int, textnorm_id: int) -> list[np.ndarray]:
        """run_padded, returning every graph output."""
        session = self._sessions.get(len(padded))
        if session is None or not session.warmed:
            self.stats.unwarmed_calls += 1
            self.stats.failures += 1
            log.error("refused a call of %d samples: no session warmed with that shape (containers %s)",
                      len(padded), ",".join(map(str, self._sessions)))
            raise UnwarmedShapeError(f"no session was warmed for {len(padded)} samples", samples=len(padded))
        return self._infer(session, self._feed(padded, length, language_id, textnorm_id))

    def hotword_graph(self, hotwords: tuple[Hotword, ...]) -> ContextGraph | None:
        """`hotwords` spelled with the model's tokens, None for none; ProtocolError bad_start if one cannot be
        or the model has no CTC output to search (Paraformer)."""
        if hotwords and self.model.manifest.architecture == "paraformer":
            raise ProtocolError("hotwords need a CTC model (SenseVoice); this model is a Paraformer", code="bad_start")
        self._speller = self._speller or Speller(self.model.tokens)
        return ContextGraph(hotwords, self._speller) if hotwords else None

    def transcribe(self, audio: np.ndarray, language: str = "auto", itn: bool = False, offset: float = 0.0,
                   hotwords: ContextGraph | None = None, beam: int = DEFAULT_BEAM) -> Transcript:
        """run() and CTC decoding: greedy, or with `hotwords` a prefix beam search biased towards them;
        token times are seconds from `offset` (the clip's first sample). Paraformer: its own decoding, as
        the manifest's architecture says."""
        m = self.model.manifest
        if m.architecture == "paraformer":
            outputs = ParaformerOutput.from_graph(self.run_outputs(audio, language, itn))
            return decode_paraformer(outputs, self.model.tokens, offset=offset)
        logprobs, length = self.run(audio, language, itn)
        if hotwords is not None:
            ids, values = top_k(logprobs, length, blank_id=m.blank_id)
            return beam_search(ids, values, length, self.model.tokens, hotwords, beam, blank_id=m.blank_id,
                               prompt_frames=m.prompt_frames, frame_seconds=m.output_frame_seconds, offset=offset)
        return decode_ctc(logprobs, length, self.model.tokens, blank_id=m.blank_id, prompt_frames=m.prompt_frames,
                          frame_seconds=m.output_frame_seconds, offset=offset)

    def _feed(self, padded: np.ndarray, length: int, language_id: int, textnorm_id: int) -> dict[str, np.ndarray]:
        feed = {"audio": padded[None, :], "audio_lengths": np.array([length], np.int32),
                "language": np.array([language_id], np.int32), "textnorm": np.array([textnorm_id], np.int32)}
        return {name: feed[name] for name in signature(self.model.manifest.architecture)[0]}

    def _infer(self, session: SessionRunner, feed: dict[str, np.ndarray], warming: bool = False,
               recover: bool = True) -> list[np.ndarray]:
        if not warming:
            self.stats.calls += 1
        t = time.perf_counter()
        try:
            if self.fault_hook is not None and not warming:
                self.fault_hook(self.stats.calls)
            outputs = session.run(feed)
        except Exception as exc:
            self.stats.failures += 1
            # A device failure (lost GPU, out of memory) rebuilds the sessions; on CPU too, where a fresh
            # session frees a poisoned arena. The retry runs with recover=False: one rebuild per call.
            if recover and not warming and is_device_failure(exc):
                return self._recover(feed, exc)
            raise InferenceError(f"inference on {self.provider} failed: {exc}", container=session.size) from exc
        elapsed = time.perf_counter() - t
        if not warming:
            self.stats.inference_seconds += elapsed
            self.stats.last_inference_seconds = elapsed
            self.stats.last_container = session.size
        return outputs

    def _recover(self, feed: dict[str, np.ndarray], exc: Exception) -> list[np.ndarray]:
        """The device failed mid-run: rebuild on the same device, else on CPU, then retry this call once."""
        log.error("%s failed (%s); rebuilding", self.provider, exc)
        try:
            self.rebuild()
        except Exception as again:  # noqa: BLE001 - any failure here means the device is gone
            log.error("rebuilding on %s failed (%s); continuing on CPU", self.device, again)
            self.rebuild("cpu")
        length = int(feed["audio_lengths"][0])
        if self.policy is None or length > self.policy.largest:
            raise InferenceError(f"inference failed and the rebuilt engine cannot hold {length} samples") from exc
        padded = np.zeros(self.policy.container_for(length), np.float32)
        padded[:length] = feed["audio"][0, :length]
        prompts = (int(feed[name][0]) if name in feed else 0 for name in ("language", "textnorm"))
        retry = self._feed(padded, length, *prompts)
        return self._infer(self._sessions[len(padded)], retry, recover=False)
