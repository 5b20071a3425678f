"""The inference engine: one warmed-up ONNX Runtime session per (batch size, container) pair.

    Engine(model_dir, EngineOptions).load()
        provider    auto: CUDA, then DirectML, then CPU (pipeline/providers.py); an explicit device that
                    cannot start raises ProviderError, auto falls back with a warning
        precision   auto: int8 on CPU when exported, fp16 on GPUs when exported, else fp32
        grid        batch sizes (pipeline/batching.py: 1,4,16 on GPUs, 1 on CPU; int8 always 1) x
                    containers (pipeline/shapes.py); each pair is one session (pipeline/sessions.py) with
                    every free dimension fixed; on CPU the weights are loaded once and shared
        Paraformer  two stages (pipeline/paraformer_stages.py): the grid runs encoder + CIF; then the decoder
                    on the token container that holds the CIF count, one session per (container, token
                    container), all created and warmed with the grid; on the CPU open shapes instead
                    (pipeline/shapes.py): each clip at its own length, only the largest container warmed
        warm-up     each session runs once with exactly its shape before the engine is ready
        CUDA graphs SenseVoice's sessions on CUDA capture theirs in the warm-up and replay it (unless told
                    not to; engine_options.replays_cuda_graphs), plain runs where the capture fails
    engine.infer([Clip], topk=False, full=False) -> [ClipOutput]   clips grouped by container, packed
                into the grid's batches; a clip's output does not depend on its batch-mates
    engine.transcribe_many([Clip], offsets) -> [Transcript];  engine.transcribe(audio, ...) -> Transcript
    engine.run(audio float32 [n]) -> (logprobs float32 [frames, vocab], valid frames)
    engine.transcribe(..., hotwords=engine.hotword_graph(words))   beam search biased to the hotwords
                (Clip.hotwords in transcribe_many; it decodes the graph's top-k, or the host's for old graphs)

Qwen3-ASR (manifest architecture "qwen3-asr", pipeline/qwen3_engine.py): three graphs (encoder, prefill,
step), batch 1, on a ladder of containers (the CPU's, its step cache growing) or the export's one (GPUs);
transcribe_many decodes each clip greedily in the smallest container that holds it.
Graphs with in-graph decoding (pipeline/modeldir.py) return per-frame best ids and top-k; the host then
receives the full [frames, vocab] log-probs only when a caller asks (`full=True`, run()).
The engine is synchronous and thread-confined: the server calls it from its one worker thread.
A call whose padded shape no session was warmed with is refused (UnwarmedShapeError) and counted: on
DirectML it would compile throwaway kernels on every such call (open shapes on the CPU run, counted as cold).
Errors: ModelLoadError (directory, graph), ProviderError (explicit device), InferenceError (a run),
ProtocolError code "bad_start" (a language the model does not know; the server should check it with
`language_id` when a stream starts).
"""
from __future__ import annotations

import functools
import logging
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import onnxruntime as ort

from .audio import samples_to_seconds
from .batching import (CALL_OVERHEAD_ROWS, Clip, ClipOutput, Run, choose_batch_sizes, output_names, pack, plan_batches,
                       planned_run, unpack)
from .beam_search import DEFAULT_BEAM, beam_search
from .decoding import decode_ids
from .transcript import Transcript
from . import recovery
from .errors import InferenceError, ModelLoadError, ProtocolError, ProviderError, UnwarmedShapeError, quoted
from .hotwords import ContextGraph, Hotword, Speller, check_model_takes_hotwords
from .engine_options import (INT8_DRIFT_WARNING, PRECISION_CHOICES, EngineOptions, EngineStats, choose_precision,
                             default_containers, int8_drifts, one_session_per_graph, replays_cuda_graphs,
                             shape_plan)
from .modeldir import DECODING_OUTPUT_NAMES, OUTPUT_NAMES, PARAFORMER_DECODER_OUTPUT_NAMES, read_model_directory
from .paraformer_decoding import ParaformerOutput, decode_paraformer
from .paraformer_stages import DecoderGrid, decoder_feed
from .qwen3_context import ContextEncoder, Qwen3Context, read_contexts
from .qwen3_engine import ARCHITECTURE as QWEN3, build_qwen3, transcribe_qwen3, warm_up_qwen3
from .providers import PROVIDERS, SessionRunner, devices_to_try, is_device_failure, provider_config
from .sessions import (create_session, footprint, load_shared_weights, open_runner, process_rss, release_free_memory,
                       runner_on)
from .shapes import ShapePolicy, format_containers

