"""The punctuation side of `python -m export verify`: a sentence padded gives what it gives alone.

For each test length (1 to 300 words: one word alone against a container of 32 is where the sums differ most;
300 passes the largest default call), seeded random ids of the vocabulary run once alone (the graph at exactly
their length) and once in every word container that holds them (pipeline/shapes.py), with garbage after them
(ids far past the vocabulary, which the graph must ignore); in fp32 also as row 0 of a batch of BATCH_ROWS
whose other rows hold other ids (batch invariance). What must agree: each word's class exactly, its logits
within verify's bound (scaled error, cosine). int8 too, and its answers alone against fp32's within
AGREEMENT (export/agreement.py). Reported in verify.py's shape, so the summary, thresholds and exit status
are shared; the static-shape check runs with every container fixed.
"""
from __future__ import annotations

import numpy as np

from pipeline.modeldir import PUNCTUATION_FREE_DIMENSIONS, PUNCTUATION_INPUT_NAMES, ModelDirectory
from pipeline.shapes import DEFAULT_PUNCTUATION_CONTAINERS

from .agreement import AgreementBound, ClipOutput, add_agreement
from .graph_rules import rules_entry
from .onnx_export import non_static_shapes, op_histogram
from .verify import BATCH_ROWS, TIE_MARGIN, _passed, errors, make_session, model_blocks, summarise

DEFAULT_WORDS = (1, 2, 5, 20, 33, 100, 300)
GARBAGE_ID = 1 << 30  # past any vocabulary: a graph that looked it up would fail or read another row
# int8 against fp32, as SenseVoice's CTC frames (verify.CTC_AGREEMENT): each word's class is a row's argmax.
AGREEMENT = AgreementBound(min_token_agreement=0.85, max_reference_token_err=0.5, tie_margin=TIE_MARGIN)


def word_ids(words: int, vocab: int) -> np.ndarray:
    return np.random.default_rng(words).integers(0, vocab, words).astype(np.int32)


def run(session, rows: np.ndarray, lengths: list[int]) -> np.ndarray:
    """Row 0's logits [lengths[0], classes] of one run of `rows` [batch, words]."""
    feeds = dict(zip(PUNCTUATION_INPUT_NAMES, (rows.astype(np.int32), np.asarray(lengths, dtype=np.int32))))
    return session.run(None, feeds)[0][0, :lengths[0]]


def compare(alone: np.ndarray, padded: np.ndarray) -> dict:
    return {**errors(alone.astype(np.float64).ravel(), padded.astype(np.float64).ravel()),
            "tokens_equal": bool(np.array_equal(alone.argmax(-1), padded.argmax(-1))), "words": int(len(alone))}


def clip_output(logits: np.ndarray) -> ClipOutput:
    """One text's answer for comparing precisions: each word's class and its row of log-probabilities."""
    shifted = logits - logits.max(-1, keepdims=True)
    logprobs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    return ClipOutput(tuple(logits.argmax(-1).tolist()), logprobs, collapse=lambda best: tuple(best.tolist()))


def verify(directory: ModelDirectory, precisions: list[str] | None, device: str, words: tuple[int, ...] = DEFAULT_WORDS,
           containers: tuple[int, ...] = DEFAULT_PUNCTUATION_CONTAINERS) -> dict:
    vocab = int(directory.manifest.dimensions["vocab_size"])
    precisions = precisions or sorted(directory.manifest.files)
    report: dict = {"model": str(directory.path), "container_seconds": 0.0, "device": device, "precisions": {},
                    "containers": list(containers)}
    outputs: dict[str, dict[str, ClipOutput]] = {}
    for precision in precisions:
        path = directory.onnx_path(precision)
        overrides = {k: dict(zip(PUNCTUATION_FREE_DIMENSIONS, (1, k))) for k in containers}
        alone_session = make_session(path, None, device)
        padded = {k: make_session(path, None, device, overrides=o) for k, o in overrides.items()}
        shapes = [f"{k} words: {s}" for k, o in overrides.items() for s in non_static_shapes(path, 0, o)]
        entry = {"ops": op_histogram(path), **rules_entry({"model": path}), "non_static_shapes": shapes[:20],
                 "lengths": {}}
        for n in words:
            ids = word_ids(n, vocab)
            alone = run(alone_session, ids[None], [n])
            outputs.setdefault(precision, {})[f"{n} words"] = clip_output(alone)
            results, answers = {}, []
            for k, session in padded.items():
                if k < n:
                    continue
                row = np.full((1, k), GARBAGE_ID, dtype=np.int64)
                row[0, :n] = ids
                answers.append(run(session, row, [n]))
                results[k] = compare(alone, answers[-1])
            worst = max(results.values(), key=lambda r: (not r["tokens_equal"], r["max_scaled_err"]))
            result = {**worst, "token_containers": {str(k): r["max_abs_err"] for k, r in results.items()},
                      "token_containers_identical": all(np.array_equal(answers[0], a) for a in answers[1:])}
            if precision != "int8":  # int8's activation ranges span the batch: it serves one text per call
                k = min(results)
                rows = np.stack([np.concatenate([ids, np.full(k - n, GARBAGE_ID)])]
                                + [word_ids(k + r, vocab)[:k] for r in range(1, BATCH_ROWS)])
                batch = make_session(path, None, device, overrides=dict(zip(PUNCTUATION_FREE_DIMENSIONS,
                                                                            (BATCH_ROWS, k))))
                batched = compare(alone, run(batch, rows, [n] + [k] * (BATCH_ROWS - 1)))
                result["batch"] = {key: batched[key] for key in ("max_abs_err", "max_scaled_err", "cosine",
                                                                 "tokens_equal")}
            entry["lengths"][f"{n} words"] = result
        entry["passed"] = _passed(precision, entry, model_blocks(directory.manifest.dimensions), device)
        report["precisions"][precision] = entry

    def reference() -> dict[str, ClipOutput] | None:
        if "fp32" not in directory.manifest.files:
            return None
        session = make_session(directory.onnx_path("fp32"), None, device)
        return {f"{n} words": clip_output(run(session, word_ids(n, vocab)[None], [n])) for n in words}

    add_agreement(report, outputs, AGREEMENT, reference)
    return summarise(report)
