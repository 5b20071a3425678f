from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from fixtures.tiny_graph import write_tiny_model_dir
from pipeline.initializers import read_initializers


@pytest.mark.parametrize("external_data", [False, True])
def test_reads_every_initializer_like_onnx_does(tmp_path, external_data):
    model_dir = write_tiny_model_dir(tmp_path / "m", hidden=64, layers=2, external_data=external_data)
    path = model_dir / "model.onnx"
    expected = {t.name: numpy_helper.to_array(t, base_dir=str(model_dir))
                for t in onnx.load(str(path)).graph.initializer}
    got = read_initializers(path, min_bytes=0)
    assert got.keys() == expected.keys()
    for name, array in expected.items():
        assert got[name].dtype == array.dtype and np.array_equal(got[name], array), name
        assert got[name].flags.writeable and got[name].flags.c_contiguous
    assert set(read_initializers(path)) == {n for n, a in expected.items() if a.nbytes >= 1024}


def test_exported_int8_graph(tiny_model_dir):
    path = tiny_model_dir / "model.int8.onnx"
    expected = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}
    got = read_initializers(path, min_bytes=0)
    assert got  # typed *_data fields are skipped (left to ORT), raw_data ones must all match
    for name, array in got.items():
        assert np.array_equal(array, expected[name]), name
    assert any(a.dtype == np.int8 for a in got.values())


def test_skip_prepacked_leaves_out_the_weights_a_kernel_prepacks(tiny_model_dir):
    """MatMulInteger's weights (input 1) are left out; shared, a session would run them unpacked. What a
    Gather or an elementwise op reads stays."""
    path = tiny_model_dir / "model.int8.onnx"
    graph = onnx.load(str(path)).graph
    every = read_initializers(path, min_bytes=0)
    kept = read_initializers(path, min_bytes=0, skip_prepacked=True)
    prepacked = {n.input[1] for n in graph.node if n.op_type in ("MatMulInteger", "MatMul", "Gemm", "Conv")}
    assert prepacked & set(every), "the int8 graph has prepacked weights to leave out"
    assert set(kept) == set(every) - prepacked
    assert any(n.op_type != "MatMulInteger" and n.input and n.input[0] in kept for n in graph.node)


def test_not_an_onnx_file(tmp_path):
    bad = tmp_path / "x.onnx"
    bad.write_bytes(b"\x00\x01garbage")
    with pytest.raises(ValueError, match="not a readable ONNX model"):
        read_initializers(bad)