__all__ = ["PRECISION_CHOICES", "WARMUP_FILL", "Engine", "EngineOptions", "EngineStats", "choose_precision",
           "default_containers"]

log = logging.getLogger(__name__)

WARMUP_FILL = 0.75  # warm-up length as a fraction of the container: a typical clip, not an empty one


class Engine:
    """Runs the model of one model directory on a fixed grid of shapes. Call load() before use."""

    def __init__(self, model_dir: str | Path, options: EngineOptions = EngineOptions()) -> None:
        self.options = options
        self.model = read_model_directory(model_dir)  # ModelLoadError when missing or invalid
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
        self.policy: ShapePolicy | None = None
        self.batch_sizes: tuple[int, ...] = ()
        self.in_graph_decoding = False  # the graph outputs best ids and top-k (DECODING_OUTPUT_NAMES)
        self.paraformer = self.model.manifest.architecture == "paraformer"
        self.qwen3 = self.model.manifest.architecture == QWEN3  # neither: a CTC model (SenseVoice)
        self.word_times = not self.qwen3  # whether transcripts time their words (Qwen3's decoder does not)
        # (batch, container samples) -> session; a Qwen3-ASR's: (graph, container samples) -> runner
        self._sessions: dict[tuple, SessionRunner] = {}
        self._qwen3_shapes: dict = {}  # a Qwen3-ASR's container samples -> its Qwen3Shapes
        self._shared: dict = {}  # weights shared by the CPU sessions; must outlive them
        self._decoder: DecoderGrid | None = None  # a Paraformer's second stage (pipeline/paraformer_stages.py)
        self._speller: Speller | None = None  # hotword spelling, made on first use
        self._contexts: ContextEncoder | None = None  # a Qwen3-ASR's hotwords as its prompt's context

    # ---- loading ------------------------------------------------------------------------------------

    def load(self, warm_up: bool = True) -> Engine:
        """Create every session of the grid on the chosen provider and warm each one (see module doc).

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
        """Create the sessions of the whole grid on `device` (replacing any existing ones); `graphs` False: no
        CUDA graphs, whatever the options."""
        self._sessions, self._shared, self._decoder = {}, {}, None
        self.stats.shared_weight_bytes, self.stats.session_rss = 0, {}
        drifts = int8_drifts(self.model.manifest, device)
        precision = choose_precision(self.options.precision, device, self.model.manifest.files, drifts)
        if drifts:
            log.warning(INT8_DRIFT_WARNING, self.model.path, precision)
        path = self.model.onnx_path(precision)  # ModelLoadError when that precision was not exported
        if precision == "fp16" and device == "cpu":
            log.warning("fp16 graph on the CPU provider: many operators lack fp16 CPU kernels (slow)")
        self.cuda_graph = graphs and replays_cuda_graphs(self.options, device, self.model.manifest.architecture)
        config = provider_config(device, self.options.device_id, self.cuda_graph,
                                 self.options.allow_tf32, self.options.dml_performance_preference,
                                 cpu_spin_us=self.options.cpu_spin_us)
        if self.qwen3:  # a ladder of whole attention windows, three graphs each (pipeline/qwen3_engine.py)
            self._sessions, self._qwen3_shapes = build_qwen3(self.model, precision, config, self.options)
            self.policy = ShapePolicy(tuple(samples_to_seconds(size) for size in self._qwen3_shapes))
            self.batch_sizes, self.device, self.provider, self.precision = (1,), device, config.provider, precision
            log.info("engine: %s, %s graphs %s, containers %s s, batch 1", self.provider, precision,
                     ", ".join(self.model.manifest.graphs[precision].values()),
                     format_containers(self.policy.containers))
            return
        policy, ladder = shape_plan(self.options, device, self.model.manifest.architecture)
        # A Paraformer runs one clip per call: its CIF rows' independence in a batch is not verified yet.
        batch_sizes = (1,) if self.paraformer else choose_batch_sizes(self.options.batch_sizes, device, precision)
        grid = [(b, size) for size in policy.sizes for b in batch_sizes]
        # A Paraformer on the CPU: one prepacked session per graph serves the grid (sessions.runner_on).
        one_session = one_session_per_graph(self.options, device, self.model.manifest.architecture)
        if self.options.share_weights and device == "cpu" and len(grid) > 1 and not one_session:
            self._shared = load_shared_weights(path)
            self.stats.shared_weight_bytes = sum(a.nbytes for a, _ in self._shared.values())

        def create(batch: int, size: int) -> SessionRunner:
            before = footprint(self.memory_probe)
            runner = create_session(path, batch, size, config, self.options.threads, self._shared,
                                    self.options.device_id or 0, self.model.manifest.architecture)
            self.stats.note_session(batch, samples_to_seconds(size), before, footprint(self.memory_probe))
            log.info("created batch %d x %.3g s in %.2f s", batch, samples_to_seconds(size), time.perf_counter() - before[0])
            return runner

        try:
            if one_session:
                base = create(1, 0)
                sessions = {key: runner_on(base, *key) for key in grid}
            else:
                sessions = {key: create(*key) for key in grid}
        except ModelLoadError:
            if not self._shared:
                raise
            log.warning("sharing weights between sessions failed; loading one copy per session")
            self._shared, self.stats.shared_weight_bytes = {}, 0
            sessions = {key: create(*key) for key in grid}
        if self.paraformer:
            self._decoder = DecoderGrid.build(self.model.onnx_path(precision, decoder=True), policy.sizes, ladder, config,
                                              self.options.threads, one_session, self.options.device_id or 0,
                                              self.stats if policy.step else None)
        self._sessions, self.policy, self.batch_sizes = sessions, policy, batch_sizes
        self.device, self.provider, self.precision = device, config.provider, precision
        first = next(iter(sessions.values()))
        self.in_graph_decoding = all(name in first.output_names for name in DECODING_OUTPUT_NAMES)
        log.info("engine: %s%s, %s graph %s, containers %s s, batch sizes %s, %s, %s", self.provider,
                 " with CUDA graphs" if self.cuda_graph else "", precision,
                 path.name, ",".join(f"{c:g}" for c in policy.containers), ",".join(map(str, batch_sizes)),
                 "decoding in the graph" if self.in_graph_decoding else "decoding on the host",
                 f"{self.stats.shared_weight_bytes / 2**20:.0f} MiB of weights shared" if self._shared
                 else "one session per graph" if one_session else "weights per session")

    def _build_and_warm(self, device: str, warm_up: bool) -> None:
        """_build and warm_up (a GPU that starts but cannot run fails there); where CUDA graphs were on by
        default and fail (a node the provider places on the CPU: no capture), the grid again without them."""
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
        if self.qwen3:
            t = time.perf_counter()
            warm_up_qwen3(self.model, self._sessions, functools.partial(self._infer, warming=True),
                          list(self._qwen3_shapes.values()), WARMUP_FILL)
            log.info("warmed encoder, prefill and step in %.2f s", time.perf_counter() - t)
            self._contexts = read_contexts(self.model)  # its tokenizer now, not on the first stream with hotwords
            return
        prompt = (self.language_id("auto"), self.textnorm_id(False))
        for (batch, size), session in self._sessions.items():
            before = footprint(self.memory_probe)
            clip = np.zeros(int(size * WARMUP_FILL), np.float32)
            feed = pack([clip] * batch, [prompt] * batch, batch, size)
            self._infer(session, feed, session.output_names, warming=True)
            session.warmed = True
            self.stats.note_session(batch, samples_to_seconds(size), before, footprint(self.memory_probe))
            log.info("warmed batch %d x %.3g s in %.2f s", batch, samples_to_seconds(size), time.perf_counter() - before[0])
        if self._decoder is not None:
            t = time.perf_counter()
            self._decoder.warm_up(self._infer, WARMUP_FILL)
            log.info("warmed %d decoder sessions in %.2f s", len(self._decoder.sessions), time.perf_counter() - t)

    def rebuild(self, device: str | None = None) -> None:
        """Drop every session of the grid and create and warm them again (on `device`, default the current one)."""
        device = device or self.device or "cpu"
        log.warning("rebuilding the engine's sessions on %s (was %s)", device, self.provider)
        self._build_and_warm(device, True)
        release_free_memory()
        self.stats.rebuilds += 1

    # ---- state ------------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return (bool(self._sessions) and all(s.warmed for s in self._sessions.values())
                and (self._decoder is None or self._decoder.warmed))

    @property
    def containers(self) -> tuple[float, ...]:
        """Container lengths in seconds (empty before load)."""
        return self.policy.containers if self.policy else ()

    @property
    def grid(self) -> tuple[tuple[int, int], ...]:
        """The warmed (batch, container samples) shapes, the only ones a caller may plan runs in."""
        if self.qwen3:
            return tuple((1, size) for size in self._qwen3_shapes) if self.ready else ()
        return tuple(key for key, session in self._sessions.items() if session.warmed)

    def session_for(self, size: int, batch: int = 1) -> ort.InferenceSession:
        """The ONNX Runtime session of `batch` rows of `size` samples (for inspection and tests)."""
        return self._sessions[(batch, size)].session

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
        planned, pipeline/planner.py); else the engine splits them (plan_batches).
        Any failure raises for the whole call (the caller may retry clip by clip)."""
        if self.policy is None:
            raise InferenceError("the engine is not loaded; call load() first")
        if self.qwen3:
            raise InferenceError("Qwen3-ASR gives no per-frame outputs: use transcribe_many()")
        audios, prompts, containers = [], [], []
        for clip in clips:
            audio = np.asarray(clip.audio, dtype=np.float32)
            if audio.ndim != 1:
                raise ValueError(f"audio must be mono [samples], got shape {audio.shape}")
            prompts.append((self.language_id(clip.language), self.textnorm_id(clip.itn)))
            try:
                containers.append(self.policy.container_for(len(audio)))
            except ValueError as exc:
                self.stats.failures += 1
                raise InferenceError(str(exc), samples=len(audio)) from None
            audios.append(audio)
        results: list[ClipOutput | None] = [None] * len(audios)
        runs = ([planned_run(containers, batch)] if batch is not None else
                plan_batches(containers, self.batch_sizes, CALL_OVERHEAD_ROWS["cpu" if self.device == "cpu" else "gpu"]))
        for run in runs:
            feed = pack([audios[i] for i in run.rows], [prompts[i] for i in run.rows], run.batch, run.size)
            outputs = self._run_batch(run, feed, topk, full)
            for row, index in enumerate(run.rows):
                results[index] = (self._decode_paraformer(outputs, row, run.size) if self.paraformer else
                                  unpack(outputs, row, topk, full, self.model.manifest.blank_id))
        return results  # type: ignore[return-value]

    def run(self, audio: np.ndarray, language: str = "auto", itn: bool = False) -> tuple[np.ndarray, int]:
        """audio float32 [n] at SAMPLE_RATE -> (logprobs float32 [frames, vocab], valid frames) (CTC models).

        The clip is zero-padded into the smallest container that holds it; the graph gets its true length.
        """
        out = self.infer([Clip(audio, language, itn)], full=True)[0]
        return out.logprobs, out.length  # type: ignore[return-value]

    def run_padded(self, padded: np.ndarray, length: int, language_id: int, textnorm_id: int) -> tuple[np.ndarray, int]:
        """Run one already padded clip, float32 [samples] with `length` valid samples, batch 1; `samples`
        must be a warmed container, else UnwarmedShapeError (counted and logged)."""
        feed = pack([padded[:length]], [(language_id, textnorm_id)], 1, len(padded))
        feed["audio"][0] = padded  # the padding as given (callers test that it does not matter)
        outputs = self._run_batch(Run(1, len(padded), (0,)), feed, topk=False, full=True)
        return outputs[OUTPUT_NAMES[0]][0], int(outputs[OUTPUT_NAMES[1]][0])

    def transcribe_many(self, clips: Sequence[Clip], offsets: Sequence[float] | None = None,
                        batch: int | None = None) -> list[Transcript]:
        """infer() (`batch`: see there) and CTC decoding: greedy, or for a clip with hotwords a prefix beam
        search over its top-k, biased towards them; token times are seconds from each clip's offset (its
        first sample). Qwen3-ASR decodes clip by clip whatever `batch` says."""
        m = self.model.manifest
        offsets = offsets if offsets is not None else [0.0] * len(clips)
        if self.qwen3:
            return [self._transcribe_qwen3(clip.audio, clip.language, clip.hotwords) for clip in clips]
        outputs = self.infer(clips, topk=any(c.hotwords is not None for c in clips), batch=batch)
        if self.paraformer:
            return [decode_paraformer(out, self.model.tokens, offset=offset) for out, offset in zip(outputs, offsets)]
        frames = dict(blank_id=m.blank_id, prompt_frames=m.prompt_frames, frame_seconds=m.output_frame_seconds)
        return [decode_ids(out.best_ids, out.length, self.model.tokens, offset=offset, **frames)
                if clip.hotwords is None else
                beam_search(out.topk_ids, out.topk_logprobs, out.length, self.model.tokens, clip.hotwords, clip.beam,
                            offset=offset, **frames)
                for clip, out, offset in zip(clips, outputs, offsets)]

    def transcribe(self, audio: np.ndarray, language: str = "auto", itn: bool = False, offset: float = 0.0,
                   hotwords: ContextGraph | None = None, beam: int = DEFAULT_BEAM) -> Transcript:
        """One clip through transcribe_many(); `hotwords` from hotword_graph()."""
        return self.transcribe_many([Clip(audio, language, itn, hotwords, beam)], [offset])[0]

    def _transcribe_qwen3(self, audio: np.ndarray, language: str, context: Qwen3Context | None = None) -> Transcript:
        """One clip through encoder, prefill and steps (pipeline/qwen3_engine.py), with the `context` of its
        hotwords (hotword_graph); no token times."""
        if not self.ready:
            raise InferenceError("the engine is not loaded and warmed; call load() first")
        audio = np.asarray(audio, dtype=np.float32)
        try:
            size = self.policy.container_for(len(audio))  # type: ignore[union-attr]
        except ValueError as exc:
            self.stats.failures += 1
            raise InferenceError(str(exc), samples=len(audio)) from None
        if not all(runner.warmed for (_, samples), runner in self._sessions.items() if samples == size):
            self._refuse_unwarmed(f"{size} samples", ",".join(map(str, self._qwen3_shapes)), samples=size)
        self.language_id(language)  # a language the model cannot be told is the caller's error
        transcript = transcribe_qwen3(self.model, self._sessions, self._infer, self._qwen3_shapes[size], audio,
                                      language, context)
        self.stats.rows += 1
        return transcript

    def _run_batch(self, run: Run, feed: dict[str, np.ndarray], topk: bool, full: bool) -> dict[str, np.ndarray]:
        session = self._sessions.get((run.batch, run.size))
        if session is None and self.policy.step:  # an open shape (CPU): the one session runs it
            session = open_runner(self._sessions, (run.batch, run.size), run.batch, run.size, self.stats)
        if session is None or not session.warmed:
            self._refuse_unwarmed(f"{run.batch} x {run.size} samples", ",".join(f"{b}x{s}" for b, s in self._sessions),
                                  samples=run.size, batch=run.batch)
        names = session.output_names if self.paraformer else output_names(self.in_graph_decoding, topk, full)
        outputs = dict(zip(names, self._infer(session, feed, names)))
        self.stats.rows += len(run.rows)
        self.stats.spare_rows += run.batch - len(run.rows)
        return outputs

    def _decode_paraformer(self, first: dict[str, np.ndarray], row: int, size: int) -> ParaformerOutput:
        """Stage two for one clip of a stage-one run: the decoder on the token container that holds its count."""
        (_, tokens), session = self._decoder.session_for(size, int(first["token_counts"][row]))
        if session is None or not session.warmed:
            self._refuse_unwarmed(f"the decoder on {tokens} tokens of {size} samples",
                                  ",".join(f"{s}/{k}" for s, k in self._decoder.sessions), samples=size, tokens=tokens)
        second = self._infer(session, decoder_feed(first, row, tokens), PARAFORMER_DECODER_OUTPUT_NAMES)
        return DecoderGrid.output(first, row, second)

    def _refuse_unwarmed(self, shape: str, grid: str, **details) -> None:
        """Count and refuse a call of a shape no session was warmed with."""
        self.stats.unwarmed_calls += 1
        self.stats.failures += 1
        log.error("refused a call of %s: no session warmed with that shape (grid %s)", shape, grid)
        raise UnwarmedShapeError(f"no session was warmed for {shape}", **details)

    def hotword_graph(self, hotwords: tuple[Hotword, ...], prompt: str = "") -> ContextGraph | Qwen3Context | None:
        """`hotwords` spelled with the model's tokens, None for none; ProtocolError bad_start if one cannot be
        or the model has no CTC output to search (Paraformer). A Qwen3-ASR takes them, and an OpenAI request's
        `prompt` (unused by the CTC models), as the context of its prompt (pipeline/qwen3_context.py)."""
        if self.qwen3:
            self._contexts = self._contexts or ContextEncoder(self.model)
            return self._contexts.context(hotwords, prompt)
        if hotwords:
            check_model_takes_hotwords(self.model)
        self._speller = self._speller or Speller(self.model.tokens)
        return ContextGraph(hotwords, self._speller) if hotwords else None

    def _infer(self, session: SessionRunner, feed: dict[str, np.ndarray], names: tuple[str, ...],
               warming: bool = False, recover: bool = True) -> list[np.ndarray]:
        if not warming:
            self.stats.calls += 1
        t = time.perf_counter()
        try:
            if self.fault_hook is not None and not warming:
                self.fault_hook(self.stats.calls)
            outputs = session.run(feed, names)
        except Exception as exc:
            self.stats.failures += 1
            # A device failure (lost GPU, out of memory) rebuilds every session of the grid; on CPU too,
            # where a fresh session frees a poisoned arena. The retry runs with recover=False: one rebuild
            # per call.
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
