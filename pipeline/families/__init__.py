"""Model families: what the engine and the doors need to know of each, in one table.

Where a new model goes: a folder here with its runtime (building its sessions, warm-up, inference, decoding,
text and hotwords: the Runtime contract below) and one row in FAMILIES. The architecture names a manifest
carries are written here and nowhere else; every other module asks `family_of` and reads the row's
capabilities (the doors: word times, hotwords, prompt) or the constants below.

    sensevoice/   one CTC graph on the grid of (batch, container) sessions; greedy CTC or a hotword-biased
                  beam search over the graph's top-k; SenseVoice's tags
    paraformer/   encoder + CIF on the grid (batch 1), then the decoder on the token container that holds the
                  CIF count; FunASR's text and times
    qwen3_asr/    encoder, prefill and step graphs on a ladder of whole attention windows (batch 1); greedy
                  tokens, byte-level BPE text; hotwords and a prompt as the context of its prompt

The engine (pipeline/engine.py) is family-blind: providers, precision, the warm-up's contract, `infer` with
its counting, fault hook and recovery, stats, and the refusal of unwarmed shapes. It makes its family's
Runtime with itself and hands it `engine.infer_session` for every run.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

from ..errors import ModelLoadError
from ..modeldir import (DECODING_OUTPUT_NAMES, INPUT_NAMES, OUTPUT_NAMES, PARAFORMER_DECODER_INPUT_NAMES,
                        PARAFORMER_DECODER_OUTPUT_NAMES, PARAFORMER_ENCODER_OUTPUT_NAMES, PARAFORMER_INPUT_NAMES,
                        PUNCTUATION_INPUT_NAMES, PUNCTUATION_OUTPUT_NAMES, QWEN3_SIGNATURES, ModelDirectory,
                        ModelManifest)
from ..shapes import DEFAULT_CPU_CONTAINERS, DEFAULT_PARAFORMER_CPU_CONTAINERS

Signature = tuple[tuple[str, ...], tuple[str, ...]]  # input names, output names


@dataclass(frozen=True)
class Family:
    """One model family's row: its manifest name, where its runtime is, and what it can do."""

    architecture: str  # the manifest's "architecture"
    runtime: str  # the module (below this package) whose `Runtime` serves a loaded model of the family
    signatures: dict[str, Signature]  # graph name ("": the first or only graph) -> its input and output names
    word_times: bool  # transcripts time their words (a door can cut a segment's context by them)
    hotwords: bool  # takes hotwords (a CTC beam biased to them, or a prompt's context)
    prompt: bool  # takes an OpenAI request's `prompt` (as its prompt's context)
    per_frame_outputs: bool  # Engine.infer gives per-frame outputs (CTC log-probs, a Paraformer's CIF)
    max_batch: int | None  # rows one call may hold (None: the device's grid, pipeline/batching.py)
    cpu_containers: tuple[float, ...]  # the CPU's default containers (seconds; GPUs share one default)
    cuda_graphs: bool  # captures and replays CUDA graphs on CUDA unless told otherwise (engine_options)
    one_session_on_cpu: bool  # one prepacked session per graph serves every shape on the CPU (sessions.runner_on)
    export_container: bool = False  # its export's container is its largest shape: segments are cut to it
    optional_outputs: tuple[str, ...] = ()  # outputs a graph may add to its signature's (in-graph decoding)
    check: Callable[[ModelDirectory], None] | None = None  # refuses a directory this family cannot serve

    def signature(self, graph: str = "") -> Signature:
        if graph not in self.signatures:
            raise ModelLoadError(f"{self.architecture} has no graph {graph!r} (it has {', '.join(self.signatures)})")
        return self.signatures[graph]

    def runtime_class(self) -> type[Runtime]:
        return importlib.import_module(f".{self.runtime}", __package__).Runtime


class Runtime(Protocol):
    """A loaded model's family-specific half, made by the engine with itself (`Runtime(engine)`) on each build.

    The engine gives it: engine.model, engine.options, engine.stats, engine.memory_probe, engine.policy after
    `build`, and `engine.infer_session(runner, feed, names, warming=False)` (counted, fault-checked, recovered)
    and `engine.refuse_unwarmed(shape, grid, **details)` (counted, raises UnwarmedShapeError)."""

    policy: Any  # pipeline.shapes.ShapePolicy of the audio containers
    batch_sizes: tuple[int, ...]
    in_graph_decoding: bool

    def build(self, device: str, precision: str, config: Any) -> str: ...  # its sessions; a line for the log
    def warm_up(self) -> None: ...  # every session once at exactly its shape; then `ready`
    @property
    def ready(self) -> bool: ...
    @property
    def grid(self) -> tuple[tuple[int, int], ...]: ...  # warmed (batch, container samples) a caller may plan
    def infer(self, clips: Sequence[Any], topk: bool, full: bool, batch: int | None) -> list[Any]: ...
    def transcribe_many(self, clips: Sequence[Any], offsets: Sequence[float], batch: int | None) -> list[Any]: ...
    def hotword_graph(self, hotwords: tuple[Any, ...], prompt: str) -> Any: ...  # None for none
    def key_of(self, runner: Any) -> Any: ...  # recovery: which of its runners failed
    def runner_at(self, key: Any) -> Any: ...  # recovery: that runner in the rebuilt runtime, or None


