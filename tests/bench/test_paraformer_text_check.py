"""bench.paraformer_text_check: its mixed vocabulary, and its comparison on FunASR's recorded outputs (the
fixture clip through FunASR's own inference, tests/fixtures/paraformer) against our engine (conftest's
`paraformer_model_dir`, the same weights exported)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from bench.paraformer_text_check import compare, decoded, mixed_vocabulary, our_side
from export.paraformer import synthetic_tokens
from pipeline.families.paraformer.decoding import FILTERED_IDS, ParaformerOutput

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "paraformer"


def test_the_mixed_vocabulary_names_every_id_once_with_every_kind_of_piece() -> None:
    tokens = synthetic_tokens(8404)
    mixed = mixed_vocabulary(tokens)
    assert len(mixed) == len(tokens) == len(set(mixed)) and mixed == mixed_vocabulary(tokens)
    assert mixed[:3] == tokens[:3] and mixed[-1] == "<unk>"
    pieces = set(mixed)
    assert any(p.endswith("@@") for p in pieces) and any(len(p) == 1 and p.isascii() and p.isalpha() for p in pieces)
    assert {",", "。"} <= pieces and any(p.isdigit() for p in pieces) and any("\u4e00" <= p <= "\u9fff" for p in pieces)


def test_our_engine_equals_funasrs_recorded_text_words_and_times(paraformer_model_dir) -> None:
    config = json.loads((FIXTURE / "config.json").read_text(encoding="utf-8"))
    reference = np.load(FIXTURE / "reference.npz")
    tokens = json.loads((FIXTURE / "tokens.json").read_text(encoding="utf-8"))
    clip = str(FIXTURE / "audio.wav")
    ids = [int(i) for i in reference["token_ids"] if int(i) not in FILTERED_IDS]
    cif = ParaformerOutput(np.array(ids, np.int32), np.zeros(len(ids), np.float32), reference["alphas"],
                           reference["peaks"])
    result = config["result"]
    funasr = [{"clip": clip, "vocabulary": "model", "ids": ids, "text": result["text"],
               "words": result["text_with_timestamps"], "times": result["timestamp"],
               "ours_on_funasr_ids": decoded(cif, tokens)}]
    summary = compare(funasr, our_side(paraformer_model_dir, [clip]))
    row = summary["details"][0]
    assert row["ids_equal"] and row["text_given_ids_equal"] and row["words_given_ids_equal"], row
    assert row["text_equal"] and row["words_equal"] and row["times_max_ms"] == 0, row
    assert "@@" not in row["our_text"] and " " in row["our_text"]  # English words and a joined piece were exercised
