"""Paraformer graph outputs -> text and token times, by FunASR's rules for paraformer-zh.

The graph (models/paraformer.py, exported by `python -m export paraformer`) already picks the decoder's
best token per position; this module only turns ids into text and CIF peaks into times:

    text   FunASR's sentence_postprocess, ported line by line with its quirks (see `_join_pieces`): <s>,
           </s>, <unk> dropped; "xx@@" pieces join the next English piece; Chinese characters (and
           digits) are written without spaces, English words with one space between them; runs of single
           letters ("a b c") become one upper-case abbreviation ("ABC"). Word times are its time list,
           which pairs with the words by position. Checked against FunASR on 5000 generated sequences.
    times  FunASR's ts_prediction_lfr6_standard as Paraformer.inference calls it (upsample rate 1, the
           CIF peaks as its weights, made from the alphas as its cif_v1 makes them): the peaks are rescaled
           to sum to tokens + 1 (by torch's float32 sum, bit for bit) and integrated again; each firing
           frame, shifted by -1.5 frames, starts a token and the next one ends it; a token longer than
           12 frames (0.72 s) is cut, the rest being silence; leading silence over 5 frames is skipped,
           and the last token ends halfway into a trailing silence over 5 frames. Checked against FunASR's
           own inference on real speech: bench/paraformer_text_check.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ...audio import OUTPUT_FRAME_SECONDS
from ...transcript import TokenTiming, Transcript


FILTERED_IDS = (0, 1, 2)  # Paraformer.inference drops blank_id, sos and eos (its defaults) before anything
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
    peaks: np.ndarray  # float32 [frames + 1]: CIF fires, exact (times use inference_peaks, rounded as FunASR)

    @classmethod
    def from_graph(cls, outputs: Sequence[np.ndarray], row: int = 0) -> ParaformerOutput:
        ids, logprobs, counts, alphas, peaks, peak_lengths = outputs
        count, frames = int(counts[row]), int(peak_lengths[row])
        return cls(ids[row, :count], logprobs[row, :count], alphas[row, :frames], peaks[row, :frames])


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


# torch's CPU sum of a float32 vector (ATen's SumKernel.cpp, cascade_sum): the rescale below divides by
# FunASR's `alphas.sum()`, and a sum rounded otherwise (numpy's pairwise, float64) moves a fire by a frame.
SUM_LANES = 8  # ATen's Vec<float> in that kernel: torch on AVX2, AVX-512 (checked) and NEON builds
SUM_ROWS = 4  # its ilp_factor: the vectors are summed as 4 interleaved rows
SUM_LEVELS = 4  # its cascade: partial sums of 2^level_power rows are carried up 4 levels


def _cascade(rows: np.ndarray) -> np.ndarray:
    """ATen's multi_row_sum over rows [size, ...] (float32): the sum of each column, by its cascade."""
    size = len(rows)
    power = max(4, (size - 1).bit_length() // SUM_LEVELS if size > 1 else 0)
    step, mask = 1 << power, (1 << power) - 1
    acc = np.zeros((SUM_LEVELS,) + rows.shape[1:], np.float32)
    i = 0
    while i + step <= size:
        for row in rows[i:i + step]:
            acc[0] = acc[0] + row
        i += step
        for level in range(1, SUM_LEVELS):
            acc[level], acc[level - 1] = acc[level] + acc[level - 1], 0
            if i & (mask << (level * power)):
                break
    for row in rows[i:]:
        acc[0] = acc[0] + row
    for level in range(1, SUM_LEVELS):
        acc[0] = acc[0] + acc[level]
    return acc[0]


def torch_sum(values: np.ndarray) -> np.float32:
    """`tensor.sum()` of a contiguous float32 vector on the CPU, bit for bit: vectors of SUM_LANES summed as
    SUM_ROWS interleaved rows by the cascade, the leftover vectors into the first row, the rows together,
    then the leftover scalars and the lanes in order (a vector shorter than SUM_LANES: the same on scalars)."""
    x = values.astype(np.float32)
    lanes = SUM_LANES if len(x) >= SUM_LANES else 1
    vectors = x[:len(x) // lanes * lanes].reshape(-1, lanes)
    rows = len(vectors) // SUM_ROWS
    partial = _cascade(vectors[:rows * SUM_ROWS].reshape(rows, SUM_ROWS, lanes))
    for vector in vectors[rows * SUM_ROWS:]:
        partial[0] = partial[0] + vector
    for k in range(1, SUM_ROWS):
        partial[0] = partial[0] + partial[k]
    total = np.float32(0.0)
    for value in list(x[len(vectors) * lanes:]) + list(partial[0]):
        total = np.float32(total + value)
    return total


def inference_peaks(alphas: np.ndarray) -> np.ndarray:
    """The CIF peaks FunASR's inference times tokens from: CifPredictorV2's cif_v1 (threshold 1) takes the
    running sum of the weights in float64 and casts it to float32 before its fractional part, so its peaks
    carry that float32 rounding (up to 3e-5 once the sum is in the hundreds). The graph's peaks are exact
    (models/cif.py); the timestamp rule below rescales the peaks and tests them against 1 - 1e-4, where that
    rounding moves a fire by a frame, so the times are taken from FunASR's peaks, made here from the alphas."""
    total = np.cumsum(alphas.astype(np.float64)).astype(np.float32)
    whole = np.floor(total)
    fired = (whole > np.concatenate([np.zeros(1, np.float32), whole[:-1]])).astype(np.float32)
    return (fired + total) - whole  # FunASR's order of operations, in float32


def token_times_ms(alphas: np.ndarray, peaks: np.ndarray, count: int) -> list[tuple[int, int]]:
    """Milliseconds [start, end) of each token from the clip's start, as FunASR computes them; can be
    shorter than `count` when the rescaled peaks fire fewer times than FunASR expects."""
    if count <= 0:
        return []
    frame = OUTPUT_FRAME_SECONDS  # FunASR's TIME_RATE at upsample rate 1, 0.06 exactly as it computes it
    fire_place = np.flatnonzero(alphas >= FIRE_THRESHOLD) + FORCE_TIME_SHIFT
    weights = peaks.astype(np.float32)
    if len(fire_place) != count + 1:
        weights = weights / np.float32(torch_sum(weights) / np.float32(count + 1))
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


# --- text: a line-by-line port of FunASR 1.4.16's funasr/utils/postprocess_utils.py ---------------------------
# Its quirks are kept on purpose (the peer comparison in docs/benchmarks.md is against FunASR's output), and
# tests/pipeline/test_paraformer_decoding.py checks every one against FunASR on thousands of random sequences.

def _is_chinese(text: str) -> bool:
    """FunASR's isChinese. It compares the whole string, not each character: on a piece such as "2024" or
    "鎝ab" the comparison is lexicographic, so "0abc" counts as Chinese and "9a" does not."""
    return "\u4e00" <= text <= "\u9fff" or "0" <= text <= "9" or text == "@"


def _clean(text: str) -> str:
    """isAllChinese and isAllAlpha look at each item less spaces and the specials, as substrings."""
    for mark in (" ", "</s>", "<s>", "<unk>", "<OOV>"):
        text = text.replace(mark, "")
    return text


def _all_chinese(items: Sequence[str]) -> bool:
    """FunASR's isAllChinese: on the piece list it tests each piece, on one piece each of its characters."""
    return bool(items) and all(_is_chinese(_clean(item)) for item in items)


def _all_alpha(items: Sequence[str]) -> bool:
    """FunASR's isAllAlpha: letters (any script but CJK) or the apostrophe alone. A "xx@@" piece is not."""
    cleaned = [_clean(item) for item in items]
    return bool(cleaned) and all((c.isalpha() or c == "'") and not (c.isalpha() and _is_chinese(c)) for c in cleaned)


Span = tuple[int, int]  # milliseconds [start, end)


def _join_pieces(pieces: list[str], times: Sequence[Span]) -> tuple[list[str], list[Span]]:
    """sentence_postprocess's three branches: its word list (" " after each English word) and its time list.

    The time list is not one entry per word; FunASR pairs them by position all the same (see postprocess)."""
    def time(i: int) -> Span | None:  # FunASR assumes a time for every piece and would raise IndexError
        return tuple(times[i]) if i < len(times) else None

    if _all_chinese(pieces):  # every piece a word; the token times as they came, <unk>'s included
        return [p.replace(" ", "") for p in pieces], list(times)
    words: list[str] = []
    spans: list[Span] = []
    if _all_alpha(pieces):  # every piece an English word with its own time
        for i, piece in enumerate(pieces):
            words += [piece, " "]
            if time(i) is not None:
                spans.append(time(i))
        return words, spans
    # Mixed: "xx@@" pieces gather in `pending` until an English piece ends the word. Quirks, all FunASR's:
    # - a Chinese piece removes the last item if the last *word* piece was English, even when punctuation
    #   came after it ("hello" "," "你" -> "hello你": the comma is popped, not the space);
    # - only an English piece clears `alpha_blank`'s space rule and takes `pending`; after "xx@@" pieces a
    #   Chinese piece keeps the space before them ("yugolo" "tiel@@" "蕱" "ab" -> "yugolo 蕱tielab"), and
    #   `pending` is lost when no English piece follows ("kj@@" "2024" -> "2024");
    # - a Chinese piece after "xx@@" pieces gets their time (first start, last end), and the word they
    #   start later gets only its last piece's time;
    # - punctuation and other pieces get no time at all, so every later word takes the next one's.
    pending, alpha_blank, fresh = "", False, True  # fresh: FunASR's ts_flag, read this piece's time
    begin, end = -1, -1
    for i, piece in enumerate(pieces):
        if fresh and time(i) is not None:
            begin, end = time(i)
        if _all_chinese(piece):
            if alpha_blank:
                words.pop()
            words.append(piece)
            alpha_blank, fresh = False, True
            spans.append((begin, end))
        elif JOIN_MARK in piece:
            pending += piece.replace(JOIN_MARK, "")
            alpha_blank, fresh = False, False
            end = time(i)[1] if time(i) is not None else end
        elif _all_alpha(piece):
            words += [pending + piece, " "]
            pending, alpha_blank, fresh = "", True, True
            end = time(i)[1] if time(i) is not None else end
            spans.append((begin, end))
        else:
            words.append(piece)
    return words, spans


def _is_letter(item: str) -> bool:
    """abbr_dispose's test, `len(w) == 1 and w.encode('utf-8').isalpha()`: one ASCII letter."""
    return len(item) == 1 and item.isascii() and item.isalpha()


def _abbreviations(words: list[str], spans: list[Span]) -> tuple[list[str], list[Span]]:
    """FunASR's abbr_dispose: runs of single letters with spaces between ("a b c") become one upper-case
    word ("ABC"). Times are looked up by the count of non-space items before each word, whether or not
    the time list has one entry per word (FunASR skips the time of a word past its end)."""
    out, out_spans = [], []
    index = 0  # FunASR's ts_nums[num]: non-space items before this one
    i = 0
    while i < len(words):
        j = i
        while _is_letter(words[j]) and j + 2 < len(words) and words[j + 1] == " " and _is_letter(words[j + 2]):
            j += 2
        if j > i:  # letters i, i + 2, ..., j: their first start and last end
            out.append("".join(words[k] for k in range(i, j + 1, 2)).upper())
            last = index + (j - i) // 2
            if last < len(spans):  # (FunASR raises IndexError when its start is missing too)
                out_spans.append((spans[index][0], spans[last][1]))
            index, i = last + 1, j + 1
            continue
        out.append(words[i])
        if words[i] != " ":
            if index < len(spans):
                out_spans.append(spans[index])
            index += 1
        i += 1
    return out, out_spans


def postprocess(pieces: Sequence[str], times: Sequence[Span]) -> tuple[list[str], list[Span]]:
    """FunASR's sentence_postprocess: the text's items (words, and " " before an English word that follows
    one, so "".join is FunASR's text) and FunASR's time list, which pairs with the words by position and can
    be shorter than them. `times` are the token times of `pieces`, specials included."""
    kept = [p for p in pieces if p not in ("<s>", "</s>", "<unk>", "<OOV>")]  # times keep their indexes
    words, spans = _abbreviations(*_join_pieces(kept, times))
    while words and words[-1] == " ":  # FunASR strips the text; its text has no " " item first
        words.pop()
    items = [(" " + w if prev == " " else w) for prev, w in zip([""] + words, words) if w != " "]
    return items, spans


def decode_paraformer(output: ParaformerOutput, tokens: Sequence[str], offset: float = 0.0) -> Transcript:
    """Text, tokens (the words with the spaces of the text, so "".join is the text) and words, with times
    in seconds from `offset`, the time of the clip's first sample."""
    ids = [i for i in output.token_ids.tolist() if i not in FILTERED_IDS]
    pieces = [tokens[i] if 0 <= i < len(tokens) else "<unk>" for i in ids]
    # ts_prediction_lfr6_standard times every piece but a last "</s>"; <unk> has a time it never shows.
    count = len(pieces) - (bool(pieces) and pieces[-1] == "</s>")
    items, spans = postprocess(pieces, token_times_ms(output.alphas, inference_peaks(output.alphas), count))
    timed: list[TokenTiming] = []
    previous_end = 0
    for k, text in enumerate(items):
        # A word past the end of FunASR's time list (punctuation took none) starts where the last one ended.
        start, end = spans[k] if k < len(spans) else (previous_end, previous_end)
        # FunASR's -1.5 frame shift can put the first token before the clip; it starts at the clip instead.
        start, end = max(start, 0), max(end, 0)
        previous_end = end
        # max(0): a clip may begin before the stream does (trim.STREAM_START_LEAD); no word does
        timed.append(TokenTiming(text, round(max(0.0, offset + start / 1000), 6),
                                 round(max(0.0, offset + end / 1000), 6)))
    text = "".join(t.text for t in timed)
    words = tuple(TokenTiming(t.text.strip(), t.start, t.end) for t in timed)
    return Transcript(text=text, tokens=tuple(timed), words=words)
