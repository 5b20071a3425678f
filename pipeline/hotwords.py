"""Hotwords: phrases a stream wants recognised more readily, as every door and the clients write them.

    parse_hotwords(value)             ["word", {"text": "phrase", "boost": 2.0}, ...] -> tuple[Hotword, ...]
    parse_word_weights(text)          FunASR's '{"word": 20, ...}' (or "word weight" lines) -> tuple[Hotword, ...]
    read_hotwords_file(path, check)   one hotword a line, "phrase" or "phrase<TAB>boost" (a server-wide list),
                                      each checked by the model's family (pipeline/families read_model_hotwords)

What a model does with them is its family's (pipeline/families): a CTC model spells them with its tokens
into a context graph for its beam search (sensevoice/hotwords.py), Qwen3-ASR puts them into its prompt.
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from .errors import ProtocolError, quoted
from .json_text import finite_number, loads_shallow

DEFAULT_BOOST = 1.5  # bonus per matched token (sherpa-onnx's default context score)
MAX_BOOST = 10.0  # beyond this a hotword overrides clear acoustic evidence
MAX_HOTWORDS = 256  # per stream (the server-wide list counts separately)
MAX_HOTWORD_CHARS = 64
FUNASR_WEIGHT_PER_BOOST = 10.0  # FunASR's weights are ~10-40 for Paraformer: weight 20 -> boost 2.0
FUNASR_DEFAULT_WEIGHT = 20.0  # a plain-text hotword line without a weight


@dataclass(frozen=True)
class Hotword:
    text: str  # normalised: NFKC, single spaces
    boost: float = DEFAULT_BOOST  # log-probability bonus per token of the hotword


def _bad(message: str, **fields: Any) -> ProtocolError:
    return ProtocolError(message, code="bad_start", **fields)


def normalise_text(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", text).split())


def make_hotword(text: Any, boost: Any = DEFAULT_BOOST) -> Hotword:
    """One validated Hotword; ProtocolError bad_start on a bad text or boost."""
    if not isinstance(text, str):
        raise _bad(f"a hotword must be a string, got {text!r}")
    normal = normalise_text(text)
    if not normal:
        raise _bad("a hotword must not be empty")
    if len(normal) > MAX_HOTWORD_CHARS:
        raise _bad(f"hotword {normal[:20]!r}... is {len(normal)} characters long (at most {MAX_HOTWORD_CHARS})")
    if any(unicodedata.category(c)[0] == "C" for c in normal):
        raise _bad(f"hotword {normal!r} contains control characters")
    if not finite_number(boost) or not 0 < boost <= MAX_BOOST:
        raise _bad(f"hotword boost must be a number in (0, {MAX_BOOST:g}], got {quoted(boost)} for {normal!r}")
    return Hotword(normal, float(boost))


def parse_hotwords(value: Any) -> tuple[Hotword, ...]:
    """The `hotwords` field of a start message: a list of strings or of {"text": ..., "boost": ...}."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _bad(f"hotwords must be a list of strings or of {{\"text\", \"boost\"}} objects, got {type(value).__name__}")
    if len(value) > MAX_HOTWORDS:
        raise _bad(f"{len(value)} hotwords (at most {MAX_HOTWORDS})")
    words = []
    for item in value:
        if isinstance(item, dict):
            unknown = set(item) - {"text", "boost"}
            if unknown:
                raise _bad(f"unknown field(s) in a hotword: {', '.join(sorted(unknown))}")
            if "text" not in item:
                raise _bad("a hotword object needs a \"text\"")
            words.append(make_hotword(item["text"], item.get("boost", DEFAULT_BOOST)))
        else:
            words.append(make_hotword(item))
    return merge_hotwords(words)


def merge_hotwords(*lists: Sequence[Hotword]) -> tuple[Hotword, ...]:
    """Concatenate lists; a text given twice keeps its last boost (a stream's own list overrides the server's)."""
    merged: dict[str, Hotword] = {}
    for words in lists:
        for word in words:
            merged.pop(word.text, None)
            merged[word.text] = word
    return tuple(merged.values())


def parse_word_weights(value: Any) -> tuple[Hotword, ...]:
    """FunASR's `hotwords`: a JSON object string '{"阿里巴巴": 20, "hello world": 40}' (its clients' format),
    the object itself, or plain text (what its Python client sends as typed): lines "phrase weight", or
    words separated by spaces or commas; weight w becomes boost w / FUNASR_WEIGHT_PER_BOOST, clamped to
    (0, MAX_BOOST]. A weight of 0 or below leaves the phrase out (FunASR ignores it too)."""
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        try:
            parsed = loads_shallow(value)
        except ValueError:
            parsed = None
        value = parsed if isinstance(parsed, (dict, list)) else _weight_lines(value)  # "2024" is a word too
    if not isinstance(value, dict):
        raise _bad(f"hotwords must be a JSON object of word: weight, got {str(value)[:60]!r}")
    if len(value) > MAX_HOTWORDS:
        raise _bad(f"{len(value)} hotwords (at most {MAX_HOTWORDS})")
    words = []
    for text, weight in value.items():
        if isinstance(weight, str):
            try:
                weight = float(weight)
            except ValueError:
                raise _bad(f"hotword weight must be a number, got {weight!r} for {text!r}") from None
        if not finite_number(weight):
            raise _bad(f"hotword weight must be a number, got {quoted(weight)} for {quoted(text)}")
        if weight > 0:
            words.append(make_hotword(text, min(weight / FUNASR_WEIGHT_PER_BOOST, MAX_BOOST)))
    return merge_hotwords(words)


def _weight_lines(text: str) -> dict[str, float]:
    """'阿里巴巴 20\nhello world 40' (FunASR's hotword files); a line that ends in no weight is a list of
    words, each with FUNASR_DEFAULT_WEIGHT: FunASR's server splits such text on spaces ('阿里巴巴 达摩院'),
    and its newer Python client joins a file's words with commas ('阿里巴巴,达摩院')."""
    weights: dict[str, float] = {}
    for line in text.splitlines():
        parts = line.split()
        weight = _number(parts[-1]) if len(parts) > 1 else None
        if isinstance(weight, float):
            weights[" ".join(parts[:-1])] = weight
            continue
        for word in filter(None, re.split(r"[\s,，]+", line)):  # ASCII or full-width commas
            weights.setdefault(word, FUNASR_DEFAULT_WEIGHT)
    return weights


_COLON_BOOST = re.compile(r":\s*\d+(\.\d+)?\s*$")


def read_hotwords_file(path: str | Path, check: Callable[[Hotword], Any] | None = None) -> tuple[Hotword, ...]:
    """A server-wide list: one phrase a line, optionally a tab and its boost; blank lines and # comments
    are skipped; UTF-8, with or without the byte-order mark Windows editors write. ValueError (with the
    line number) on a bad line, an unreadable file or a phrase `check` refuses (ProtocolError or ValueError:
    the model's family's spelling check; None: every phrase is taken)."""
    try:
        lines = Path(path).read_text(encoding="utf-8-sig").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read hotwords file {path}: {exc}") from None
    words = []
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        text, _, boost = line.partition("\t")
        try:
            words.append(make_hotword(text, _number(boost) if boost.strip() else DEFAULT_BOOST))
            if check is not None:
                check(words[-1])
        except (ProtocolError, ValueError) as exc:
            # "volume up:3" is the clients' --hotword syntax; here it would be a phrase ending in ":3"
            hint = " (in this file a boost follows a TAB, not ':')" if _COLON_BOOST.search(text) else ""
            raise ValueError(f"{path}:{number}: {exc}{hint}") from None
    return merge_hotwords(words)


def _number(text: str) -> float | str:
    """A boost written in a file; text that is no number stays text, for make_hotword to refuse by name."""
    try:
        return float(text)
    except ValueError:
        return text.strip()
