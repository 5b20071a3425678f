"""FunASR's own tiny CT-Transformer and its `inference` on generated texts (tests/fixtures/ct_punc, written by
tests/fixtures/make_ct_punc_fixture.py in an environment with funasr): what the punctuation tests compare with.

REFERENCE: text name -> {"text", "words" (split_words), "funasr_text", "punc_array", "calls" (each call's ids)};
LOGITS: "call_<name>_<n>" -> FunASR's logits [words, classes] of that call; `replay(name)` hands them back in
order, as a Punctuator's `logits` (the text side alone, without any graph).
"""
from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path

import numpy as np
import yaml

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "ct_punc"
CONFIG = json.loads((FIXTURE / "config.json").read_text(encoding="utf-8"))
MODEL_CONF = yaml.safe_load((FIXTURE / "config.yaml").read_text(encoding="utf-8"))["model_conf"]
TOKENS = json.loads((FIXTURE / "tokens.json").read_text(encoding="utf-8"))
with gzip.open(FIXTURE / "reference.json.gz", "rt", encoding="utf-8") as _file:
    REFERENCE = json.load(_file)
LOGITS = dict(np.load(FIXTURE / "logits.npz"))


def call_logits(name: str) -> list[np.ndarray]:
    """FunASR's logits of each call of the text `name`, in order."""
    return [LOGITS[f"call_{name}_{n}"] for n in range(len(REFERENCE[name]["calls"]))]


def replay(name: str):
    """A Punctuator's `logits` that answers each call with FunASR's logits of the same call of `name`."""
    calls = itertools.count()
    return lambda ids: LOGITS[f"call_{name}_{next(calls)}"]
