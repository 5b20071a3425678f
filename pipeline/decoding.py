"""Greedy CTC decoding of SenseVoice log-probabilities into text, tags and token times.

    ids    = argmax over the vocabulary for each of the first `length` frames
    runs   = maximal stretches of one id; blanks dropped; each remaining run is one emitted token
    tags   = tokens written <|...|>: language, emotion, event (text-normalisation tags are dropped)
    text   = the other tokens joined as sentencepiece pieces ("▁" starts a word)

A token's time is its run of frames: frame f covers [(f - prompt_frames) * frame_seconds,
(f + 1 - prompt_frames) * frame_seconds) after `offset`, since the model's first `prompt_frames` output
rows belong to its prompt, not to the audio.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .audio import OUTPUT_FRAME_SECONDS, PROMPT_FRAMES

LANGUAGES = frozenset({"zh", "en", "yue", "ja", "ko", "nospeech", "auto"})
EMOTIONS = frozenset({"HAPPY", "SAD", "ANGRY", "NEUTRAL", "FEARFUL", "DISGUSTED", "SURPRISED", "EMO_UNKNOWN"})
TEXTNORMS = frozenset({"withitn", "woitn"})
SPECIAL_TOKENS = frozenset({"<unk>", "<s>", "</s>", "<blank>", "<pad>"})  # never part of the text
WORD_START = "\u2581"  # sentencepiece's "▁"
# A word of the context heard again may be timed this much after the context ends (it straddles the cut).
CONTEXT_SLACK = 0.1
_TAG = re.compile(r"<\|([^|<>]+)\|>")
_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # sentencepiece byte fallback


@dataclass(frozen=True)
class TokenTiming:
    text: str  # the piece with "▁" written as a leading space (" hello"), so "".join(texts) is the text
    start: float  # seconds, offset included
    end: float


@dataclass(frozen=True)
class Transcript:
    text: str
    language: str | None = None  # "en", "zh", ... (the tag's inner text); None when the model gave none
    emotion: str | None = None  # "NEUTRAL", "HAPPY", ...
    event: str | None = None  # "Speech", "BGM", "Laughter", ...
    tokens: tuple[TokenTiming, ...] = ()
    words: tuple[TokenTiming, ...] = ()  # tokens merged into words (each CJK character is a word)


def decode_ctc(
    logprobs: np.ndarray,
    length: int,
    tokens: Sequence[str],
    blank_id: int = 0,
    prompt_frames: int = PROMPT_FRAMES,
    frame_seconds: float = OUTPUT_FRAME_SECONDS,
    offset: float = 0.0,
) -> Transcript:
    """Greedy CTC: logprobs float [T, V] (any monotonic scores work), `length` valid frames <= T.

    `tokens[i]` is the text of id i. Times are seconds, `offset` being the time of the audio's first sample.
    """
    if logprobs.ndim != 2:
        raise ValueError(f"logprobs must be [frames, vocab], got shape {logprobs.shape}")
    if len(tokens) != logprobs.shape[1]:
        raise ValueError(f"{len(tokens)} tokens for a vocabulary of {logprobs.shape[1]}")
    length = max(0, min(int(length), logprobs.shape[0]))
    return decode_ids(np.argmax(logprobs[:length], axis=-1), length, tokens, blank_id, prompt_frames,
                      frame_seconds, offset)


def decode_ids(
    ids: np.ndarray,
    length: int,
    tokens: Sequence[str],
    blank_id: int = 0,
    prompt_frames: int = PROMPT_FRAMES,
    frame_seconds: float = OUTPUT_FRAME_SECONDS,
    offset: float = 0.0,
) -> Transcript:
    """Greedy CTC from the best token id of each frame, int [frames] (the graph's `best_ids`, or the
    argmax of the log-probs); the first `length` frames are valid. Times as in decode_ctc."""
    length = max(0, min(int(length), len(ids)))
    ids = np.asarray(ids[:length])
    if len(ids) and int(ids.max()) >= len(tokens):
        raise ValueError(f"token id {int(ids.max())} outside a vocabulary of {len(tokens)}")
    if not length:
        return Transcript(text="")
    change = np.empty(length, bool)
    change[0] = True
    np.not_equal(ids[1:], ids[:-1], out=change[1:])
    starts = np.flatnonzero(change)
    ends = np.append(starts[1:], length)  # exclusive
    keep = ids[starts] != blank_id
    starts, ends, run_ids = starts[keep], ends[keep], ids[starts[keep]]
    return transcript_from_runs(run_ids, starts, ends, tokens, prompt_frames, frame_seconds, offset)


def transcript_from_runs(run_ids: np.ndarray, starts: np.ndarray, ends: np.ndarray, tokens: Sequence[str],
                         prompt_frames: int = PROMPT_FRAMES, frame_seconds: float = OUTPUT_FRAME_SECONDS,
                         offset: float = 0.0) -> Transcript:
    """The emitted tokens of a CTC path -> Transcript: ids int [n], each one's frames [starts, ends)."""
    floor = max(offset, 0.0)  # a clip may begin before the stream does (trim.STREAM_START_LEAD); no word does
    t0 = np.maximum((starts - prompt_frames) * frame_seconds + offset, floor)
    t1 = np.maximum((ends - prompt_frames) * frame_seconds + offset, floor)

    tags: dict[str, str] = {}
    pieces: list[TokenTiming] = []
    for token_id, a, b in zip(run_ids.tolist(), t0.tolist(), t1.tolist()):
        piece = tokens[token_id]
        tag = _TAG.fullmatch(piece)
        if tag is not None:
            kind = _tag_kind(tag.group(1))
            if kind is not None:
                tags.setdefault(kind, tag.group(1))  # the first of each kind wins
            continue
        if piece in SPECIAL_TOKENS or not piece:
            continue
        pieces.append(TokenTiming(piece.replace(WORD_START, " "), round(a, 6), round(b, 6)))
    pieces = _merge_bytes(pieces)
    text = " ".join("".join(p.text for p in pieces).split())  # strip and collapse runs of spaces
    return Transcript(
        text=text,
        language=tags.get("language"),
        emotion=tags.get("emotion"),
        event=tags.get("event"),
        tokens=tuple(pieces),
        words=tuple(merge_words(pieces)),
    )