def _check_paraformer(directory: ModelDirectory) -> None:
    if set(directory.manifest.decoder_files) != set(directory.manifest.files):
        raise ModelLoadError(
            f"{directory.path} holds a single-graph Paraformer export, from before the encoder and decoder became "
            "two graphs (the decoder now runs on the tokens, not the frames): re-export it with `python -m export "
            "paraformer` (or `python -m export pull`) into a new directory", path=str(directory.path))


SENSEVOICE = Family(
    architecture="sensevoice", runtime="sensevoice.runtime", signatures={"": (INPUT_NAMES, OUTPUT_NAMES)},
    word_times=True, hotwords=True, prompt=False, per_frame_outputs=True, max_batch=None,
    cpu_containers=DEFAULT_CPU_CONTAINERS,
    # Measured on an H100 (docs/benchmarks.md, "GPU: the H100 leases"): a call 8-11 ms at batch 1 instead of 19-22 ms,
    # 400 streams within p95 0.5 s instead of 256, replays equal to plain runs.
    cuda_graphs=True, one_session_on_cpu=False, optional_outputs=DECODING_OUTPUT_NAMES)
PARAFORMER = Family(
    architecture="paraformer", runtime="paraformer.runtime",
    signatures={"": (PARAFORMER_INPUT_NAMES, PARAFORMER_ENCODER_OUTPUT_NAMES),
                "decoder": (PARAFORMER_DECODER_INPUT_NAMES, PARAFORMER_DECODER_OUTPUT_NAMES)},
    # No hotwords: no CTC output to search, no prompt. One clip per call: its CIF rows' independence in a batch
    # is not verified yet. Never replayed as CUDA graphs on a GPU yet: plain unless asked.
    word_times=True, hotwords=False, prompt=False, per_frame_outputs=True, max_batch=1,
    cpu_containers=DEFAULT_PARAFORMER_CPU_CONTAINERS, cuda_graphs=False, one_session_on_cpu=True, check=_check_paraformer)
QWEN3_ASR = Family(
    architecture="qwen3-asr", runtime="qwen3_asr.runtime", signatures=dict(QWEN3_SIGNATURES),
    # Its decoder gives tokens, not times; its own ladder of containers (qwen3_asr/runtime.py qwen3_ladder)
    word_times=False, hotwords=True, prompt=True, per_frame_outputs=False, max_batch=1,
    cpu_containers=DEFAULT_CPU_CONTAINERS, cuda_graphs=False, one_session_on_cpu=False, export_container=True)

FAMILIES = {family.architecture: family for family in (SENSEVOICE, PARAFORMER, QWEN3_ASR)}


@dataclass(frozen=True)
class TextModel:
    """A model of text that runs beside the speech models: not a row of FAMILIES, because it keeps none of the
    ASR Runtime contract (no audio, no containers of seconds, no transcripts to return, nothing the engine or
    the doors could ask it); its own module of pipeline/ runs it, and the engine refuses its directory by name."""

    architecture: str  # the manifest's "architecture"
    task: str  # what it is, for the engine's refusal
    signature: Signature


# FunASR's CT-Transformer (ct-punc): a transcript's words in, each word's punctuation out (pipeline/punctuation.py).
CT_TRANSFORMER = TextModel(architecture="ct-transformer",
                           task="a punctuation model (FunASR's CT-Transformer: it punctuates a transcript)",
                           signature=(PUNCTUATION_INPUT_NAMES, PUNCTUATION_OUTPUT_NAMES))
TEXT_MODELS = {model.architecture: model for model in (CT_TRANSFORMER,)}


def family_of(manifest: ModelManifest) -> Family:
    """The family of a manifest's architecture; ModelLoadError naming the known ones for another."""
    family = FAMILIES.get(manifest.architecture)
    if manifest.architecture in TEXT_MODELS:
        raise ModelLoadError(f"model {manifest.name!r} is {TEXT_MODELS[manifest.architecture].task}, not a speech "
                             f"recogniser: serve a speech model ({', '.join(FAMILIES)}) as --model and give this one "
                             f"as --punc")
    if family is None:
        raise ModelLoadError(f"model {manifest.name!r} has architecture {manifest.architecture!r}, which this "
                             f"server cannot serve (it serves {', '.join(FAMILIES)})")
    return family


def family_for(directory: ModelDirectory) -> Family:
    """family_of(directory.manifest), once the family has checked that it can serve the directory."""
    family = family_of(directory.manifest)
    if family.check is not None:
        family.check(directory)
    return family


def takes_no_hotwords(family: Family) -> str:
    """Why a family without hotwords refuses them (a bad_start, or an error at startup)."""
    return (f"hotwords need a CTC model (SenseVoice) or Qwen3-ASR; this model is a "
            f"{family.architecture.capitalize()}")


def read_model_hotwords(path: Any, directory: ModelDirectory) -> tuple[Any, ...]:
    """The server-wide hotwords file (--hotwords FILE) for the model it serves: ValueError at startup, naming
    the file and the line where it can, for a model that takes none or a word (or list) it cannot take, rather
    than a bad_start for every stream."""
    family = family_of(directory.manifest)
    if not family.hotwords:
        raise ValueError(f"--hotwords {path}: {takes_no_hotwords(family)}; serve it without --hotwords")
    return importlib.import_module(f".{family.runtime}", __package__).read_hotwords(path, directory)
