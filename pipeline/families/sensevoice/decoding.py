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

import re
from typing import Sequence

import numpy as np

from ...audio import OUTPUT_FRAME_SECONDS, PROMPT_FRAMES
from ...transcript import TokenTiming, Transcript, merge_words

LANGUAGES = frozenset({"zh", "en", "yue", "ja", "ko", "nospeech", "auto"})
EMOTIONS = frozenset({"HAPPY", "SAD", "ANGRY", "NEUTRAL", "FEARFUL", "DISGUSTED", "SURPRISED", "EMO_UNKNOWN"})
TEXTNORMS = frozenset({"withitn", "woitn"})
SPECIAL_TOKENS = frozenset({"<unk>", "<s>", "</s>", "<blank>", "<pad>"})  # never part of the text
WORD_START = "\u2581"  # sentencepiece's "▁"
_TAG = re.compile(r"<\|([^|<>]+)\|>")
_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # sentencepiece byte fallback


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
