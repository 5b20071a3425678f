"""Append-only text from revisable partials: the one rule behind every delta we send.

Our partials re-decode a growing window, so a later partial (and the final) may revise words an earlier
one showed. Clients of append-only protocols (OpenAI Realtime's `...transcription.delta`, FunASR's
`online` / `2pass-online` texts) concatenate what they receive and never take it back. So per segment:

  * a word becomes *stable* once AGREEMENT consecutive partials agree on it and on every word before it,
    and HOLDBACK words follow it in the newest partial (the last word of a window is often cut mid-word);
    only stable text is sent as a delta, and it is never revised: it is committed;
  * the final keeps the committed prefix: `complete(final)` aligns the committed words with the final's
    (edit distance over words) and returns the final's text after the aligned position. The committed
    prefix plus that rest is the segment's appended text: the final's words whenever the committed ones
    agree with it, and a client that appends everything then shows exactly the final.
When the committed words disagree with the final, the final's version of those words is lost from the
appended text: that is the price of append-only output, which AGREEMENT keeps rare (a partial hears only
the start of a turn, and in room noise its first word may be one the final revises). A protocol that also
sends the final whole sends the final's own words there (Realtime's `.completed`, which clients keep as
the turn's text: server/openai_realtime.py). Pure: strings in, strings out.
"""
from __future__ import annotations

import re

from .transcript import aligned_length, is_cjk

AGREEMENT = 2  # consecutive partials that must agree on a word before it is committed
HOLDBACK = 1  # words at the end of the newest partial that are never committed from a partial
_UNIT = re.compile(r"\S+")


def units(text: str) -> list[tuple[str, int]]:
    """The words of `text` with the offset where each ends; each CJK character is a word of its own."""
    out: list[tuple[str, int]] = []
    for match in _UNIT.finditer(text):
        word, start = match.group(), match.start()
        run = ""
        for i, char in enumerate(word):
            if is_cjk(char):
                if run:
                    out.append((run, start + i))
                    run = ""
                out.append((char, start + i + 1))
            else:
                run += char
        if run:
            out.append((run, match.end()))
    return out


def _separator(before: str, after: str) -> str:
    """What goes between two texts joined as words: a space, except around CJK characters."""
    if not before or not after or before[-1].isspace() or after[0].isspace():
        return ""
    return "" if is_cjk(before[-1]) or is_cjk(after[0]) else " "


class StablePrefix:
    """The committed text of one segment. `update(partial)` -> delta to send; `complete(final)` -> the rest."""

    def __init__(self, agreement: int = AGREEMENT, holdback: int = HOLDBACK) -> None:
        if agreement < 1 or holdback < 0:
            raise ValueError(f"agreement must be >= 1 and holdback >= 0, got {agreement}, {holdback}")
        self.agreement = agreement
        self.holdback = holdback
        self.text = ""  # committed: the concatenation of every delta returned so far
        self._words: list[str] = []  # the committed words
        self._recent: list[list[str]] = []  # the words of the last `agreement` partials

    def update(self, partial: str) -> str:
        """A new partial transcript of the segment -> the text newly committed ("" when none)."""
        found = units(partial)
        words = [w for w, _ in found]
        self._recent = (self._recent + [words])[-self.agreement:]
        if len(self._recent) < self.agreement or words[:len(self._words)] != self._words:
            return ""  # too few partials yet, or this one revises committed words (the final settles it)
        agreed = len(words) - self.holdback
        for other in self._recent[:-1]:
            agreed = min(agreed, next((i for i, (a, b) in enumerate(zip(words, other)) if a != b),
                                      min(len(words), len(other))))
        if agreed <= len(self._words):
            return ""
        stable = partial[:found[agreed - 1][1]].lstrip()
        if not stable.startswith(self.text):  # spacing differs from what was committed: wait for the final
            return ""
        delta, self.text, self._words = stable[len(self.text):], stable, words[:agreed]
        return delta

    def complete(self, final: str) -> str:
        """The segment's final transcript -> what to send after the committed text; `self.text` plus the
        result is the completed transcript. Commits it all: later calls return ""."""
        final = final.strip()
        if not self._words:
            rest = final
        else:
            found = units(final)
            j = aligned_length(self._words, [w for w, _ in found])
            tail = final[found[j - 1][1]:].lstrip() if j else final
            rest = _separator(self.text, tail) + tail
        self.text += rest
        self._words = [w for w, _ in units(self.text)]
        self._recent = []
        return rest
