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
from typing import Callable

import numpy as np

from pipeline.audio import SAMPLE_RATE

REFERENCE_PRECISION = "fp32"  # every other precision's answers are compared with this one's


@dataclass(frozen=True)
class ClipOutput:
    """What one precision answers on one clip, for comparing precisions (every family fills one per clip).

    tokens: the greedy token ids. scores: log-probs (or logits), one row per token or frame, compared over
    the rows both precisions have (an autoregressive decoder's with the reference's tokens fed, so each row
    sees the same history: Qwen3-ASR's logits). count: a length the model predicts before decoding, bounded
    relative to the reference's (Paraformer's CIF token count); None where the length is just len(tokens).
    aligned: named values on a grid both precisions share (Paraformer's CIF weights, one per encoder frame;
    Qwen3-ASR's encoder output and prefill logits), compared whole."""

    tokens: tuple[int, ...]
    scores: np.ndarray
    count: int | None = None
    aligned: tuple[tuple[str, np.ndarray], ...] = ()
    # CTC: the tokens a row-wise choice of scores makes (the greedy collapse), so that ties can be broken the
    # reference's way before tokens are compared; None where the rows are the tokens' own (a decoder's)
    collapse: Callable[[np.ndarray], tuple[int, ...]] | None = None


@dataclass(frozen=True)
class AgreementBound:
    """What a faithful quantisation of one family keeps on every clip (None: reported, not bounded). Counts
    and shares of tokens are of whole units: one unit changed is always allowed (a 5-token clip with one
    near-tie flipped keeps 0.8 of its tokens; verify's 0.3-1 s clips are that short)."""

    max_count_change: float | None = None  # |count - reference| / reference, at least one unit allowed
    min_token_agreement: float | None = None  # 1 - edit distance / reference tokens
    # the share of the reference's tokens kept until the first difference: an autoregressive decoder's
    # tokens after one changed token follow another history, so only the prefix measures the precision
    min_tokens_kept: float | None = None
    max_logprob_err: float | None = None  # max |score - reference score| over the common rows
    # max |score - reference score| of the token the reference picks in each row: a CTC model's improbable
    # tokens' far tails move most and decide nothing (the trained SenseVoice demo's int8: 0.91 there, its
    # WER 2.72 % against fp32's 2.68 %)
    max_reference_token_err: float | None = None
    # A differing token the reference itself scored within tie_margin of its own choice (in its row, the same
    # history) is a tie the precision broke the other way, not a changed answer: tokens_kept runs to the first
    # difference that is not a tie, argmax_agreement counts ties as kept. Random weights are full of ties
    # (flat logits: the reference class's own init gives 151936 logits within a few tenths); a trained
    # model's answers are decided by far more. None: every difference counts.
    tie_margin: float | None = None


@dataclass(frozen=True)
class ClipAgreement:
    """One clip's figures (PrecisionAgreement holds the worst clip of each)."""

    tokens: int  # the reference's
    token_agreement: float
    tokens_kept: float  # to the first difference that is not a tie (the bound's tie_margin)
    argmax_agreement: float  # rows whose argmax is the reference's or ties it (fed the reference's tokens)
    max_logprob_err: float
    max_reference_token_err: float
    equal_prefix: float  # tokens_kept with every difference counted, ties included
    ties: int  # rows (fed the reference's tokens) whose argmax differs by a tie
    max_turned_lead: float  # the largest lead of the reference's choice over the precision's where they differ


