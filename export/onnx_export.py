"""PyTorch -> ONNX, precisions, graph checks and the atomic write of a model directory."""
from __future__ import annotations

import copy
import dataclasses
import logging
import os
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.audio import SAMPLE_RATE
from pipeline.modeldir import (DECODER_FREE_DIMENSIONS, DECODER_ONNX_FILES, FREE_DIMENSIONS, INPUT_NAMES,
                               INT8_WEIGHT_BITS, ONNX_FILES, OUTPUT_NAMES, PRECISIONS, ModelManifest,
                               write_model_directory)

from .decoding_outputs import DEFAULT_TOP_K, add_decoding_to_file
from .graph_rules import refuse_hazards

log = logging.getLogger(__name__)

OPSET = 18  # DirectML runs opset <= 20; 18 is the newest the exporter and every DML build agree on
EXPORT_SAMPLES = 5 * SAMPLE_RATE  # example length for tracing; the samples axis stays free
MAX_EXPORT_SAMPLES = 600 * SAMPLE_RATE
EXTERNAL_DATA_BYTES = 1_800_000_000  # weights past this go to "<graph>.data" (protobuf stops at 2 GB)
NAME_SCOPES = "pkg.torch.onnx.name_scopes"  # the torch exporter's record of the module path of each node
# Never quantised, whatever the recipe: the in-graph frontend's DFT and mel products (models/frontend.py)
# see int16-scaled samples and power spectra up to 1e13, where 256 levels would erase the quiet bins.
ALWAYS_FLOAT = ("frontend",)


