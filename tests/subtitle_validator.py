"""A small strict reader of SubRip and WebVTT: checks pipeline/subtitles.py and what clients/file.py writes."""
from __future__ import annotations

import re
from dataclasses import dataclass

_SRT_TIME = r"(\d{2}):([0-5]\d):([0-5]\d),(\d{3})"
_VTT_TIME = r"(\d{2,}):([0-5]\d):([0-5]\d)\.(\d{3})"


@dataclass(frozen=True)
class ParsedCue:
    start: float
    end: float
    text: str


def _seconds(groups: tuple[str, ...]) -> float:
    h, m, s, ms = (int(g) for g in groups)
    return h * 3600 + m * 60 + s + ms / 1000


def _timing(line: str, stamp: str) -> tuple[float, float]:
    match = re.fullmatch(f"{stamp} --> {stamp}(?: .*)?", line)
    assert match, f"bad timing line {line!r}"
    start, end = _seconds(match.groups()[:4]), _seconds(match.groups()[4:8])
    assert start < end, f"cue ends before it starts: {line!r}"
    return start, end


def _check_order(cues: list[ParsedCue]) -> list[ParsedCue]:
    for before, after in zip(cues, cues[1:]):
        assert before.start <= after.start, f"cues out of order: {before} then {after}"
    return cues


def parse_srt(text: str) -> list[ParsedCue]:
    """Cues of a SubRip file; AssertionError on anything malformed (numbering, times, empty text)."""
    assert "\r" not in text or text.count("\r\n") == text.count("\n"), "mixed line endings"
    text = text.replace("\r\n", "\n")
    if not text.strip():
        return []
    assert text.endswith("\n"), "the file must end with a newline"
    cues = []
    for number, block in enumerate(text.strip("\n").split("\n\n"), start=1):
        lines = block.split("\n")
        assert len(lines) >= 3, f"cue {number} is incomplete: {block!r}"
        assert lines[0] == str(number), f"cue number {lines[0]!r}, expected {number}"
        start, end = _timing(lines[1], _SRT_TIME)
        assert all(line.strip() for line in lines[2:]), f"empty text line in cue {number}"
        cues.append(ParsedCue(start, end, "\n".join(lines[2:])))
    return _check_order(cues)


def parse_vtt(text: str) -> list[ParsedCue]:
    """Cues of a WebVTT file; AssertionError on anything malformed."""
    text = text.replace("\r\n", "\n")
    assert re.match(r"WEBVTT(?:[ \t][^\n]*)?\n", text), "a WebVTT file starts with 'WEBVTT'"
    blocks = text.strip("\n").split("\n\n")
    header, blocks = blocks[0], blocks[1:]
    assert "-->" not in header, "the header must be followed by a blank line"
    cues = []
    for block in blocks:
        lines = block.split("\n")
        if lines[0].startswith("NOTE"):
            continue
        if "-->" not in lines[0]:
            lines = lines[1:]  # a cue identifier
        assert len(lines) >= 2, f"cue without text: {block!r}"
        start, end = _timing(lines[0], _VTT_TIME)
        assert all(line.strip() and "-->" not in line for line in lines[1:]), f"bad cue text: {block!r}"
        cues.append(ParsedCue(start, end, "\n".join(lines[1:])))
    return _check_order(cues)
