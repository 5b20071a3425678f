"""`python -m export verify`'s agreement with fp32 (issue 40): each precision other than fp32 must keep fp32's
answer on verify's clips within the model's bound. On the tiny exports (conftest.py): SenseVoice's int8 and
Qwen3-ASR's fp16 keep it; a deliberately coarse quantisation of the same fp32 graphs (4-bit weights) does not,
nor does any int8 recipe of the random Qwen3 decoder, and verify fails on them, with the figures in its last
JSON line, while their padding checks still pass."""
from __future__ import annotations

import json
import shutil

import onnx
import pytest

from export.__main__ import main
from export.qwen3_quantize import RECIPES, head_node, quantize_graph
from export.verify import CTC_AGREEMENT, precision_agreement, verify
from export.verify_qwen3 import QWEN3_AGREEMENT
from pipeline.modeldir import read_model_directory
from pipeline.qwen3_decoding import GRAPHS

QWEN3_LENGTHS, SENSEVOICE_LENGTHS = (1.5, 6.1), (2.0, 7.0)


def coarse(src, dst) -> None:
    """A deliberately unfaithful int8 graph: 4-bit weights, one scale per 128 inputs."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(onnx.load(str(src)), bits=4, block_size=128, is_symmetric=True,
                                     accuracy_level=0, op_types_to_quantize=("MatMul",))
    quantizer.process()
    onnx.save(quantizer.model.model, str(dst))


def copy_with_int8(model_dir, tmp_path, requantise):
    """The model directory with its int8 graphs made again from its fp32 graphs by `requantise(src, dst, graph)`."""
    out = tmp_path / "model"
    shutil.copytree(model_dir, out)
    manifest = read_model_directory(out).manifest
    if manifest.architecture == "qwen3-asr":
        for graph in GRAPHS:
            requantise(out / manifest.graphs["fp32"][graph], out / manifest.graphs["int8"][graph], graph)
    else:
        requantise(out / manifest.files["fp32"], out / manifest.files["int8"], None)
    return out


def assert_kept(report, precision):
    agreement = report["precisions"][precision]["agreement"]
    assert agreement["passed"] and report["precisions"][precision]["passed"], json.dumps(agreement)[:3000]
    assert agreement["clips"] == len(agreement["per_clip"]) > 0 and agreement["precision"] == precision


def test_qwen3_fp16_keeps_fp32s_answer(qwen3_model_dir):
    report = verify(qwen3_model_dir, ["fp16"], None, QWEN3_LENGTHS)
    assert_kept(report, "fp16")
    for clip in report["precisions"]["fp16"]["agreement"]["per_clip"].values():
        assert clip["tokens"] > 0 and clip["token_agreement_overall"] >= clip["token_agreement"]
        assert clip["max_err"] == max(clip["prefill_logit_err"], clip["step_logit_err"]) <= QWEN3_AGREEMENT.max_err
    assert "fp32" not in report["precisions"]  # fp32 decoded as the reference only


@pytest.mark.parametrize("recipe", ["blockwise", "per-tensor", "coarse"])
def test_qwen3_verify_fails_an_int8_that_loses_fp32s_answer(qwen3_model_dir, tmp_path, capsys, recipe):
    """Every int8 recipe tried moves the random decoder's logits past the bound (the default, blockwise, as
    today's per-tensor did; docs/benchmarks.md), and a 4-bit one far past it: verify says so and fails,
    while int8's padding invariance still holds."""
    def requantise(src, dst, graph):
        coarse(src, dst) if recipe == "coarse" else quantize_graph(src, dst, graph, RECIPES[recipe])

    out = copy_with_int8(qwen3_model_dir, tmp_path, requantise)
    assert main(["verify", str(out), "--precision", "int8", "--lengths", ",".join(map(str, QWEN3_LENGTHS))]) == 1
    lines = capsys.readouterr().out.splitlines()
    summary = json.loads(lines[-1])
    agreement = summary["agreement"]["int8"]
    assert not summary["passed"] and not agreement["passed"] and lines[-2] == "FAILED"
    assert agreement["max_err"] > QWEN3_AGREEMENT.max_err
    assert all(r["tokens_equal"] for r in summary["precisions"]["int8"].values())  # padding still exact
    assert any("against fp32" in line and "NOT KEPT" in line for line in lines)


def test_sensevoice_int8_keeps_fp32s_answer(tiny_model_dir):
    report = verify(tiny_model_dir, None, None, SENSEVOICE_LENGTHS)
    assert_kept(report, "int8")
    assert "agreement" not in report["precisions"]["fp32"]
    for clip in report["precisions"]["int8"]["agreement"]["per_clip"].values():
        assert clip["tokens"] > 0 and 0 <= clip["edit_distance"] <= clip["tokens"]


def test_sensevoice_verify_fails_an_int8_that_loses_fp32s_answer(tiny_model_dir, tmp_path):
    out = copy_with_int8(tiny_model_dir, tmp_path, lambda src, dst, graph: coarse(src, dst))
    report = verify(out, ["int8"], None, SENSEVOICE_LENGTHS)  # fp32 decoded for the comparison only
    agreement = report["precisions"]["int8"]["agreement"]
    assert not agreement["passed"] and not report["passed"]
    assert agreement["max_err"] > CTC_AGREEMENT.max_err or agreement["token_agreement"] < CTC_AGREEMENT.min_token_agreement
    assert all(r["tokens_equal"] for r in report["precisions"]["int8"]["lengths"].values())


@pytest.mark.parametrize("token_agreement, max_err, passed", [(1.0, 0.0, True), (0.5, 0.0, False), (1.0, 9.0, False)])
def test_the_worst_clip_is_held_against_the_bound(token_agreement, max_err, passed):
    clips = {"a": {"token_agreement": 1.0, "max_err": 0.0}, "b": {"token_agreement": token_agreement, "max_err": max_err}}
    agreement = precision_agreement("int8", clips, CTC_AGREEMENT, "log-probs")
    assert agreement["passed"] is passed
    assert (agreement["token_agreement"], agreement["max_err"]) == (token_agreement, max_err)


def test_the_head_is_the_last_weighted_matmul(qwen3_model_dir):
    manifest = read_model_directory(qwen3_model_dir).manifest
    model = onnx.load(str(qwen3_model_dir / manifest.graphs["fp32"]["step"]))
    head = next(n for n in model.graph.node if n.name == head_node(model))
    vocab = manifest.dimensions["vocab_size"]
    weights = {t.name: list(t.dims) for t in model.graph.initializer}
    assert vocab in weights[head.input[1]]  # lm_head: [hidden, vocab] (or the tied [vocab, hidden])
