"""Every precision's answers against fp32's on the same clips (issue 40), for `python -m export verify`.

Each family's verify fills one ClipOutput per clip and precision, each clip run alone (not padded: padding
is verify's other check); `agreement` compares a precision's with fp32's and judges them by the family's
AgreementBound; `add_agreement` puts the result in verify's report (each precision's "agreement", and its
"passed"). A family without a bound is not compared yet.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.audio import SAMPLE_RATE

REFERENCE_PRECISION = "fp32"  # every other precision's answers are compared with this one's


@dataclass(frozen=True)
class ClipOutput:
    """What one precision answers on one clip, for comparing precisions (every family fills one per clip).

    tokens: the greedy token ids. scores: log-probs (or logits), one row per token or frame, compared over
    the rows both precisions have. count: a length the model predicts before decoding, bounded relative to
    the reference's (Paraformer's CIF token count); None where the length is just len(tokens). aligned: named
    values on a grid both precisions share (Paraformer's CIF weights, one per encoder frame), compared whole."""

    tokens: tuple[int, ...]
    scores: np.ndarray
    count: int | None = None
    aligned: tuple[tuple[str, np.ndarray], ...] = ()


@dataclass(frozen=True)
class AgreementBound:
    """What a faithful quantisation of one family keeps on every clip (None: reported, not bounded)."""

    max_count_change: float | None = None  # |count - reference| / reference, at least one unit allowed
    min_token_agreement: float | None = None  # 1 - edit distance / reference tokens
    max_logprob_err: float | None = None  # max |score - reference score| over the common rows


@dataclass(frozen=True)
class PrecisionAgreement:
    """One precision against the reference precision (fp32) on the same clips: the worst clip of each figure."""

    precision: str
    reference: str
    clips: tuple[str, ...]
    counts: tuple[tuple[int, int], ...]  # (reference, precision) per clip
    max_count_change: float
    token_agreement: float
    max_logprob_err: float
    max_aligned_err: tuple[tuple[str, float], ...]
    bound: AgreementBound
    passed: bool

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["counts"] = dict(zip(self.clips, (list(c) for c in self.counts)))
        data["max_aligned_err"] = dict(self.max_aligned_err)
        del data["clips"]
        return data


def agreement(precision: str, outputs: dict[str, ClipOutput], reference: dict[str, ClipOutput],
              bound: AgreementBound, reference_name: str = "fp32") -> PrecisionAgreement:
    """Compare `precision`'s per-clip outputs with the reference precision's on the same clips."""
    from .evaluate import edit_distance

    clips = tuple(reference)
    counts, changes, agreements, logprob_errs, aligned_errs = [], [], [], [], {}
    for clip in clips:
        ref, out = reference[clip], outputs[clip]
        ref_count, count = (len(ref.tokens), len(out.tokens)) if ref.count is None else (ref.count, out.count)
        counts.append((ref_count, count))
        # A count is a whole number: one unit is the least a change can be, whatever the relative bound.
        changes.append(abs(count - ref_count) / max(ref_count, 1))
        agreements.append(1.0 - edit_distance(ref.tokens, out.tokens) / max(len(ref.tokens), 1))
        rows = min(len(ref.scores), len(out.scores))
        logprob_errs.append(float(np.abs(ref.scores[:rows].astype(np.float64) - out.scores[:rows]).max(initial=0.0)))
        for (name, a), (_, b) in zip(ref.aligned, out.aligned):
            err = float(np.abs(a.astype(np.float64) - b).max(initial=0.0)) if a.shape == b.shape else float("inf")
            aligned_errs[name] = max(aligned_errs.get(name, 0.0), err)
    passed = all(
        (bound.max_count_change is None or abs(n - r) <= max(1.0, bound.max_count_change * r)) for r, n in counts
    ) and (bound.min_token_agreement is None or min(agreements) >= bound.min_token_agreement) and (
        bound.max_logprob_err is None or max(logprob_errs) <= bound.max_logprob_err)
    return PrecisionAgreement(precision, reference_name, clips, tuple(counts), max(changes), min(agreements),
                              max(logprob_errs), tuple(sorted(aligned_errs.items())), bound, passed)


def add_agreement(report: dict, outputs: dict[str, dict[str, ClipOutput]], bound: AgreementBound, reference) -> None:
    """Each verified precision other than fp32 against fp32 on the same clips: its entry's "agreement", and
    its "passed" only if the agreement meets `bound`. `reference()` gives fp32's outputs when fp32 itself was
    not verified (None when the directory has no fp32)."""
    compared = [p for p in outputs if p != REFERENCE_PRECISION]
    if not compared:
        return
    reference = outputs.get(REFERENCE_PRECISION) or reference()
    for precision in compared:
        entry = report["precisions"][precision]
        if reference is None:
            entry["agreement"] = None  # nothing to compare with: said, not failed (an fp16-only GPU export)
            continue
        result = agreement(precision, outputs[precision], reference, bound, REFERENCE_PRECISION)
        entry["agreement"] = result.to_dict()
        entry["passed"] = entry["passed"] and result.passed


def read_clips(paths: tuple[Path, ...], container_samples: int) -> dict[str, np.ndarray]:
    """--agreement-audio: 16 kHz mono WAV files by file name, each at most the container long."""
    import soundfile

    clips = {}
    for path in paths:
        try:
            audio, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
        except (OSError, RuntimeError, soundfile.LibsndfileError) as exc:
            raise ValueError(f"{path}: not a readable audio file ({exc})") from None
        if rate != SAMPLE_RATE or len(audio) > container_samples or len(audio) < SAMPLE_RATE // 10:
            raise ValueError(f"{path}: expected {SAMPLE_RATE} Hz audio of 0.1 s to the container's "
                             f"{container_samples / SAMPLE_RATE:g} s, got {rate} Hz, {len(audio) / rate:.2f} s")
        clips[path.name] = audio.mean(axis=1)
    return clips
