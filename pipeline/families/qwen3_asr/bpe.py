"""Qwen2's byte-level BPE (the tokenizer of Qwen3-ASR) in the standard library: text to token ids.

    normalise   NFC (the tokenizer's normalizer)
    split       Qwen2's pre-tokenizer pattern, below: contractions, letters with one leading non-letter,
                single digits, punctuation runs, newline runs, spaces (a space run before a word leaves
                its last space to the word)
    bytes       each piece's UTF-8 bytes written as GPT-2's printable characters (bytes_to_unicode)
    merge       the adjacent pair of lowest rank in merges.txt is merged (the leftmost of equal ranks),
                until no pair has a rank; each symbol is then its vocabulary id
The reference (`qwen-asr`'s processor, transformers' Qwen2TokenizerFast) also matches its added tokens
(<|im_start|>, <asr_text>, ...) inside the text; a text for the prompt may not contain them
(Qwen3Tokenizer.encode refuses it), so that text never steers the template.
Python's `re` has no \\p{L}: the letter, number and white-space classes are built from `unicodedata`. Its
Unicode version (14.0 on Python 3.11) is not the reference's: a letter assigned since, or a combining mark
whose NFC order the reference's older tables do not know (U+1ACD), can split or order differently; no such
difference was found on ordinary text (make_qwen3_text_fixture.py --compare: 1 of 7,000 generated texts,
half of them random code points).
"""
from __future__ import annotations

import re
import sys
import unicodedata
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Sequence

MERGES_FILE = "merges.txt"
MERGES_HEADER = "#version:"
# Unicode's White_Space property (the reference's regex engine's \s; Python's also counts \x1c-\x1f).
WHITESPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
# Qwen2's pre-tokenizer (transformers' tokenization_qwen2.PRETOKENIZE_REGEX), with {L}, {N} and {S} for
# \p{L}, \p{N} and \s.
PRETOKENIZE_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n{L}{N}]?[{L}]+|[{N}]| ?[^{S}{L}{N}]+[\r\n]*"
                       r"|[{S}]*[\r\n]+|[{S}]+(?![^{S}])|[{S}]+")
CACHE_PIECES = 1 << 16  # pieces whose merges are remembered (a context repeats its words)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map of each byte to a printable character: the printable Latin-1 bytes are themselves, the
    others (controls, space, ...) take the characters from U+0100 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(others)}}


@lru_cache(maxsize=1)
def byte_decoder() -> dict[str, int]:
    """bytes_to_unicode reversed: printable character -> byte."""
    return {char: byte for byte, char in bytes_to_unicode().items()}


def _ranges(predicate) -> str:
    """A regex class body of every code point for which `predicate(category)` holds, as ranges."""
    out, start = [], None
    for code in range(sys.maxunicode + 2):
        inside = code <= sys.maxunicode and predicate(unicodedata.category(chr(code)))
        if inside and start is None:
            start = code
        elif not inside and start is not None:
            out.append(re.escape(chr(start)) if code - 1 == start else
                       f"{re.escape(chr(start))}-{re.escape(chr(code - 1))}")
            start = None
    return "".join(out)


@lru_cache(maxsize=1)
def pretokenizer() -> re.Pattern[str]:
    """PRETOKENIZE_PATTERN with its classes filled in (built once: a pass over every code point)."""
    letters = _ranges(lambda category: category[0] == "L")
    numbers = _ranges(lambda category: category[0] == "N")
    return re.compile(PRETOKENIZE_PATTERN.replace("{L}", letters).replace("{N}", numbers).replace("{S}", WHITESPACE))


def read_merges(path: Path) -> list[tuple[str, str]]:
    """merges.txt: its "#version" line, then one "left right" pair a line, in rank order."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ValueError(f"{path}: unreadable ({exc.strerror or exc})") from None
    merges = []
    for number, line in enumerate(lines, 1):
        if not line.strip() or number == 1 and line.startswith(MERGES_HEADER):
            continue
        pair = line.split()
        if len(pair) != 2:
            raise ValueError(f"{path}:{number}: not a merge (two tokens separated by a space): {line!r}")
        merges.append((pair[0], pair[1]))
    return merges


class Qwen3Tokenizer:
    """Text -> ids with `vocab` (token text -> id) and `merges` (pairs in rank order). `added` are the
    texts of the tokenizer's added tokens, which a text may not contain."""

    def __init__(self, vocab: dict[str, int], merges: Sequence[tuple[str, str]], added: Iterable[str] = ()) -> None:
        self.vocab = vocab
        self.ranks = {pair: rank for rank, pair in reversed(list(enumerate(merges)))}  # a repeated pair: its first
        self.added = tuple(sorted({a for a in added if a}, key=len, reverse=True))
        self.byte_chars = bytes_to_unicode()
        self._pieces = lru_cache(maxsize=CACHE_PIECES)(self._piece_ids)

    def encode(self, text: str) -> list[int]:
        """The ids of `text` as the reference's tokenizer gives them (no added tokens in it: ValueError)."""
        for token in self.added:
            if token in text:
                raise ValueError(f"the text contains the model's control token {token!r}")
        text = unicodedata.normalize("NFC", text)
        return [i for piece in pretokenizer().findall(text) for i in self._pieces(piece)]

    def _piece_ids(self, piece: str) -> tuple[int, ...]:
        symbols = [self.byte_chars[b] for b in piece.encode("utf-8")]
        while len(symbols) > 1:
            ranked = [(self.ranks.get(pair, -1), i) for i, pair in enumerate(zip(symbols, symbols[1:]))]
            rank, at = min(((r, i) for r, i in ranked if r >= 0), default=(-1, -1))
            if rank < 0:
                break
            symbols[at: at + 2] = [symbols[at] + symbols[at + 1]]
        missing = [s for s in symbols if s not in self.vocab]
        if missing:
            raise ValueError(f"the model's vocabulary has no token {missing[0]!r} (of {piece!r})")
        return tuple(self.vocab[s] for s in symbols)


def model_tokenizer(directory: Path, tokens: Sequence[str], added_ids: Iterable[int]) -> Qwen3Tokenizer:
    """The tokenizer of an exported model directory: its tokens.txt (line i is id i) and merges.txt; the
    ids `added_ids` are added tokens, never a merge's result. ValueError without merges.txt."""
    added_ids = set(added_ids)
    path = Path(directory) / MERGES_FILE
    if not path.is_file():
        raise ValueError(f"{directory} has no {MERGES_FILE} (the tokenizer's merges, needed to encode text): "
                         "export it again from the released checkpoint")
    vocab = {text: i for i, text in enumerate(tokens) if i not in added_ids}
    return Qwen3Tokenizer(vocab, read_merges(path), (tokens[i] for i in added_ids if 0 <= i < len(tokens)))