def starting_at(transcript: Transcript, speech_start: float) -> Transcript:
    """The transcript with no token or word starting before `speech_start`, where the VAD heard the speech
    begin. The pre-roll before it is context for the model, not speech, yet a CTC model may emit its first
    token there (the demo model does right after its tags, 0.24 s early with a 0.3 s pre-roll). A token
    moved to the speech start keeps its length, up to where the next one starts."""

    def clamp(items: tuple[TokenTiming, ...]) -> tuple[TokenTiming, ...]:
        out = []
        for i, t in enumerate(items):
            if t.start < speech_start:
                following = items[i + 1].start if i + 1 < len(items) else math.inf
                end = max(t.end, min(speech_start + t.end - t.start, following))
                t = TokenTiming(t.text, speech_start, round(max(end, speech_start), 6))
            out.append(t)
        return tuple(out)

    if all(t.start >= speech_start for t in transcript.tokens + transcript.words):
        return transcript
    return dataclasses.replace(transcript, tokens=clamp(transcript.tokens), words=clamp(transcript.words))


def after_context(transcript: Transcript, start: float, end: float,
                  previous: Sequence[TokenTiming] | None) -> Transcript:
    """The transcript of audio whose seconds [start, end) were heard only as context (the end of the
    previous segment, pipeline/trim.py), without the words of that context: the leading words that align
    with `previous`' (the words the segments before said, Said.since) centred from CONTEXT_SLACK before
    `start` on (a word the context's first sample cuts may be heard again), by word edit distance, so a word
    one decoding has and the other lacks ("next next" heard once, "off delete" against "delete") neither
    repeats nor loses a word; but never a word centred more than CONTEXT_SLACK after `end` (heard again,
    the context may lose a word it said); without `previous` (it failed), the words centred before `end`.
    Tokens go with their word; the text is that of the tokens kept; tags stay."""
    limit = end if previous is None else end + CONTEXT_SLACK
    drop = sum(1 for w in transcript.words if (w.start + w.end) / 2 < limit)
    if previous is not None:
        said = [w.text.lower() for w in previous if (w.start + w.end) / 2 >= start - CONTEXT_SLACK]
        drop = min(drop, aligned_length(said, [w.text.lower() for w in transcript.words]))
    if not drop:
        return transcript
    kept = transcript.words[drop:]
    first = kept[0].start if kept else math.inf
    return _keeping(transcript, tuple(kept), tuple(t for t in transcript.tokens if t.start >= first))