@dataclass(frozen=True)
class PrecisionAgreement:
    """One precision against the reference precision (fp32) on the same clips: the worst clip of each figure."""

    precision: str
    reference: str
    clips: tuple[str, ...]
    counts: tuple[tuple[int, int], ...]  # (reference, precision) per clip
    max_count_change: float
    token_agreement: float
    tokens_kept: float
    argmax_agreement: float
    max_logprob_err: float
    max_reference_token_err: float
    max_aligned_err: tuple[tuple[str, float], ...]
    per_clip: tuple[ClipAgreement, ...]
    bound: AgreementBound
    passed: bool
    equal_prefix: float
    ties: int  # over every clip
    max_turned_lead: float

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["counts"] = dict(zip(self.clips, (list(c) for c in self.counts)))
        data["per_clip"] = dict(zip(self.clips, data["per_clip"]))
        data["max_aligned_err"] = dict(self.max_aligned_err)
        del data["clips"]
        return data


def is_tie(scores: np.ndarray, row: int, chosen: int, other: int, tie_margin: float | None) -> bool:
    """Whether the reference scored `other` within `tie_margin` of its `chosen` in `row` (never without a
    margin, or without a row of scores over the vocabulary to tell)."""
    if tie_margin is None or scores.ndim != 2 or row >= len(scores) or not 0 <= other < scores.shape[1]:
        return False
    return float(scores[row, chosen]) - float(scores[row, other]) <= tie_margin


def clip_agreement(ref: ClipOutput, out: ClipOutput, tie_margin: float | None = None) -> ClipAgreement:
    """`out`'s figures against the reference's `ref` on one clip (ties: AgreementBound.tie_margin)."""
    from .evaluate import edit_distance

    rows = min(len(ref.scores), len(out.scores))
    a, b = ref.scores[:rows].astype(np.float64), out.scores[:rows].astype(np.float64)
    diff = np.abs(a - b)
    ties, tokens, max_turned_lead = 0, out.tokens, 0.0
    if a.ndim == 2:  # [rows, vocab]: each row's choice
        picked, theirs = a.argmax(-1), b.argmax(-1)
        chosen_diff = np.take_along_axis(diff, picked[:, None], axis=-1)
        turned = picked != theirs
        # the reference's lead of its own choice over the precision's, in its own row (0 where they agree)
        leads = np.take_along_axis(a, picked[:, None], -1)[:, 0] - np.take_along_axis(a, theirs[:, None], -1)[:, 0]
        tied = turned & (leads <= tie_margin) if tie_margin is not None else np.zeros(rows, bool)
        ties, max_turned_lead = int(tied.sum()), float(leads[turned].max(initial=0.0))
        argmax_agreement = float(np.mean(~turned | tied)) if rows else 1.0
        if ref.collapse is not None and rows == len(out.scores):  # CTC: the answer with its ties broken fp32's way
            tokens = ref.collapse(np.where(tied, picked, theirs))
    else:  # one score per row (the token's own)
        chosen_diff, argmax_agreement = diff, 1.0
    same = [x == y for x, y in zip(ref.tokens, out.tokens)] + [False]  # a shorter answer differs where it ends
    expected = max(len(ref.tokens), 1)
    first = min(same.index(False), len(ref.tokens))
    equal_prefix = first / expected if ref.tokens else 1.0
    # A decoder's histories are the reference's up to its first difference, so its row there scored the other token.
    tie_first = (ref.collapse is None and first < min(len(ref.tokens), len(out.tokens))
                 and is_tie(ref.scores, first, ref.tokens[first], out.tokens[first], tie_margin))
    if ref.collapse is not None:
        same = [x == y for x, y in zip(ref.tokens, tokens)] + [False]
    kept = 1.0 if tie_first else min(same.index(False), len(ref.tokens)) / expected if ref.tokens else 1.0
    return ClipAgreement(len(ref.tokens), 1.0 - edit_distance(ref.tokens, tokens) / expected, kept, argmax_agreement,
                         float(diff.max(initial=0.0)), float(chosen_diff.max(initial=0.0)), equal_prefix, ties,
                         max_turned_lead)


