"""The self-describing model directory that `python -m export` writes and the engine reads.

    DIR/manifest.json     ModelManifest below, as JSON
    DIR/tokens.txt        one token per line; line i is token id i (no sentencepiece needed to serve)
    DIR/model.onnx        fp32 graph (and model.int8.onnx, model.fp16.onnx when exported)

The graph's inputs: `audio` float32 [batch, samples] in [-1, 1], `audio_lengths` int32 [batch] (valid
samples), `language` int32 [batch] and `textnorm` int32 [batch] (prompt rows of the embedding).
Outputs: `logprobs` float32 [batch, frames, vocab] (CTC log-probabilities, the 4 prompt frames first) and
`logprob_lengths` int32 [batch] (valid frames). `batch` and `samples` are named free dimensions.
Graphs exported since the decoding step (export/decoding_outputs.py; manifest `top_k` > 0) also output
`best_ids` int32 [batch, frames], `best_logprobs` float32 [batch, frames], `topk_ids` int32
[batch, frames, top_k] and `topk_logprobs` float32 [batch, frames, top_k]; older directories lack them.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from .audio import OUTPUT_FRAME_SECONDS, PROMPT_FRAMES, SAMPLE_RATE
from .errors import ModelLoadError

MANIFEST_FORMAT = "unipad-asr/1"
MANIFEST_FILE = "manifest.json"
TOKENS_FILE = "tokens.txt"
PRECISIONS = ("fp32", "int8", "fp16")
ONNX_FILES = {"fp32": "model.onnx", "int8": "model.int8.onnx", "fp16": "model.fp16.onnx"}
FREE_DIMENSIONS = ("batch", "samples")
INPUT_NAMES = ("audio", "audio_lengths", "language", "textnorm")
OUTPUT_NAMES = ("logprobs", "logprob_lengths")
DECODING_OUTPUT_NAMES = ("best_ids", "best_logprobs", "topk_ids", "topk_logprobs")
# The int8 graphs' weights are 7-bit integers ([-64, 64], onnxruntime's reduce_range; export/onnx_export.py).
# x86 CPUs without VNNI (AVX2, and AVX-512 before it) multiply u8 activations by s8 weights with vpmaddubsw,
# which adds each pair of products into 16 bits and saturates: 8-bit weights reach 255 x 127 x 2 = 64770 there,
# so one graph computed other integers on those CPUs than on VNNI ones (on an AVX2 EPYC every random
# released-size SenseVoice failed int8 verify; docs/benchmarks.md, "int8 on CPUs without VNNI"). 7-bit pairs stay
# under 2^15: every CPU computes the exact integers, with the fast kernel. (u8 weights, FunASR's QUInt8, are exact
# too, but take 1.6-1.8x the time on VNNI CPUs: export/paraformer.py.) A manifest without `int8_weight_bits`
# is from before: 8.
INT8_WEIGHT_BITS = 7
# Paraformer runs as two graphs. Stage one (`files`): audio and lengths in; the
# encoder output and its valid frames, the CIF token embeddings and count, CIF weights and peaks, and the
# valid CIF frames out. Stage two (`decoder_files`): the encoder output, its lengths, the first `tokens`
# rows of the token embeddings and the count in; the best token per row and its log-prob out
# (pipeline/families/paraformer: stages.py runs both, decoding.py reads them).
PARAFORMER_INPUT_NAMES = ("audio", "audio_lengths")
PARAFORMER_ENCODER_OUTPUT_NAMES = ("encoder_out", "encoder_lengths", "token_embeddings", "token_counts",
                                   "cif_alphas", "cif_peaks", "peak_lengths")
PARAFORMER_DECODER_INPUT_NAMES = ("encoder_out", "encoder_lengths", "token_embeddings", "token_counts")
PARAFORMER_DECODER_OUTPUT_NAMES = ("token_ids", "token_logprobs")
DECODER_FREE_DIMENSIONS = ("batch", "frames", "tokens")
DECODER_ONNX_FILES = {"fp32": "decoder.onnx", "int8": "decoder.int8.onnx", "fp16": "decoder.fp16.onnx"}
# Qwen3-ASR: three graphs, each its own signature (export/qwen3_asr.py).
QWEN3_SIGNATURES = {
    "encoder": (("audio", "audio_lengths"), ("audio_embeds", "audio_token_lengths")),
    "prefill": (("prompt_ids", "prompt_lengths", "audio_embeds"), ("logits", "keys", "values")),
    "step": (("token_ids", "positions", "cache_keys", "cache_values"), ("logits", "keys", "values")),
}
# A punctuation model (CT-Transformer, export/ct_punc.py; pipeline/punctuation.py runs it): one graph, the
# vocabulary ids of a transcript's words padded to a token container and their count in, each word's class
# logits out (zero past the count). `batch` and `tokens` are named free dimensions.
PUNCTUATION_INPUT_NAMES = ("token_ids", "token_lengths")
PUNCTUATION_OUTPUT_NAMES = ("punc_logits",)
PUNCTUATION_FREE_DIMENSIONS = ("batch", "tokens")
# Prompt-row ids of SenseVoiceSmall's `embed` table (FunASR's model.py).
SENSEVOICE_LANGUAGES = {"auto": 0, "zh": 3, "en": 4, "yue": 7, "ja": 11, "ko": 12, "nospeech": 13}
SENSEVOICE_TEXTNORMS = {"withitn": 14, "woitn": 15}


@dataclass(frozen=True)
class ModelManifest:
    name: str
    architecture: str  # the model family (pipeline/families FAMILIES)
    dimensions: dict  # models.sensevoice.ModelDimensions as a dict
    files: dict  # precision -> ONNX file name, only the precisions that were exported
    source: dict  # where the weights came from: {"kind": "checkpoint"|"random-init"|"trained", ...}
    container_seconds: float = 30.0
    sample_rate: int = SAMPLE_RATE
    output_frame_seconds: float = OUTPUT_FRAME_SECONDS
    prompt_frames: int = PROMPT_FRAMES
    languages: dict = field(default_factory=lambda: dict(SENSEVOICE_LANGUAGES))
    textnorms: dict = field(default_factory=lambda: dict(SENSEVOICE_TEXTNORMS))
    blank_id: int = 0
    tag_tokens: dict = field(default_factory=dict)  # "language"|"emotion"|"event"|"textnorm" -> token ids
    opset: int = 18
    top_k: int = 0  # k of the in-graph decoding outputs (DECODING_OUTPUT_NAMES); 0: the graphs have none
    format: str = MANIFEST_FORMAT
    # One line for the people using the server (the browser page, the startup log) when the name and
    # languages would mislead, e.g. what a demo model recognises; empty for a general model.
    notice: str = ""
    decoder_files: dict = field(default_factory=dict)  # Paraformer: precision -> stage two's ONNX file
    # Families served by several graphs (Qwen3-ASR: export/qwen3_asr.py): precision ->
    # graph name -> file; `files` then names each precision's first graph. Empty for one-graph families.
    graphs: dict = field(default_factory=dict)
    int8_weight_bits: int = INT8_WEIGHT_BITS  # of the int8 graphs' weights (see INT8_WEIGHT_BITS)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, ensure_ascii=False) + "\n"


@dataclass(frozen=True)
class ModelDirectory:
    path: Path
    manifest: ModelManifest
    tokens: tuple[str, ...]

    def onnx_path(self, precision: str, decoder: bool = False) -> Path:
        """The graph of `precision`; `decoder`: a Paraformer's second stage."""
        files = self.manifest.decoder_files if decoder else self.manifest.files
        if precision not in files:
            raise ModelLoadError(
                f"{self.path}: no {precision} graph (has {', '.join(sorted(self.manifest.files))})",
                precision=precision,
            )
        return self.path / files[precision]


