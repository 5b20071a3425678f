"""The Qwen3-ASR export's memory-saving path (export/graph_weights.py) on the tiny geometry: weights in
external data files, as the 0.6B and 1.7B exports write them, give the same graphs as inline weights; the
int8 quantiser that reads one weight at a time makes what ONNX Runtime's quantize_dynamic makes; a
checkpoint's bf16 weights load exactly."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from export.graph_weights import quantize_int8_streaming, rename_weights_by_content
from export.qwen3_quantize import RECIPES, quantize_graph
from export.onnx_export import deterministic_waveform, external_data_file, quantize_int8
from export.qwen3_asr import DEFAULT_SEED, GRAPH_FILES, random_model, synthetic_tokens, write
from pipeline.initializers import read_initializers
from pipeline.modeldir import read_model_directory
from pipeline.families.qwen3_asr.decoding import ENCODER, GRAPHS, PREFILL, STEP, Qwen3Decoder, Qwen3Shapes
from pipeline.families.qwen3_asr.runtime import CONTENT_NAME_PREFIX

CONTAINER, MAX_NEW_TOKENS = 8.0, 16  # as conftest.py's qwen3_model_dir
PRECISIONS = ("fp32", "int8", "fp16")


def decoded(model_dir: Path, precision: str, seconds: float = 3.3):
    directory = read_model_directory(model_dir)
    sessions = {graph: ort.InferenceSession(str(model_dir / directory.manifest.graphs[precision][graph]),
                                            providers=["CPUExecutionProvider"]) for graph in GRAPHS}
    decoder = Qwen3Decoder(sessions, directory.manifest.dimensions["prompt"],
                           Qwen3Shapes.from_dimensions(directory.manifest.dimensions))
    return decoder.decode(deterministic_waveform(seconds, seed=5))


def assert_same_decoding(a, b) -> None:
    assert a.tokens == b.tokens and len(a.tokens) == MAX_NEW_TOKENS
    assert np.array_equal(a.first_logits, b.first_logits)
    assert len(a.step_logits) == len(b.step_logits)
    assert all(np.array_equal(x, y) for x, y in zip(a.step_logits, b.step_logits))


def weight_names(path: Path) -> set[str]:
    return {t.name for t in onnx.load(str(path), load_external_data=False).graph.initializer}


@pytest.mark.parametrize("precision", PRECISIONS)
def test_external_weights_decode_as_inline_ones(qwen3_model_dir, qwen3_external_model_dir, precision):
    for graph, file in GRAPH_FILES[precision].items():
        data = external_data_file(qwen3_external_model_dir / file)
        assert data.stat().st_size > 0 and data.stat().st_mode & 0o044 == 0o044  # readable by a service
        assert not external_data_file(qwen3_model_dir / file).exists()
        if graph != ENCODER:  # named by content either way: the same weights, the same names
            assert weight_names(qwen3_external_model_dir / file) == weight_names(qwen3_model_dir / file)
    assert_same_decoding(decoded(qwen3_external_model_dir, precision), decoded(qwen3_model_dir, precision))


def test_the_export_frees_the_model(tmp_path):
    """write() spends the model: its weights are gone once the graphs are written (the export's peak is
    the model once, not the model plus the quantiser's work). fp32 alone, the cheapest export that shows it.
    (That an int8-only export keeps none of the fp32 graphs it was quantised from: test_qwen3_checkpoint.py's
    pull.)"""
    model = random_model("tiny", DEFAULT_SEED)
    out = write(model, synthetic_tokens(model.dims), tmp_path / "qwen3-tiny-external", ("fp32",),
                "qwen3-tiny-external", {"kind": "random-init"}, CONTAINER, MAX_NEW_TOKENS, external_data=True)
    assert all(p.is_meta for p in model.parameters())
    graphs = list(GRAPH_FILES["fp32"].values())
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["manifest.json", "tokens.txt", *graphs, *(external_data_file(out / g).name for g in graphs)])


@pytest.mark.parametrize("external, per_channel", [(False, False), (True, False), (True, True)])
def test_streaming_int8_is_onnxruntimes_quantize_dynamic(qwen3_model_dir, tmp_path, external, per_channel):
    """ONNX Runtime's quantize_dynamic (export/onnx_export.py quantize_int8; per channel: the "per-channel"
    recipe's) and the streaming quantiser over the same fp32 graphs: the same weights (int8 values, scales,
    zero points) and operators, and bit-identical decoding."""
    copies = {}
    for label in ("onnxruntime", "streaming"):
        copies[label] = tmp_path / label
        shutil.copytree(qwen3_model_dir, copies[label])
        for graph, file in GRAPH_FILES["int8"].items():
            source, target = copies[label] / GRAPH_FILES["fp32"][graph], copies[label] / file
            target.unlink()
            if label == "onnxruntime" and per_channel:
                quantize_graph(source, target, graph, RECIPES["per-channel"])
            elif label == "onnxruntime":
                quantize_int8(source, target)
            else:
                quantize_int8_streaming(source, target, 0 if external else 1 << 62, per_channel)
            assert external_data_file(target).exists() == (label == "streaming" and external)
            if graph != ENCODER:
                rename_weights_by_content(target, CONTENT_NAME_PREFIX)
    for graph, file in GRAPH_FILES["int8"].items():
        want, got = ([numpy_helper.to_array(t, str(copies[label])) for t in
                      onnx.load(str(copies[label] / file), load_external_data=False).graph.initializer]
                     for label in ("onnxruntime", "streaming"))
        assert sorted(a.tobytes() + str(a.dtype).encode() for a in want) == sorted(
            a.tobytes() + str(a.dtype).encode() for a in got)
        ops = [sorted(n.op_type for n in onnx.load(str(copies[label] / file), load_external_data=False).graph.node)
               for label in ("onnxruntime", "streaming")]
        assert ops[0] == ops[1] and "MatMulInteger" in ops[0] and "Gemm" not in ops[0]
    for seconds in (3.3, 7.9):
        assert_same_decoding(decoded(copies["streaming"], "int8", seconds), decoded(copies["onnxruntime"], "int8", seconds))


def test_renaming_keeps_an_external_graph_whole(qwen3_external_model_dir, tmp_path):
    """Renaming again (names already by content) changes nothing: same names, the same bytes of weights."""
    external = qwen3_external_model_dir
    for graph in (PREFILL, STEP):
        path = tmp_path / GRAPH_FILES["fp32"][graph]
        shutil.copy(external / path.name, path)
        shutil.copy(external_data_file(external / path.name), external_data_file(path))
        before = read_initializers(path, min_bytes=0)
        rename_weights_by_content(path, CONTENT_NAME_PREFIX)
        after = read_initializers(path, min_bytes=0)
        assert sorted(before) == sorted(after) and all(np.array_equal(before[n], after[n]) for n in before)
        assert external_data_file(path).read_bytes() == external_data_file(external / path.name).read_bytes()
        assert not list(tmp_path.glob("*.partial"))
