"""SubRip (.srt) and WebVTT (.vtt) cues from finals (pure functions).

One cue per final; a final longer than `MAX_CUE_SECONDS` or `MAX_CUE_CHARS` is split at word boundaries
using its token times, when the tokens spell out the final's text, punctuation marks and case aside (a
punctuated final's marks stay with the word before them; after ITN the tokens may not spell it: then the final
stays one cue). Times are seconds from the stream start. A final is anything shaped like the wire's `final`
(server/protocol.py's `Final`: text, start, end, tokens with text, start, end), so the server and the
clients format subtitles alike without this module knowing either.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol, Sequence

from .transcript import TokenTiming, is_cjk

MAX_CUE_SECONDS = 7.0  # a reading-speed rule of thumb for subtitles
MAX_CUE_CHARS = 84  # two lines of 42 characters
WORD_MARKS = ("\u2581", " ")  # SentencePiece's word-start mark, or a plain space
VTT_HEADER = "WEBVTT\n\n"


class TimedText(Protocol):
    text: str
    start: float  # seconds
    end: float


class FinalLike(TimedText, Protocol):
    tokens: Sequence[TimedText]


@dataclass(frozen=True)
class Cue:
    start: float  # seconds
    end: float  # seconds
    text: str


def format_timestamp(seconds: float, decimal_marker: str = ",") -> str:
    """HH:MM:SS,mmm (SRT) or, with decimal_marker='.', HH:MM:SS.mmm (WebVTT)."""
    milliseconds = max(0, int(round(seconds * 1000)))
    hours, milliseconds = divmod(milliseconds, 3_600_000)
    minutes, milliseconds = divmod(milliseconds, 60_000)
    secs, milliseconds = divmod(milliseconds, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal_marker}{milliseconds:03d}"


def _words(tokens: Sequence[TimedText]) -> list[TokenTiming]:
    """Merge sub-word tokens into words (a token that starts with a word mark starts a new word, and every CJK
    character is a word of its own, as pipeline/transcript.py merge_words has it)."""
    words: list[TokenTiming] = []
    for token in tokens:
        cjk = is_cjk(token.text[:1] or " ") or bool(words) and is_cjk(words[-1].text[-1:] or " ")
        if words and not token.text.startswith(WORD_MARKS) and not cjk:
            last = words[-1]
            words[-1] = TokenTiming(last.text + token.text, last.start, token.end)
        else:
            words.append(TokenTiming(token.text, token.start, token.end))
    return [TokenTiming(w.text.replace(WORD_MARKS[0], " ").strip(), w.start, w.end) for w in words]


MARKS = frozenset("，。？！、；：,.?!;:")  # punctuation written between words (a punctuation model's, ITN's)


def _spans(text: str, words: Sequence[str]) -> list[tuple[int, int]] | None:
    """Where each word lies in `text` ([start, end) character offsets), its characters matched one by one, case
    aside, with blanks and punctuation marks between them skipped; None when the words do not spell the text."""
    spans, at = [], 0
    for word in words:
        first = at
        for n, char in enumerate(word):
            while at < len(text) and text[at].casefold() != char.casefold() and (text[at].isspace()
                                                                                 or text[at] in MARKS):
                at += 1
            if at == len(text) or text[at].casefold() != char.casefold():
                return None
            first = at if n == 0 else first
            at += 1
        spans.append((first, at))
    return spans if all(c.isspace() or c in MARKS for c in text[at:]) else None


def cues_for_final(final: FinalLike, max_seconds: float = MAX_CUE_SECONDS, max_chars: int = MAX_CUE_CHARS) -> list[Cue]:
    """The cues for one final: none for an empty text, usually one, several for a long final."""
    text = " ".join(final.text.split())
    if not text:
        return []
    whole = [Cue(final.start, max(final.end, final.start + 0.001), text)]
    if final.end - final.start <= max_seconds and len(text) <= max_chars:
        return whole
    words = [w for w in _words(final.tokens) if w.text]
    spans = _spans(text, [w.text for w in words]) if words else None
    if spans is None:
        return whole  # tokens do not spell the text (ITN): keep one cue
    firsts: list[int] = []  # the word each cue starts with
    for i, word in enumerate(words):
        group = words[firsts[-1]:i + 1] if firsts else [word]
        too_long = len(" ".join(w.text for w in group)) > max_chars
        if not firsts or too_long or word.end - group[0].start > max_seconds:
            firsts.append(i)
    bounds = [0] + [spans[i][0] for i in firsts[1:]] + [len(text)]  # a cue's text runs to the next cue's first word
    cues = [Cue(words[i].start, words[j - 1].end, text[a:b].strip())
            for i, j, a, b in zip(firsts, firsts[1:] + [len(words)], bounds, bounds[1:])]
    # Cover the final's span: the first cue from its start, the last to its end, no gaps that flicker.
    cues[0] = Cue(min(final.start, cues[0].start), cues[0].end, cues[0].text)
    cues[-1] = Cue(cues[-1].start, max(final.end, cues[-1].end), cues[-1].text)
    return [Cue(c.start, max(c.end, c.start + 0.001), c.text) for c in cues]


def srt_cue(index: int, cue: Cue) -> str:
    """One SubRip block (1-based index), ending with the blank separator line."""
    return f"{index}\n{format_timestamp(cue.start)} --> {format_timestamp(cue.end)}\n{cue.text}\n\n"


def vtt_cue(cue: Cue) -> str:
    """One WebVTT cue, ending with the blank separator line (write VTT_HEADER first)."""
    text = cue.text.replace("-->", "->")  # '-->' may not appear in a cue's text
    return f"{format_timestamp(cue.start, '.')} --> {format_timestamp(cue.end, '.')}\n{text}\n\n"


def to_srt(finals: Iterable[FinalLike]) -> str:
    cues = [cue for final in finals for cue in cues_for_final(final)]
    return "".join(srt_cue(i, cue) for i, cue in enumerate(cues, start=1))


def to_vtt(finals: Iterable[FinalLike]) -> str:
    return VTT_HEADER + "".join(vtt_cue(cue) for final in finals for cue in cues_for_final(final))