def export_onnx(model, path: Path, opset: int = OPSET) -> None:
    """Export `models.sensevoice.SenseVoice` (or a module with `onnx_signature()`, which names its inputs and
    outputs: a Paraformer stage) with free `batch` and `samples` dimensions to one .onnx file. A module with
    `onnx_example()` (the Paraformer decoder stage) takes [batch, frames, D] encoder output and [batch,
    tokens, D] token embeddings instead of audio, with free `batch`, `frames` and `tokens`."""
    import torch

    batch = torch.export.Dim(FREE_DIMENSIONS[0], min=1, max=64)
    samples = torch.export.Dim(FREE_DIMENSIONS[1], min=2 * SAMPLE_RATE // 10, max=MAX_EXPORT_SAMPLES)
    example = (
        torch.zeros(1, EXPORT_SAMPLES),
        torch.full((1,), EXPORT_SAMPLES, dtype=torch.int32),
        torch.zeros(1, dtype=torch.int32),
        torch.full((1,), 15, dtype=torch.int32),
    )
    input_names, output_names = INPUT_NAMES, OUTPUT_NAMES
    if hasattr(model, "onnx_signature"):  # another family (Paraformer): audio and lengths only
        input_names, output_names = model.onnx_signature()
        example = example[: len(input_names)]
    dynamic = {name: {0: batch} for name in input_names} | {"audio": {0: batch, 1: samples}}
    if hasattr(model, "onnx_example"):  # the Paraformer decoder stage: encoder frames and token rows free
        example = model.onnx_example()
        frames, tokens = (torch.export.Dim(name, min=2, max=MAX_EXPORT_SAMPLES // 960) for name in DECODER_FREE_DIMENSIONS[1:])
        dynamic = {name: {0: batch} for name in input_names}
        dynamic[input_names[0]], dynamic[input_names[2]] = {0: batch, 1: frames}, {0: batch, 1: tokens}
    model = model.eval()
    with torch.no_grad():
        program = torch.onnx.export(
            model, example, input_names=list(input_names), output_names=list(output_names),
            dynamic_shapes=dynamic, opset_version=opset, dynamo=True, external_data=False, verbose=False,
        )
    program.save(str(path), external_data=needs_external_data(model))


def needs_external_data(model) -> bool:
    return sum(p.numel() * p.element_size() for p in model.state_dict().values()) > EXTERNAL_DATA_BYTES


@dataclass(frozen=True)
class Int8Recipe:
    """How one family's float graphs become its int8 graphs: onnxruntime's dynamic quantisation of the
    MatMuls whose weights are constant (activation ranges are taken per call, over the whole tensor; the
    graphs zero every padded row before a weight MatMul, so padding cannot move them).

    per_channel: one scale per output column instead of one per weight matrix (a column of small weights
        keeps its resolution next to a column of large ones).
    weight_type: "QInt8" or "QUInt8" (onnxruntime.quantization.QuantType names).
    float_modules: the PyTorch modules (dotted paths below the exported module, e.g. "decoder.output_layer")
        whose MatMuls stay float32: layers whose output decides the answer directly (a projection to the
        vocabulary, the CIF weight that decides the token count) where one rounding step is a changed token.
    """

    per_channel: bool = False
    weight_type: str = "QInt8"
    float_modules: tuple[str, ...] = ()
    op_types: tuple[str, ...] = ("MatMul", "Gemm")


# SenseVoice's recipe (Qwen3-ASR's are export/qwen3_quantize.py's RECIPES; issue 40).
DEFAULT_INT8 = Int8Recipe()

# Every int8 weight in 7 bits, in every recipe and quantiser: pipeline/modeldir.py INT8_WEIGHT_BITS says why.
INT8_REDUCE_RANGE = INT8_WEIGHT_BITS == 7


def quantize_int8(src: Path, dst: Path, recipe: Int8Recipe = DEFAULT_INT8) -> set[str]:
    """Dynamic int8 of `src` into `dst` by `recipe`; returns the recipe's float_modules found in this graph
    (a family of several graphs checks that each was found in one: write_model_dir). Conv stays float (the
    frontend's and FSMN's convolutions would become ConvInteger, which lacks CPU kernels)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    excluded, found = float_module_nodes(src, recipe.float_modules)
    quantize_dynamic(
        str(src), str(dst), op_types_to_quantize=list(recipe.op_types), weight_type=QuantType[recipe.weight_type],
        per_channel=recipe.per_channel, reduce_range=INT8_REDUCE_RANGE, nodes_to_exclude=excluded,
        extra_options={"MatMulConstBOnly": True},
    )
    return found


def float_module_nodes(path: Path, modules: tuple[str, ...]) -> tuple[list[str], set[str]]:
    """The MatMul/Gemm nodes that the modules `modules` exported, by the module path the torch exporter
    records on each node (metadata "pkg.torch.onnx.name_scopes": ['', 'model', 'model.decoder', ...]);
    and which of `modules` were found. The modules ALWAYS_FLOAT are excluded too."""
    import ast

    graph = load_graph(path, load_external_data=False).graph
    nodes, found = [], set()
    for node in graph.node:
        if node.op_type not in ("MatMul", "Gemm"):
            continue
        scopes = next((ast.literal_eval(p.value) for p in node.metadata_props if p.key == NAME_SCOPES), [])
        hits = {m for m in modules + ALWAYS_FLOAT for scope in scopes if scope == m or scope.endswith(f".{m}")}
        if hits:
            nodes.append(node.name)
            found |= hits - set(ALWAYS_FLOAT)
    return nodes, found


def load_graph(path: Path, **options) -> "onnx.ModelProto":
    """onnx.load, with a damaged file named in one line (protobuf's DecodeError names no file)."""
    import onnx

    try:
        return onnx.load(str(path), **options)
    except OSError:
        raise  # a missing or unreadable file says so itself
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and onnx's own errors share no base
        raise ValueError(f"{path}: not a readable ONNX graph ({type(exc).__name__}: {exc})") from None


def external_data_file(path: Path) -> Path:
    """Where torch.onnx and save_graph put the weights of a graph past protobuf's 2 GB."""
    return path.parent / f"{path.name}.data"


def save_graph(model: "onnx.ModelProto", path: Path) -> None:
    """onnx.save_model over the graph at `path`, keeping its layout: its weights in one external file when
    it had one, written afresh (onnx refuses to write over one: FileExistsError) and readable by whoever may
    read the graph (onnx creates it private, 0600: a model exported by an administrator was unreadable to
    its service)."""
    import onnx

    data = external_data_file(path)
    external = data.exists()
    data.unlink(missing_ok=True)
    onnx.save_model(model, str(path), save_as_external_data=external, all_tensors_to_one_file=True,
                    location=data.name, size_threshold=1024)
    if external:
        data.chmod(path.stat().st_mode & 0o777)


def op_histogram(path: Path) -> dict[str, int]:
    model = load_graph(path, load_external_data=False)
    return dict(sorted(Counter(node.op_type for node in model.graph.node).items()))


def non_static_shapes(path: Path, samples: int, overrides: dict[str, int] | None = None) -> list[str]:
    """Tensors whose shape is still not fully known once batch=1 and samples=`samples` are fixed (or the
    free dimensions named in `overrides`, for graphs with other free axes: a Paraformer decoder's batch,
    frames and tokens, Qwen3-ASR's graphs).

    ONNX Runtime applies the free-dimension overrides and folds the shape arithmetic exactly as a
    serving session does; ONNX shape inference over that optimised graph then finds what is left.
    """
    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        optimized = Path(tmp) / "optimized.onnx"
        options = ort.SessionOptions()
        for name, value in (overrides or {FREE_DIMENSIONS[0]: 1, FREE_DIMENSIONS[1]: samples}).items():
            options.add_free_dimension_override_by_name(name, value)
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(optimized)
        if _has_external_data(path):
            options.add_session_config_entry("session.optimized_model_external_initializers_file_name", "weights.bin")
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        model = onnx.load(str(optimized), load_external_data=False)
        del model.graph.value_info[:]
        _matmul_nbits_as_matmul(model)
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    problems = []
    for info in list(inferred.graph.value_info) + list(inferred.graph.output):
        tensor_type = info.type.tensor_type
        dims = tensor_type.shape.dim
        if not tensor_type.HasField("shape") or any(not d.HasField("dim_value") for d in dims):
            problems.append(f"{info.name} {[d.dim_param or d.dim_value for d in dims]}")
    return problems


def _matmul_nbits_as_matmul(model) -> None:
    """Each MatMulNBits (8-bit weights, export/qwen3_quantize.py) as a MatMul over a weightless [K, N] input
    of the same shape: ONNX's shape inference knows no com.microsoft operator, and would leave every tensor
    after one unknown."""
    import onnx
    from onnx import helper

    for index, node in enumerate(model.graph.node):
        if node.op_type != "MatMulNBits":
            continue
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        weight = f"{node.name}_shape_only_weight"
        model.graph.input.append(helper.make_tensor_value_info(weight, onnx.TensorProto.FLOAT,
                                                               [attributes["K"], attributes["N"]]))
        model.graph.node[index].CopyFrom(helper.make_node("MatMul", [node.input[0], weight], list(node.output),
                                                          name=node.name))


def _has_external_data(path: Path) -> bool:
    return external_data_file(path).exists()


def write_model_dir(
    model, tokens: list[str], out: Path, manifest: ModelManifest, precisions: tuple[str, ...], overwrite: bool = False,
    int8: Int8Recipe = DEFAULT_INT8,
) -> Path:
    """Export `model` in each precision into `out`, atomically (write_graphs_atomically); int8 by `int8`."""
    unknown = [p for p in precisions if p not in PRECISIONS]
    if unknown:
        raise ValueError(f"unknown precision {unknown[0]!r} (choose from {', '.join(PRECISIONS)})")
    from tqdm import tqdm

    def build(tmp: Path) -> ModelManifest:
        # fp32 is exported first when int8 (quantised from it) or fp32 itself is wanted; an fp16-only export (a
        # GPU's) skips it: it would double the export's time (measured: docs/history.md, "Speed").
        needs_fp32 = "fp32" in precisions or "int8" in precisions
        steps = ["fp32"] * needs_fp32 + [p for p in precisions if p != "fp32"]
        top_k = 0
        kept_float: set[str] = set()
        # A Paraformer is two graphs (its encoder + CIF, then its decoder), each written like a whole model.
        stages = list(zip(model.export_stages(), (ONNX_FILES, DECODER_ONNX_FILES)) if hasattr(model, "export_stages")
                      else [(model, ONNX_FILES)])
        with tqdm(total=len(steps) * len(stages), desc=f"export {Path(out).name}", unit="graph", disable=None) as progress:
            for precision in steps:
                progress.set_postfix_str(precision)
                for index, (module, names) in enumerate(stages):
                    target = tmp / names[precision]
                    if precision == "fp32":
                        export_onnx(module, target, manifest.opset)
                        if index == 0:  # before int8, which is quantised from this file
                            top_k = add_decoding_to_file(target)
                    elif precision == "int8":
                        kept_float |= quantize_int8(tmp / names["fp32"], target, int8)
                    else:
                        # Exported from PyTorch rather than converted: the converters' fp16 passes would have
                        # to keep the frontend float32 (power spectra reach 1e13, past fp16's 65504).
                        export_onnx(copy.deepcopy(module).half_encoder(), target, manifest.opset)
                        k = add_decoding_to_file(target, top_k or DEFAULT_TOP_K)
                        top_k = top_k or (k if index == 0 else 0)
                    progress.update()
        missing = sorted(set(int8.float_modules) - kept_float) if "int8" in precisions else []
        if missing:  # a renamed module would silently be quantised: the recipe no longer describes the model
            raise ValueError(f"the int8 recipe keeps {', '.join(missing)} in float, but no graph has such a module")
        if needs_fp32 and "fp32" not in precisions:
            for _, names in stages:
                (tmp / names["fp32"]).unlink()
        files = {p: ONNX_FILES[p] for p in steps if p in precisions}
        decoder_files = {p: DECODER_ONNX_FILES[p] for p in files} if len(stages) > 1 else {}
        return _with_files(manifest, files, top_k, decoder_files)

    return write_graphs_atomically(out, build, manifest, tokens, overwrite)


def write_graphs_atomically(out: Path, build, manifest: ModelManifest, tokens: list[str], overwrite: bool = False) -> Path:
    """Create the model directory `out` atomically: `build(tmp)` writes the graphs into a temporary sibling
    directory (and may return the final manifest), manifest.json and tokens.txt follow, and the directory is
    renamed into place at the end, so a failure or interruption leaves no half-written directory. A graph
    that breaks the seeds' rules (export/graph_rules.py) raises GraphRuleError and nothing is written."""
    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} already exists (choose another --out or remove it)")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except OSError as exc:  # the error would name the temporary directory, not the one asked for
        raise OSError(f"cannot create {out}: {exc.strerror or exc}") from None
    try:
        manifest = build(tmp) or manifest
        for graph in sorted(tmp.glob("*.onnx")):  # no graph that breaks the seeds' rules is ever written
            refuse_hazards(graph)
        write_model_directory(tmp, manifest, tokens)
        os.chmod(tmp, 0o755)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _with_files(manifest: ModelManifest, files: dict[str, str], top_k: int, decoder_files: dict[str, str]) -> ModelManifest:
    return dataclasses.replace(manifest, files=files, top_k=top_k, decoder_files=decoder_files)


def tag_token_ids(tokens: list[str]) -> dict[str, list[int]]:
    """Group the `<|...|>` tokens by the role SenseVoice gives them."""
    from pipeline.families.sensevoice.decoding import EMOTIONS, LANGUAGES, TEXTNORMS

    groups: dict[str, list[int]] = {}
    for i, token in enumerate(tokens):
        if token.startswith("<|") and token.endswith("|>"):
            name = token[2:-2]
            kind = "language" if name in LANGUAGES else "emotion" if name in EMOTIONS else "textnorm" if name in TEXTNORMS else "event"
            groups.setdefault(kind, []).append(i)
    return groups


def deterministic_waveform(seconds: float, seed: int = 0) -> np.ndarray:
    """Speech-like test audio: harmonic tones with a syllable-rate envelope plus light noise, float32."""
    rng = np.random.default_rng(seed)
    n = int(seconds * SAMPLE_RATE)
    t = np.arange(n) / SAMPLE_RATE
    pitch = 120 + 40 * np.sin(2 * np.pi * 0.7 * t + rng.uniform(0, 6))
    phase = 2 * np.pi * np.cumsum(pitch) / SAMPLE_RATE
    voice = sum(np.sin(k * phase) / k for k in range(1, 12))
    envelope = np.clip(np.sin(2 * np.pi * 3.1 * t + rng.uniform(0, 6)), 0, None) ** 0.5
    audio = 0.2 * voice * envelope + 0.01 * rng.standard_normal(n)
    return (0.5 * audio / np.max(np.abs(audio))).astype(np.float32)
