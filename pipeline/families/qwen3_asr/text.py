"""Qwen3-ASR's generated tokens to a Transcript, as the `qwen-asr` package post-processes them.

    bytes     each token is GPT-2 byte-level BPE text (every byte written as one printable character);
              the tokens' bytes joined are UTF-8 (a character may span tokens; invalid bytes become U+FFFD)
    skipped   the tokenizer's special tokens (<|im_end|>, <|audio_pad|>, ...) and ids it names no token for
              write nothing (the package decodes with skip_special_tokens); its other added tokens
              (<asr_text>) are their text
    repeats   a character repeated more than 20 times, or a pattern of 1-20 characters repeated 20 times
              or more, is kept once, exactly as qwen_asr.inference.utils.detect_and_fix_repetitions
              (threshold 20) does it: a model that loops emits the same piece until max_new_tokens
    parse     "language English<asr_text>the text": the language before the tag, the text after it;
              "language None" is no speech; without the tag, all of it is text (parse_asr_output)
The model gives no token times: a Transcript's tokens and words are empty, its segment carries the time.
"""
from __future__ import annotations

import re
from typing import Collection, Sequence

from ...transcript import Transcript
from .bpe import byte_decoder

ASR_TEXT_TAG = "<asr_text>"
LANGUAGE_PREFIX = "language "
REPEAT_THRESHOLD = 20  # the reference's detect_and_fix_repetitions(threshold=20)
PATTERN_MAX_CHARS = 20
_CHAR_REPEATS = re.compile(r"(.)\1{%d,}" % REPEAT_THRESHOLD, re.S)
# Any pattern repeated REPEAT_THRESHOLD times: where there is none, the reference's scan finds none either.
_ANY_PATTERN_REPEATS = re.compile(r"(.{1,%d}?)\1{%d,}" % (PATTERN_MAX_CHARS, REPEAT_THRESHOLD - 1), re.S)
# The language names Qwen3-ASR writes, as the codes our other families and protocols use.
LANGUAGE_CODES = {
    "chinese": "zh", "english": "en", "cantonese": "yue", "japanese": "ja", "korean": "ko", "arabic": "ar",
    "german": "de", "french": "fr", "spanish": "es", "portuguese": "pt", "indonesian": "id", "italian": "it",
    "russian": "ru", "thai": "th", "vietnamese": "vi", "turkish": "tr", "hindi": "hi", "malay": "ms",
    "dutch": "nl", "swedish": "sv", "danish": "da", "finnish": "fi", "polish": "pl", "czech": "cs",
    "filipino": "fil", "persian": "fa", "greek": "el", "hungarian": "hu", "macedonian": "mk", "romanian": "ro",
}


def token_text(ids: Sequence[int], tokens: Sequence[str], skipped: Collection[int] = ()) -> str:
    """The UTF-8 text of byte-level BPE tokens, the ids in `skipped` left out (characters outside the byte
    alphabet kept as they are; an id past `tokens` is skipped too, as the reference has no token for it)."""
    table, out = byte_decoder(), bytearray()
    for i in ids:
        if i in skipped or not 0 <= i < len(tokens):
            continue
        for char in tokens[i]:
            byte = table.get(char)
            out += bytes([byte]) if byte is not None else char.encode("utf-8")
    return out.decode("utf-8", errors="replace")


def fix_repetitions(text: str) -> str:
    """detect_and_fix_repetitions: runs of one character over REPEAT_THRESHOLD become one; then, scanning
    from the left, the first pattern of 1-PATTERN_MAX_CHARS characters repeated REPEAT_THRESHOLD times or
    more is kept once and the rest of the text after its repeats is scanned again. Like the reference, a
    scan starts a pattern only where 2 x REPEAT_THRESHOLD characters remain (a text shorter than that is
    left as it is), so a run of exactly 20 characters near the end stays."""
    text = _CHAR_REPEATS.sub(r"\1", text)
    if not _ANY_PATTERN_REPEATS.search(text):
        return text
    kept, rest = [], text
    while True:
        found = next(filter(None, (_repeats_at(rest, start)
                                   for start in range(len(rest) - 2 * REPEAT_THRESHOLD + 1))), None)
        if found is None:
            return "".join(kept) + rest
        pattern_end, repeats_end = found
        kept.append(rest[:pattern_end])  # what came before, and the pattern once
        rest = rest[repeats_end:]


def _repeats_at(text: str, start: int) -> tuple[int, int] | None:
    """(end of the pattern, end of its repeats) of the shortest pattern starting at `start` that is
    repeated REPEAT_THRESHOLD times or more; None when there is none."""
    for length in range(1, PATTERN_MAX_CHARS + 1):
        if start + length * REPEAT_THRESHOLD > len(text):
            return None
        pattern = text[start: start + length]
        if all(text[start + k * length: start + (k + 1) * length] == pattern for k in range(1, REPEAT_THRESHOLD)):
            end = start + length * REPEAT_THRESHOLD
            while text[end: end + length] == pattern:
                end += length
            return start + length, end
    return None


def parse_output(raw: str, forced: str | None = None) -> tuple[str | None, str]:
    """(language code or None, text) of the model's raw output, as parse_asr_output gives them; after a
    `forced` language the output is the text alone (parse_asr_output(user_language=...))."""
    text = raw.strip()
    if not text:  # (the reference names no language then, not even a forced one; we keep the forced one)
        return forced, ""
    text = fix_repetitions(text)
    if forced is not None:
        return forced, text
    if ASR_TEXT_TAG not in text:
        return None, text.strip()
    meta, text = text.split(ASR_TEXT_TAG, 1)
    if "language none" in meta.lower():
        return None, text.strip()
    name = ""
    for line in meta.splitlines():  # the first line that names a language
        line = line.strip()
        if line.lower().startswith(LANGUAGE_PREFIX):
            name = line[len(LANGUAGE_PREFIX):].strip().lower()
            break
    return (LANGUAGE_CODES.get(name, name) or None), text.strip()


def qwen3_transcript(ids: Sequence[int], tokens: Sequence[str], forced: str | None = None,
                     skipped: Collection[int] = ()) -> Transcript:
    language, text = parse_output(token_text(ids, tokens, skipped), forced)
    return Transcript(text=text, language=language)
