"""int8 against fp32 in `python -m export verify` (issue 40), Paraformer's int8 recipe, and the fp32 padding
bound at depth (issue 37).

The Paraformer graphs are conftest's `paraformer_model_dir` (FunASR's own tiny Paraformer exported by the
real command). A quantisation that moves the CIF count must fail verify while padding stays exact; a graph
that lets padded frames into attention must fail the fp32 bound by orders of magnitude.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from export.__main__ import main
from export.onnx_export import float_module_nodes
from export.paraformer import INT8
from export.agreement import AgreementBound, ClipOutput, agreement
from export.verify import MAX_SCALED_ERR, model_blocks, scaled_err_bound, verify
from models.paraformer import ParaformerDimensions

SHORT_AND_LONG = "0.3,0.4,0.7,1,5"


def last_json(capsys: pytest.CaptureFixture) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_int8_is_compared_with_fp32_and_short_clips_are_bit_identical(paraformer_model_dir: Path,
                                                                      capsys: pytest.CaptureFixture) -> None:
    assert main(["verify", str(paraformer_model_dir), "--lengths", SHORT_AND_LONG]) == 0
    report = last_json(capsys)
    # Issue 37: a 0.3 s clip alone and in the container; the frontend's products made it differ (0.0099).
    assert all(r["max_abs_err"] == 0 for r in report["precisions"]["int8"].values())
    result = report["agreement"]["int8"]
    assert result["reference"] == "fp32" and result["passed"] and result["bound"]["max_count_change"] == 0.05
    assert list(result["counts"]) == [f"{s:g}s" for s in (0.3, 0.4, 0.7, 1, 5)]
    assert all(abs(n - r) <= max(1, 0.05 * r) for r, n in result["counts"].values())
    assert 0 < result["max_aligned_err"]["cif_weights"] < 0.05 and result["token_agreement"] > 0.5


def test_the_recipe_keeps_the_output_layers_float(paraformer_model_dir: Path) -> None:
    found = set()
    for path in (paraformer_model_dir / "model.int8.onnx", paraformer_model_dir / "decoder.int8.onnx"):
        graph = onnx.load(str(path)).graph
        kept, hits = float_module_nodes(path, INT8.float_modules)
        found |= hits
        weights = {i.name for i in graph.initializer}
        float_weight_matmuls = [n.name for n in graph.node if n.op_type == "MatMul" and n.input[1] in weights]
        assert sorted(float_weight_matmuls) == sorted(n for n in kept if n in float_weight_matmuls)
        # per-channel: the quantised weights carry one scale per output column
        scales = [numpy_helper.to_array(i) for i in graph.initializer if i.name.endswith("_scale")]
        assert scales and all(s.size > 1 for s in scales), [s.size for s in scales]
        # the CIF weight projection: a float32 product and row sum (models/paraformer.py), never a MatMul
        assert "model.predictor.cif_output.weight" in weights or path.name.startswith("decoder")
    assert found == {"decoder.output_layer"}


def test_verify_fails_when_int8_moves_the_token_count(paraformer_model_dir: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture) -> None:
    """A quantisation that shifts the CIF weights (here: the float cif_output's bias raised in the int8 graph)
    keeps padding exact, but emits more tokens than fp32: verify must say so and fail."""
    damaged = tmp_path / "damaged"
    shutil.copytree(paraformer_model_dir, damaged)
    path = damaged / "model.int8.onnx"
    model = onnx.load(str(path))
    (bias,) = [i for i in model.graph.initializer if i.name == "model.predictor.cif_output.bias"]
    bias.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(bias) + np.float32(1.0), bias.name))
    onnx.save(model, str(path))
    assert main(["verify", str(damaged), "--lengths", "1,5"]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    report = json.loads(lines[-1])
    assert all(r["max_abs_err"] == 0 for r in report["precisions"]["int8"].values())  # padding still exact
    result = report["agreement"]["int8"]
    assert not result["passed"] and result["max_count_change"] > 0.05
    assert any(line.startswith("[int8] against fp32:") and line.endswith("NOT MET") for line in lines)


def test_agreement_bounds_counts_relative_with_one_unit_allowed() -> None:
    bound = AgreementBound(max_count_change=0.05)

    def clip(tokens: list[int]) -> ClipOutput:
        return ClipOutput(tuple(tokens), np.zeros(len(tokens), np.float32), len(tokens))

    reference = {"long": clip(list(range(100))), "short": clip([1, 2, 3])}
    ok = agreement("int8", {"long": clip(list(range(104))), "short": clip([1, 2, 3, 4])}, reference, bound)
    assert ok.passed and ok.counts == ((100, 104), (3, 4)) and ok.max_count_change == pytest.approx(1 / 3)
    assert ok.token_agreement == pytest.approx(2 / 3)  # "short": one insertion against 3 tokens
    bad = agreement("int8", {"long": clip(list(range(94))), "short": clip([1, 2, 3])}, reference, bound)
    assert not bad.passed and bad.to_dict()["counts"] == {"long": [100, 94], "short": [3, 3]}


def test_the_fp32_bound_grows_with_depth() -> None:
    released = ParaformerDimensions.preset("full").to_dict()
    assert model_blocks(released) == 66  # 50 encoder + 16 decoder blocks
    assert scaled_err_bound("fp32", 66) == pytest.approx(66 * 3e-7)
    assert scaled_err_bound("fp32", model_blocks(ParaformerDimensions.preset("tiny").to_dict())) == MAX_SCALED_ERR
    assert model_blocks({"audio": {"encoder_layers": 18}, "text": {"num_hidden_layers": 28}, "prompt": 9}) == 46


def test_a_graph_that_lets_padding_into_attention_fails(paraformer_unmasked_dir: Path) -> None:
    """The bound still catches a real padding defect: without the attention mask (tests/fixtures/make_exports.py
    exports a tiny Paraformer whose attention_bias is zeros), padded frames take part in every attention and
    the clip in the container differs from the clip alone far beyond the bound, even at the released depth's
    bound."""
    out = paraformer_unmasked_dir
    report = verify(out, None, None, (1.0,))
    result = report["precisions"]["fp32"]["lengths"]["1s"]
    assert not report["passed"]
    assert not result["tokens_equal"] or result["max_scaled_err"] > 100 * scaled_err_bound("fp32", 66)
