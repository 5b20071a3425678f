from __future__ import annotations

import pytest
from subtitle_validator import parse_srt, parse_vtt

from pipeline.subtitles import MAX_CUE_CHARS, MAX_CUE_SECONDS, cues_for_final, format_timestamp, to_srt, to_vtt
from server.protocol import Final, TokenTime


def final(segment: int, text: str, start: float, end: float, tokens: list[TokenTime] | None = None) -> Final:
    return Final(segment=segment, text=text, start=start, end=end, tokens=tokens or [])


@pytest.mark.parametrize("seconds, srt, vtt", [
    (0.0, "00:00:00,000", "00:00:00.000"),
    (1.2345, "00:00:01,234", "00:00:01.234"),
    (61.0005, "00:01:01,000", "00:01:01.000"),  # 1000.5 ms rounds to even
    (3723.9996, "01:02:04,000", "01:02:04.000"),
    (-0.01, "00:00:00,000", "00:00:00.000"),
])
def test_format_timestamp(seconds: float, srt: str, vtt: str) -> None:
    assert format_timestamp(seconds) == srt
    assert format_timestamp(seconds, ".") == vtt


def test_srt_and_vtt_one_cue_per_final_and_empty_finals_skipped() -> None:
    finals = [final(0, "hello there", 0.5, 1.7), final(1, "", 2.0, 2.5), final(2, "general  kenobi", 3.0, 4.25)]
    srt = parse_srt(to_srt(finals))
    vtt = parse_vtt(to_vtt(finals))
    for cues in (srt, vtt):
        assert [(c.start, c.end, c.text) for c in cues] == [(0.5, 1.7, "hello there"), (3.0, 4.25, "general kenobi")]


def test_empty_transcript_is_valid() -> None:
    assert parse_srt(to_srt([])) == []
    assert parse_vtt(to_vtt([])) == []


def test_vtt_text_never_holds_an_arrow() -> None:
    assert parse_vtt(to_vtt([final(0, "a --> b", 0, 1)]))[0].text == "a -> b"


def test_long_final_is_split_at_word_times() -> None:
    words = [f"word{i}" for i in range(30)]
    tokens = [TokenTime("\u2581" + w[:4], i * 0.5, i * 0.5 + 0.2) for i, w in enumerate(words)]
    tokens = [t for i, w in enumerate(words) for t in (tokens[i], TokenTime(w[4:], i * 0.5 + 0.2, i * 0.5 + 0.4))]
    long = final(0, " ".join(words), 0.0, 15.0, tokens)
    cues = cues_for_final(long)
    assert len(cues) > 1
    assert " ".join(c.text for c in cues) == long.text
    assert cues[0].start == 0.0 and cues[-1].end == 15.0
    for cue in cues:
        assert len(cue.text) <= MAX_CUE_CHARS and cue.end - cue.start <= MAX_CUE_SECONDS + 0.5
    for before, after in zip(cues, cues[1:]):
        assert before.end <= after.start
    assert len(parse_srt(to_srt([long]))) == len(cues)


def test_long_final_whose_tokens_do_not_spell_it_stays_one_cue() -> None:
    tokens = [TokenTime("\u2581twenty", 0.0, 5.0), TokenTime("\u2581three", 5.0, 9.0)]
    assert len(cues_for_final(final(0, "23.", 0.0, 9.0, tokens))) == 1


def test_a_long_punctuated_final_is_split_with_its_marks() -> None:
    """A punctuation model's text (--punc): its words are the tokens', case and marks aside; each mark stays with
    the word before it, and the cues together are the text. A Chinese final splits too: each CJK character is a
    word (before, tokens without a word mark were glued into one)."""
    words = [f"word{i}" for i in range(30)]
    tokens = [TokenTime(" " + w, i * 0.5, i * 0.5 + 0.4) for i, w in enumerate(words)]
    text = " ".join(w.capitalize() + ("," if i % 4 == 3 else "") for i, w in enumerate(words)) + "."
    cues = cues_for_final(final(0, text, 0.0, 15.0, tokens))
    assert len(cues) > 1 and " ".join(c.text for c in cues) == text
    assert all(c.text[-1] in ",." or c.text[-1].isdigit() for c in cues) and cues[-1].text.endswith("Word29.")
    chinese = final(0, "能和，能这？" * 12, 0.0, 24.0, [TokenTime(c, i * 0.33, i * 0.33 + 0.3)
                                                    for i, c in enumerate("能和能这" * 12)])
    cues = cues_for_final(chinese)
    assert len(cues) > 1 and "".join(c.text for c in cues) == chinese.text
    assert not any(c.text[0] in "，？" for c in cues)  # a mark stays with the word before it
