"""int8 that every CPU computes exactly (pipeline/modeldir.py INT8_WEIGHT_BITS): the probe that tells a CPU whose
int8 kernels saturate, the shipped demo model's 7-bit weights, and an old 8-bit export served as fp32 there."""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from pipeline.engine import Engine, EngineOptions, choose_precision
from pipeline.errors import ModelLoadError
from pipeline.modeldir import INT8_WEIGHT_BITS, read_model_directory
from pipeline.providers import _SATURATION_PROBE, int8_kernels_saturate

DEMO = Path(__file__).resolve().parents[2] / "models" / "demo"


def matmul_integer(weights: np.ndarray) -> ort.InferenceSession:
    """u8 activations [rows, K] times the constant s8 `weights` [K, N], as the int8 graphs' MatMuls are."""
    k, n = weights.shape
    graph = helper.make_graph([helper.make_node("MatMulInteger", ["a", "b"], ["y"])], "g",
                              [helper.make_tensor_value_info("a", TensorProto.UINT8, [None, k])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, [None, n])],
                              [numpy_helper.from_array(weights, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 10)])
    model.ir_version = 5
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def exact(activations: np.ndarray, weights: np.ndarray) -> np.ndarray:
    return activations.astype(np.int64) @ weights.astype(np.int64)


def test_the_probe_is_the_graph_it_says():
    b = numpy_helper.from_array(np.full((2, 1), 127, np.int8), "b")
    graph = helper.make_graph([helper.make_node("MatMulInteger", ["a", "b"], ["y"])], "int8_saturation_probe",
                              [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 1])], [b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 10)], producer_name="unipad")
    model.ir_version = 5
    assert model.SerializeToString() == _SATURATION_PROBE


def test_the_probe_tells_what_full_range_weights_get_here():
    """8-bit weights against every activation: exact where the probe says the kernels do not saturate."""
    rng = np.random.default_rng(0)
    weights = rng.integers(-127, 128, (512, 64)).astype(np.int8)
    activations = rng.integers(0, 256, (32, 512)).astype(np.uint8)
    wrong = int((matmul_integer(weights).run(None, {"a": activations})[0] != exact(activations, weights)).sum())
    assert (wrong > 0) == int8_kernels_saturate(), wrong


def test_seven_bit_weights_are_exact_on_this_cpu():
    """The shipped int8 graph's weights are 7-bit, and each weight matrix times the worst activations (every
    value 255, and random ones) gives the exact integers here, whatever this CPU's int8 kernels."""
    model = onnx.load(DEMO / "model.int8.onnx")
    weights = [numpy_helper.to_array(t) for t in model.graph.initializer
               if t.data_type == TensorProto.INT8 and len(t.dims) == 2]
    assert weights and read_model_directory(DEMO).manifest.int8_weight_bits == INT8_WEIGHT_BITS == 7
    assert max(int(np.abs(w.astype(np.int16)).max()) for w in weights) <= 64
    rng = np.random.default_rng(1)
    for w in weights:
        activations = np.concatenate([np.full((1, w.shape[0]), 255, np.uint8),
                                      rng.integers(0, 256, (7, w.shape[0])).astype(np.uint8)])
        assert np.array_equal(matmul_integer(w).run(None, {"a": activations})[0], exact(activations, w))


def test_an_old_export_is_served_in_fp32_where_its_int8_drifts():
    both = {"fp32": "model.onnx", "int8": "model.int8.onnx"}
    assert choose_precision("auto", "cpu", both, int8_drifting=True) == "fp32"
    assert choose_precision("int8", "cpu", both, int8_drifting=True) == "int8"  # asked for: served, with the warning
    assert choose_precision("auto", "cpu", both, int8_drifting=False) == "int8"


def test_a_manifest_from_before_seven_bit_weights_reads_as_eight(tmp_path, caplog):
    old = tmp_path / "old"
    shutil.copytree(DEMO, old)
    manifest = json.loads((old / "manifest.json").read_text(encoding="utf-8"))
    del manifest["int8_weight_bits"]
    (old / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    assert read_model_directory(old).manifest.int8_weight_bits == 8
    (old / "manifest.json").write_text(json.dumps(manifest | {"int8_weight_bits": "8"}), encoding="utf-8")
    with pytest.raises(ModelLoadError, match="int8_weight_bits '8', expected 7 or 8"):
        read_model_directory(old)
    (old / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="pipeline.engine"):
        engine = Engine(old, EngineOptions(device="cpu", containers=(2.0,))).load()
    warned = [r for r in caplog.records if "8-bit weights" in r.getMessage()]
    if int8_kernels_saturate():
        assert engine.precision == "fp32" and len(warned) == 1 and "export pull" in warned[0].getMessage()
    else:
        assert engine.precision == "int8" and not warned
