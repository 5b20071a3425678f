"""Paraformer graph outputs -> text and token times, by FunASR's rules for paraformer-zh.

The graph (models/paraformer.py, exported by `python -m export paraformer`) already picks the decoder's
best token per position; this module only turns ids into text and CIF peaks into times:

    text   FunASR's sentence_postprocess: <s>, </s>, <unk> dropped; "xx@@" pieces join the next piece;
           Chinese characters (and digits) are written without spaces, English words with one space
           between them; runs of single letters ("a b c") become one upper-case abbreviation ("ABC").
    times  FunASR's ts_prediction_lfr6_standard as Paraformer.inference calls it (upsample rate 1, the
           CIF peaks as its weights): the peaks are rescaled to sum to tokens + 1 and integrated again;
           each firing frame, shifted by -1.5 frames, starts a token and the next one ends it; a token
           longer than 12 frames (0.72 s) is cut, the rest being silence; leading silence over 5 frames
           is skipped, and the last token ends halfway into a trailing silence over 5 frames.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .audio import OUTPUT_FRAME_SECONDS
from .decoding import TokenTiming, Transcript


DROPPED_TOKENS = frozenset({"<s>", "</s>", "<unk>", "<OOV>", "<blank>"})
JOIN_MARK = "@@"  # a piece ending the text of a word that the next piece continues
FIRE_THRESHOLD = 1.0 - 1e-4
FORCE_TIME_SHIFT = -1.5  # frames
START_END_THRESHOLD = 5  # frames
MAX_TOKEN_DURATION = 12  # frames


@dataclass(frozen=True)
class ParaformerOutput:
    """One clip's graph outputs, cut to their valid lengths."""

    token_ids: np.ndarray  # int32 [count]
    token_logprobs: np.ndarray  # float32 [count]
    alphas: np.ndarray  # float32 [frames + 1]: CIF weights, the tail frame last
    peaks: np.ndarray  # float32 [frames + 1]: CIF fires

    @classmethod
    def from_graph(cls, outputs: Sequence[np.ndarray], row: int = 0) -> ParaformerOutput:
        ids, logprobs, counts, alphas, peaks, peak_lengths = outputs
        count, frames = int(counts[row]), int(peak_lengths[row])
        return cls(ids[row, :count], logprobs[row, :count], alphas[row, :frames], peaks[row, :frames])


def is_chinese(piece: str) -> bool:
    """FunASR's isChinese over every character: CJK unified ideographs, ASCII digits and '@'."""
    return bool(piece) and all("\u4e00" <= c <= "\u9fff" or "0" <= c <= "9" or c == "@" for c in piece)


def is_alpha(piece: str) -> bool:
    return bool(piece) and all((c.isalpha() and not is_chinese(c)) or c == "'" for c in piece)


def cif_peaks(alphas: np.ndarray, threshold: float) -> np.ndarray:
    """FunASR's cif_wo_hidden on one row: the integrate after each frame, less `threshold` per fire (float32)."""
    integrate = np.float32(0.0)
    peaks = np.empty(len(alphas), np.float32)
    for t, alpha in enumerate(alphas.astype(np.float32)):
        integrate = np.float32(integrate + alpha)
        peaks[t] = integrate
        if integrate >= threshold:
            integrate = np.float32(integrate - np.float32(threshold))
    return peaks


def token_times_ms(alphas: np.ndarray, peaks: np.ndarray, count: int) -> list[tuple[int, int]]:
    """Milliseconds [start, end) of each token from the clip's start, as FunASR computes them; can be
    shorter than `count` when the rescaled peaks fire fewer times than FunASR expects."""
    if count <= 0:
        return []
    frame = OUTPUT_FRAME_SECONDS  # FunASR's TIME_RATE at upsample rate 1, 0.06 exactly as it computes it
    fire_place = np.flatnonzero(alphas >= FIRE_THRESHOLD) + FORCE_TIME_SHIFT
    weights = peaks.astype(np.float32)
    if len(fire_place) != count + 1:
        weights = weights / np.float32(weights.sum(dtype=np.float32) / np.float32(count + 1))
        fire_place = np.flatnonzero(cif_peaks(weights, FIRE_THRESHOLD) >= FIRE_THRESHOLD) + FORCE_TIME_SHIFT
    if not len(fire_place):
        return []
    num_frames = len(weights)
    spans: list[list[float]] = []  # [start, end] in seconds, as FunASR's timestamp_list
    is_token: list[bool] = []  # False for the silences FunASR writes as <sil>
    if fire_place[0] > START_END_THRESHOLD:
        spans.append([0.0, fire_place[0] * frame])
        is_token.append(False)
    for i in range(min(len(fire_place) - 1, count)):
        is_token.append(True)
        if fire_place[i + 1] - fire_place[i] <= MAX_TOKEN_DURATION:
            spans.append([fire_place[i] * frame, fire_place[i + 1] * frame])
        else:  # cut the token; the zero-weight frames after it are silence
            split = fire_place[i] + MAX_TOKEN_DURATION
            spans += [[fire_place[i] * frame, split * frame], [split * frame, fire_place[i + 1] * frame]]
            is_token.append(False)
    if num_frames - fire_place[-1] > START_END_THRESHOLD:
        middle = (num_frames + fire_place[-1]) * 0.5
        if spans:
            spans[-1][1] = middle * frame
        spans.append([middle * frame, num_frames * frame])
        is_token.append(False)
    elif spans:
        spans[-1][1] = num_frames * frame
    return [(int(a * 1000), int(b * 1000)) for (a, b), token in zip(spans, is_token) if token]


