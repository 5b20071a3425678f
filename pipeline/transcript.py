"""What every model family's decoding gives: a Transcript of tokens and words with times, and the edits the
server makes to one (the speech start, a context heard again, a client's cut) and to several (joined texts).

Times are seconds from the stream start (each decoder adds its clip's offset). A word is one or more tokens: a
token with a leading space starts one, and every CJK character is its own.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Sequence

# A word of the context heard again may be timed this much after the context ends (it straddles the cut).
CONTEXT_SLACK = 0.1


@dataclass(frozen=True)
class TokenTiming:
    text: str  # the piece with "▁" written as a leading space (" hello"), so "".join(texts) is the text
    start: float  # seconds, offset included
    end: float


@dataclass(frozen=True)
class Sentence:
    """A run of a punctuated transcript's words up to a punctuation mark (a clause after "，" too, as FunASR
    cuts its sentences) and that mark ("" for words after the last mark)."""

    words: tuple[TokenTiming, ...]  # the transcript's own words, times unchanged
    mark: str

    @property
    def start(self) -> float:
        return self.words[0].start

    @property
    def end(self) -> float:
        return self.words[-1].end


@dataclass(frozen=True)
class Punctuation:
    """What a punctuation model made of a transcript (pipeline/punctuation.py punctuate_transcript): its text as
    the model writes it, each of the transcript's words as that text writes it ("Hello," for "hello"), and its
    sentences. The transcript's words and times stay as they were."""

    text: str
    words: tuple[str, ...]  # one per Transcript.words
    sentences: tuple[Sentence, ...]


@dataclass(frozen=True)
class Transcript:
    text: str
    language: str | None = None  # "en", "zh", ... (the tag's inner text); None when the model gave none
    emotion: str | None = None  # "NEUTRAL", "HAPPY", ...
    event: str | None = None  # "Speech", "BGM", "Laughter", ...
    tokens: tuple[TokenTiming, ...] = ()
    words: tuple[TokenTiming, ...] = ()  # tokens merged into words (each CJK character is a word)
    punctuation: Punctuation | None = None  # a final's, where the server punctuates it (--punc)

    @property
    def punctuated_text(self) -> str:
        """The punctuated text where a punctuation model punctuated the transcript (without the blank FunASR
        writes before a text that opens with a Latin word), else its text."""
        return self.text if self.punctuation is None else self.punctuation.text.strip()


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


def join_texts(texts: Sequence[str]) -> str:
    """Segments' texts as one: a space between them, none after a CJK character (FunASR's Chinese output) or
    before a text that opens with one (FunASR's punctuated text before a Latin word)."""
    out = ""
    for text in texts:
        if text:
            out += ("" if not out or is_cjk(out[-1]) or text[0].isspace() else " ") + text
    return out