def write_model_directory(path: Path, manifest: ModelManifest, tokens: list[str]) -> None:
    """Write manifest.json and tokens.txt into an existing directory (the ONNX files are written by export)."""
    if any("\n" in t for t in tokens):
        raise ValueError("a token contains a newline")
    (path / MANIFEST_FILE).write_text(manifest.to_json(), encoding="utf-8")
    (path / TOKENS_FILE).write_text("\n".join(tokens) + "\n", encoding="utf-8")


def read_model_directory(path: str | Path) -> ModelDirectory:
    """Read and check a model directory; every problem is a ModelLoadError naming the file."""
    path = Path(path)
    if not path.is_dir():
        what = "is a file, not a model directory" if path.exists() else "does not exist"
        raise ModelLoadError(f"model directory {path} {what}", path=str(path))
    manifest_path = path / MANIFEST_FILE
    try:
        raw = json.loads(manifest_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelLoadError(f"{path} is not a Unipad model directory: no {MANIFEST_FILE}", path=str(path)) from None
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{manifest_path}: unreadable manifest ({exc})", path=str(path)) from None
    if not isinstance(raw, dict) or raw.get("format") != MANIFEST_FORMAT:
        raise ModelLoadError(f"{manifest_path}: not a {MANIFEST_FORMAT} manifest", path=str(path))
    known = {f.name for f in dataclasses.fields(ModelManifest)}
    raw = {"int8_weight_bits": 8} | raw  # exported before 7-bit weights
    try:
        manifest = ModelManifest(**{k: v for k, v in raw.items() if k in known})
    except TypeError as exc:
        raise ModelLoadError(f"{manifest_path}: incomplete manifest ({exc})", path=str(path)) from None
    if manifest.int8_weight_bits not in (7, 8):
        raise ModelLoadError(f"{manifest_path}: int8_weight_bits {manifest.int8_weight_bits!r}, expected 7 or 8")
    if manifest.sample_rate != SAMPLE_RATE:
        raise ModelLoadError(f"{manifest_path}: sample rate {manifest.sample_rate}, expected {SAMPLE_RATE}")
    try:
        tokens = tuple((path / TOKENS_FILE).read_text(encoding="utf-8").split("\n")[:-1])
    except OSError as exc:
        raise ModelLoadError(f"{path / TOKENS_FILE}: {exc.strerror}", path=str(path)) from None
    vocab = manifest.dimensions.get("vocab_size")
    if vocab is not None and vocab != len(tokens):
        raise ModelLoadError(f"{path / TOKENS_FILE}: {len(tokens)} tokens, the model has {vocab}")
    for precision, name in list(manifest.files.items()) + list(manifest.decoder_files.items()):
        if precision not in PRECISIONS:
            raise ModelLoadError(f"{manifest_path}: unknown precision {precision!r}")
        if not (path / name).is_file():
            raise ModelLoadError(f"{path / name} is missing (listed in the manifest)")
    for precision, graphs in manifest.graphs.items():
        for name in graphs.values():
            if not (path / name).is_file():
                raise ModelLoadError(f"{path / name} is missing (listed in the manifest)")
    return ModelDirectory(path=path, manifest=manifest, tokens=tokens)