Item = tuple[str, int, int]  # (text, start ms, end ms); text " " is the space between two words


def _words(pieces: Sequence[str], times: Sequence[tuple[int, int]]) -> list[Item]:
    """FunASR's sentence_postprocess (its mixed-script loop, which the pure cases agree with): words and
    the spaces between them. A "xx@@" piece waits for the next alphabetic piece; its time starts the word.
    Times follow FunASR's timestamp bookkeeping in the same loop."""
    items: list[Item] = []
    pending, begin, held_end = "", None, 0
    for piece, (start, end) in zip(pieces, times):
        if piece in DROPPED_TOKENS or not piece:
            continue
        if is_chinese(piece):
            if items and items[-1][0] == " ":  # no space between an English word and a Chinese character
                items.pop()
            # After a "xx@@" piece FunASR gives the character that piece's time (its timestamp quirk).
            items.append((piece, start, end) if begin is None else (piece, begin, held_end))
            begin = None
        elif JOIN_MARK in piece:
            pending += piece.replace(JOIN_MARK, "")
            begin, held_end = (start if begin is None else begin), end
        elif is_alpha(piece):
            items += [(pending + piece, start if begin is None else begin, end), (" ", end, end)]
            pending, begin = "", None
        else:  # punctuation and other scripts: as they are, with their own time
            items.append((piece, start, end))
    return _abbreviations(items)


def _abbreviations(items: list[Item]) -> list[Item]:
    """FunASR's abbr_dispose: single ASCII letters separated by spaces become one upper-case word."""
    def letter(i: int) -> bool:
        return 0 <= i < len(items) and len(items[i][0]) == 1 and items[i][0].isascii() and items[i][0].isalpha()

    out: list[Item] = []
    i = 0
    while i < len(items):
        j = i
        while letter(j) and j + 2 < len(items) and items[j + 1][0] == " " and letter(j + 2):
            j += 2
        if j > i:
            text = "".join(items[k][0] for k in range(i, j + 1, 2)).upper()
            out.append((text, items[i][1], items[j][2]))
            i = j + 1
        else:
            out.append(items[i])
            i += 1
    return out


def decode_paraformer(output: ParaformerOutput, tokens: Sequence[str], offset: float = 0.0) -> Transcript:
    """Text, tokens (the words with the spaces of the text, so "".join is the text) and words, with times
    in seconds from `offset`, the time of the clip's first sample."""
    ids = output.token_ids.tolist()
    pieces = [tokens[i] if 0 <= i < len(tokens) else "<unk>" for i in ids]
    kept = [p for p in pieces if p not in DROPPED_TOKENS]
    times = token_times_ms(output.alphas, output.peaks, len(kept))
    times = times + [times[-1] if times else (0, 0)] * (len(kept) - len(times))
    timed: list[TokenTiming] = []
    space = ""
    for text, start, end in _words(kept, times):
        if text == " ":
            space = " "
            continue
        # FunASR's -1.5 frame shift can put the first token before the clip; it starts at the clip instead.
        start, end = max(start, 0), max(end, 0)
        timed.append(TokenTiming(space + text, round(offset + start / 1000, 6), round(offset + end / 1000, 6)))
        space = ""
    if timed:
        timed[0] = TokenTiming(timed[0].text.lstrip(), timed[0].start, timed[0].end)
    text = "".join(t.text for t in timed)
    words = tuple(TokenTiming(t.text.strip(), t.start, t.end) for t in timed)
    return Transcript(text=text, tokens=tuple(timed), words=words)
