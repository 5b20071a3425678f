"""`python -m export ct-punc` and `verify` on FunASR's own tiny CT-Transformer (tests/fixtures/ct_punc).

Parity with FunASR (tests/ct_punc_reference.py): its state_dict loads strictly into models/ct_punc.py, and the
exported graph (conftest's `ct_punc_model_dir`, fp32 and int8), each call padded into its word container,
gives FunASR's class for every word of every call of every text (1-500 words), its logits within verify's
fp32 bound, and through pipeline/punctuation.py FunASR's punctuated text. The directory passes verify; a
directory FunASR would run otherwise (a jieba dictionary) or another model is refused in one line, and the
engine refuses a punctuation model by name.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from ct_punc_reference import FIXTURE, REFERENCE, TOKENS, call_logits
from export.__main__ import main
from export.ct_punc import checkpoint_model
from export.verify import model_blocks, scaled_err_bound
from export.verify_ct_punc import verify
from pipeline.engine import Engine
from pipeline.errors import ModelLoadError
from pipeline.modeldir import read_model_directory
from pipeline.punctuation import PunctuationGraph, load_punctuator

TEXTS = sorted(name for name, r in REFERENCE.items() if r["calls"])


def scaled_errors(reference: np.ndarray, ours: np.ndarray) -> float:
    """verify's measure: |a - b| / max(1, |a|)."""
    return float((np.abs(reference - ours) / np.maximum(1.0, np.abs(reference))).max())


def test_funasr_state_dict_loads_strictly_and_matches_in_pytorch() -> None:
    model, tokens, unk = checkpoint_model(FIXTURE)
    assert (tokens, unk, model.dims.num_blocks, model.dims.classes) == (TOKENS, "<unk>", 2, 6)
    worst = 0.0
    with torch.no_grad():
        for name in ("mixed_500", "no_end_500", "commas_410"):
            for ids, expected in zip(REFERENCE[name]["calls"], call_logits(name)):
                ours = model(torch.tensor([ids]), torch.tensor([len(ids)]))[0].numpy()
                assert np.array_equal(ours.argmax(-1), expected.argmax(-1))
                worst = max(worst, scaled_errors(expected, ours))
    assert worst <= scaled_err_bound("fp32", model_blocks(model.dims.to_dict()))


@pytest.mark.parametrize("open_shapes", [False, True])
def test_exported_graph_gives_funasr_classes_and_logits_on_every_call(ct_punc_model_dir: Path,
                                                                     open_shapes: bool) -> None:
    """Every call of every text (172 calls of 1-500 words), padded into its word container, or at its own length
    (the server's CPU runs: load_punctuator)."""
    directory = read_model_directory(ct_punc_model_dir)
    bound = scaled_err_bound("fp32", model_blocks(directory.manifest.dimensions))
    graph = PunctuationGraph(directory.onnx_path("fp32"), open_shapes=open_shapes)
    assert load_punctuator(directory).logits.open_shapes
    worst, calls = 0.0, 0
    for name in TEXTS:
        for ids, expected in zip(REFERENCE[name]["calls"], call_logits(name)):
            ours = graph(np.asarray(ids))
            assert np.array_equal(ours.argmax(-1), expected.argmax(-1)), (name, len(ids))
            worst, calls = max(worst, scaled_errors(expected, ours)), calls + 1
    assert calls == 172 and worst <= bound, worst


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_punctuated_text_is_funasr_s(ct_punc_model_dir: Path, precision: str) -> None:
    """fp32: FunASR's text, classes and calls on every text. int8 keeps FunASR's text on most of them (its
    classes may turn a near tie of random weights) and the same number of classes on all."""
    punctuator = load_punctuator(ct_punc_model_dir, precision)
    same = 0
    for name, expected in REFERENCE.items():
        result = punctuator.punctuate(expected["text"])
        if precision == "fp32":
            assert (result.text, [list(c) for c in result.calls]) == (expected["funasr_text"], expected["calls"])
            assert (None if result.classes is None else list(result.classes)) == expected["punc_array"]
        assert len(result.classes or ()) == len(expected["punc_array"] or ())
        same += result.text == expected["funasr_text"]
    assert same >= 0.8 * len(REFERENCE)


def test_verify_passes_with_every_word_container(ct_punc_model_dir: Path) -> None:
    report = verify(read_model_directory(ct_punc_model_dir), None, "cpu", words=(1, 20, 33), containers=(32, 64))
    assert report["passed"] and report["tokens_equal"] and report["static_shapes"] and not report["forbidden_ops"]
    for entry in report["precisions"].values():
        assert all(r["token_containers_identical"] for r in entry["lengths"].values())
    assert report["max_scaled_err"] <= 1e-5 and report["precisions"]["int8"]["agreement"]["passed"]


def test_the_engine_refuses_a_punctuation_model_by_name(ct_punc_model_dir: Path) -> None:
    with pytest.raises(ModelLoadError, match="is a punctuation model .* not a speech recogniser"):
        Engine(ct_punc_model_dir)


def test_a_jieba_dictionary_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """FunASR splits Chinese into jieba's words when the directory holds one: not ported, refused before export."""
    checkpoint = tmp_path / "released"
    shutil.copytree(FIXTURE, checkpoint)
    (checkpoint / "jieba_usr_dict").write_text("的 3\n", encoding="utf-8")
    out = tmp_path / "out"
    assert main(["ct-punc", "--checkpoint", str(checkpoint), "--out", str(out)]) == 1
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "jieba dictionary" in error[0] and not out.exists()


@pytest.mark.parametrize("edit, message", [
    (lambda d: (d / "tokens.json").unlink(), "tokens.json is missing"),
    (lambda d: (d / "config.yaml").write_text("model: Paraformer\n", encoding="utf-8"), "model 'Paraformer'"),
    (lambda d: (d / "tokens.json").write_text('["a", "b"]', encoding="utf-8"), "has 2 tokens"),
])
def test_a_directory_that_is_not_ct_punc_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture, edit,
                                                    message: str) -> None:
    checkpoint = tmp_path / "released"
    shutil.copytree(FIXTURE, checkpoint)
    edit(checkpoint)
    assert main(["ct-punc", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "out")]) == 1
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and message in error[0] and not (tmp_path / "out").exists()


def test_the_full_sizes_synthetic_vocabulary_can_be_written() -> None:
    """--random-init full: 272,727 words, past the surrogates (which UTF-8 cannot write) without them."""
    from export.ct_punc import synthetic_tokens
    from models.ct_punc import CTPuncDimensions

    tokens = synthetic_tokens(CTPuncDimensions.preset("full").vocab_size)
    assert len(tokens) == len(set(tokens)) == 272727 and tokens[-1] == "<unk>"
    "\n".join(tokens).encode("utf-8")
    assert synthetic_tokens(96)[3:5] == ["一", "丁"]  # the tiny size's as before