def before_cut(transcript: Transcript, cut: float) -> Transcript:
    """The transcript of audio heard past `cut` (a client's commit inside speech, pipeline/segmenter.py
    SegmentFinished.cut) without the words that start after it: those are the next segment's, which hears
    this end again as its context and keeps whatever this one did not say. Tags stay."""
    keep = sum(1 for w in transcript.words if w.start < cut)
    if keep == len(transcript.words):
        return transcript
    first_dropped = transcript.words[keep].start
    return _keeping(transcript, transcript.words[:keep], tuple(t for t in transcript.tokens if t.start < first_dropped))


def _keeping(transcript: Transcript, words: tuple[TokenTiming, ...], tokens: tuple[TokenTiming, ...]) -> Transcript:
    """`transcript` with only `words` and their `tokens`; its text is theirs, its tags stay."""
    text = " ".join("".join(t.text for t in tokens).split())
    return dataclasses.replace(transcript, text=text, tokens=tokens, words=words)


def aligned_length(mine: Sequence[str], words: Sequence[str]) -> int:
    """How many of `words` (from the first) correspond to `mine`: the j whose words[:j] is closest to `mine`
    in word edit distance (the longest such j on a tie, so no word of `mine` comes back)."""
    previous = list(range(len(mine) + 1))  # distances of words[:0] to mine[:i]
    best, best_j = previous[-1], 0
    for j, word in enumerate(words, 1):
        row = [j]
        for i, own in enumerate(mine, 1):
            row.append(min(previous[i] + 1, row[i - 1] + 1, previous[i - 1] + (own != word)))
        previous = row
        if row[-1] <= best:
            best, best_j = row[-1], j
    return best_j


def _tag_kind(name: str) -> str | None:
    if name in LANGUAGES:
        return "language"
    if name in EMOTIONS:
        return "emotion"
    if name in TEXTNORMS:
        return None
    return "event"


def _merge_bytes(pieces: list[TokenTiming]) -> list[TokenTiming]:
    """Join runs of byte-fallback pieces (<0xE4><0xBD><0xA0>) into the characters they encode."""
    if not any(_BYTE.fullmatch(p.text) for p in pieces):
        return pieces
    merged: list[TokenTiming] = []
    run: list[TokenTiming] = []

    def flush() -> None:
        if run:
            data = bytes(int(_BYTE.fullmatch(p.text).group(1), 16) for p in run)  # type: ignore[union-attr]
            merged.append(TokenTiming(data.decode("utf-8", errors="replace"), run[0].start, run[-1].end))
            run.clear()

    for p in pieces:
        if _BYTE.fullmatch(p.text):
            run.append(p)
        else:
            flush()
            merged.append(p)
    flush()
    return merged


def is_cjk(char: str) -> bool:
    """Characters written without spaces between words: Han, kana, CJK punctuation and full-width forms.

    Hangul is not among them: Korean separates words with spaces, which sentencepiece marks with "▁".
    """
    code = ord(char)
    return (
        0x3000 <= code <= 0x30FF  # CJK punctuation, hiragana, katakana
        or 0x3400 <= code <= 0x4DBF
        or 0x4E00 <= code <= 0x9FFF
        or 0xF900 <= code <= 0xFAFF
        or 0xFF00 <= code <= 0xFFEF  # full-width forms
        or 0x20000 <= code <= 0x2FA1F
    )


def merge_words(tokens: Sequence[TokenTiming]) -> list[TokenTiming]:
    """Tokens -> words: a word starts at a piece with a leading space, and every CJK character is its own.

    Each word spans from its first piece's start to its last piece's end; its text has no spaces around it.
    """
    words: list[TokenTiming] = []
    current: TokenTiming | None = None
    for token in tokens:
        text = token.text
        stripped = text.strip()
        if not stripped:
            continue
        new_word = current is None or text[0].isspace() or is_cjk(stripped[0]) or is_cjk(current.text[-1])
        if new_word:
            if current is not None:
                words.append(current)
            current = TokenTiming(stripped, token.start, token.end)
        else:
            current = TokenTiming(current.text + stripped, current.start, token.end)
    if current is not None:
        words.append(current)
    return words
