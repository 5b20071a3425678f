"""Qwen3-ASR's generated tokens to a Transcript, as the `qwen-asr` package post-processes them.

    bytes     each token is GPT-2 byte-level BPE text (every byte written as one printable character);
              the tokens' bytes joined are UTF-8 (a character may span tokens)
    repeats   a character repeated more than 20 times, or a pattern of 1-20 characters repeated 20 times
              or more, is kept once (qwen_asr.inference.utils.detect_and_fix_repetitions: a model that
              loops emits the same piece until max_new_tokens)
    parse     "language English<asr_text>the text": the language before the tag, the text after it;
              "language None" is no speech; without the tag, all of it is text (parse_asr_output)
The model gives no token times: a Transcript's tokens and words are empty, its segment carries the time.
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Sequence

from .decoding import Transcript

ASR_TEXT_TAG = "<asr_text>"
REPEAT_THRESHOLD = 20  # the reference's detect_and_fix_repetitions(threshold=20)
PATTERN_MAX_CHARS = 20
_CHAR_REPEATS = re.compile(r"(.)\1{%d,}" % REPEAT_THRESHOLD, re.S)
_PATTERN_REPEATS = re.compile(r"(.{1,%d}?)\1{%d,}" % (PATTERN_MAX_CHARS, REPEAT_THRESHOLD - 1), re.S)
# The language names Qwen3-ASR writes, as the codes our other families and protocols use.
LANGUAGE_CODES = {
    "chinese": "zh", "english": "en", "cantonese": "yue", "japanese": "ja", "korean": "ko", "arabic": "ar",
    "german": "de", "french": "fr", "spanish": "es", "portuguese": "pt", "indonesian": "id", "italian": "it",
    "russian": "ru", "thai": "th", "vietnamese": "vi", "turkish": "tr", "hindi": "hi", "malay": "ms",
    "dutch": "nl", "swedish": "sv", "danish": "da", "finnish": "fi", "polish": "pl", "czech": "cs",
    "filipino": "fil", "persian": "fa", "greek": "el", "hungarian": "hu", "macedonian": "mk", "romanian": "ro",
}


@lru_cache(maxsize=1)
def byte_decoder() -> dict[str, int]:
    """GPT-2's bytes_to_unicode, reversed: printable character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = list(printable), 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def token_text(ids: Sequence[int], tokens: Sequence[str]) -> str:
    """The UTF-8 text of byte-level BPE tokens (characters outside the byte alphabet kept as they are)."""
    table, out = byte_decoder(), bytearray()
    for i in ids:
        piece = tokens[i] if 0 <= i < len(tokens) else ""
        for char in piece:
            byte = table.get(char)
            out += bytes([byte]) if byte is not None else char.encode("utf-8")
    return out.decode("utf-8", errors="replace")


def fix_repetitions(text: str) -> str:
    text = _CHAR_REPEATS.sub(r"\1", text)
    if len(text) < 2 * REPEAT_THRESHOLD:
        return text
    return _PATTERN_REPEATS.sub(r"\1", text)


def parse_output(raw: str, forced: str | None = None) -> tuple[str | None, str]:
    """(language code or None, text) of the model's raw output; after a `forced` language the output is the
    text alone (the reference's parse_asr_output(user_language=...))."""
    text = fix_repetitions(raw.strip())
    if forced is not None:
        return forced, text.strip()
    if ASR_TEXT_TAG not in text:
        return None, text.strip()
    meta, text = text.split(ASR_TEXT_TAG, 1)
    found = re.search(r"language\s+([^\s<]+)", meta, re.I)
    name = found.group(1).lower() if found else ""
    if name in ("", "none"):
        return None, text.strip()
    return LANGUAGE_CODES.get(name, name), text.strip()


def qwen3_transcript(ids: Sequence[int], tokens: Sequence[str], forced: str | None = None) -> Transcript:
    language, text = parse_output(token_text(ids, tokens), forced)
    return Transcript(text=text, language=language)