def meets(bound: AgreementBound, counts: list[tuple[int, int]], clips: list[ClipAgreement]) -> bool:
    """Whether every clip meets every figure `bound` names."""
    def kept(share: float, tokens: int, least: float | None) -> bool:  # one token lost is always allowed
        return least is None or share >= least or (1.0 - share) * tokens <= 1.0 + 1e-9

    # A count is a whole number: one unit is the least a change can be, whatever the relative bound.
    return (all(bound.max_count_change is None or abs(n - r) <= max(1.0, bound.max_count_change * r) for r, n in counts)
            and all(kept(c.token_agreement, c.tokens, bound.min_token_agreement)
                    and kept(c.tokens_kept, c.tokens, bound.min_tokens_kept) for c in clips)
            and all(getattr(bound, b) is None or max(getattr(c, b) for c in clips) <= getattr(bound, b)
                    for b in ("max_logprob_err", "max_reference_token_err")))


def agreement(precision: str, outputs: dict[str, ClipOutput], reference: dict[str, ClipOutput],
              bound: AgreementBound, reference_name: str = "fp32") -> PrecisionAgreement:
    """Compare `precision`'s per-clip outputs with the reference precision's on the same clips."""
    clips = tuple(reference)
    counts, per_clip, aligned_errs = [], [], {}
    for clip in clips:
        ref, out = reference[clip], outputs[clip]
        counts.append((len(ref.tokens), len(out.tokens)) if ref.count is None else (ref.count, out.count))
        per_clip.append(clip_agreement(ref, out, bound.tie_margin))
        for (name, a), (_, b) in zip(ref.aligned, out.aligned):
            err = float(np.abs(a.astype(np.float64) - b).max(initial=0.0)) if a.shape == b.shape else float("inf")
            aligned_errs[name] = max(aligned_errs.get(name, 0.0), err)
    return PrecisionAgreement(
        precision, reference_name, clips, tuple(counts), max(abs(n - r) / max(r, 1) for r, n in counts),
        min(c.token_agreement for c in per_clip), min(c.tokens_kept for c in per_clip),
        min(c.argmax_agreement for c in per_clip), max(c.max_logprob_err for c in per_clip),
        max(c.max_reference_token_err for c in per_clip), tuple(sorted(aligned_errs.items())), tuple(per_clip),
        bound, meets(bound, counts, per_clip), min(c.equal_prefix for c in per_clip), sum(c.ties for c in per_clip),
        max(c.max_turned_lead for c in per_clip))


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


FIGURE_LINES = (  # (report key, bound key, how verify prints it)
    ("max_count_change", "max_count_change", "largest count change {:.1%}"),
    ("token_agreement", "min_token_agreement", "token agreement {:.1%}"),
    ("tokens_kept", "min_tokens_kept", "tokens kept until the first difference not a tie {:.1%}"),
    ("equal_prefix", None, "equal until the first difference {:.1%}"),
    ("argmax_agreement", None, "argmax agreement {:.1%}"),
    ("ties", None, "ties broken otherwise {}"),
    ("max_turned_lead", None, "largest lead turned {:.3g}"),
    ("max_logprob_err", "max_logprob_err", "max score error {:.3g}"),
    ("max_reference_token_err", "max_reference_token_err", "max error of the reference's token {:.3g}"),
)


def agreement_line(a: dict) -> str:
    """verify's line for one precision's agreement (PrecisionAgreement.to_dict): every figure, its bound
    where the family has one."""
    counts = ", ".join(f"{clip} {r}->{n}" for clip, (r, n) in a["counts"].items())
    figures = [text.format(a[key]) + (f" (bound {a['bound'][bound]:g})" if bound and a["bound"][bound] is not None
                                      else "") for key, bound, text in FIGURE_LINES]
    ties = a["bound"]["tie_margin"]
    figures += [f"ties: leads up to {ties:g}"] if ties is not None else []
    return (f"against {a['reference']}: counts {counts}; {', '.join(figures)}"
            + "".join(f", max {k} error {v:.3g}" for k, v in a["max_aligned_err"].items())
            + ("" if a["passed"] else " -- NOT MET"))


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
