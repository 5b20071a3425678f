"""Hotwords: phrases a stream wants recognised more readily, as a context graph over the model's tokens.

    parse_hotwords(value)             ["word", {"text": "phrase", "boost": 2.0}, ...] -> tuple[Hotword, ...]
    parse_word_weights(text)          FunASR's '{"word": 20, ...}' (or "word weight" lines) -> tuple[Hotword, ...]
    read_hotwords_file(path, tokens)  one hotword a line, "phrase" or "phrase<TAB>boost" (a server-wide list)
    read_model_hotwords(path, model)  that, for the model a server serves (ValueError for a Paraformer)
    check_model_takes_hotwords(model) ProtocolError bad_start for a model without a CTC output (Paraformer)
    ContextGraph(hotwords, Speller(tokens))   spelled with the model's tokens; ProtocolError bad_start when
                                      one cannot be spelled

The graph is a trie of the hotwords' token sequences with Aho-Corasick failure links, as in icefall's and
sherpa-onnx's ContextGraph: each token that extends a match earns its hotword's boost, a match that breaks
gives the bonus back (the failure link keeps only the bonus of the longest suffix still matching), and a
completed hotword keeps its bonus for good; its last token earns its boost again on each further frame it
holds (`run_bonus`, pipeline/beam_search.py says why). Scores are natural-log units added to a path's
log-probability.

Spelling: greedy longest match of the text on the model's pieces (tokens.txt); a word starts with "▁" as in
sentencepiece. The text is spelled as written and in lower case (each way the model has pieces for goes
into the graph), and a phrase that begins with a CJK character also without the leading "▁", since
Chinese and Japanese words inside a sentence carry none.
"""
from __future__ import annotations

import re
import unicodedata
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from .decoding import SPECIAL_TOKENS, WORD_START
from .transcript import is_cjk
from .errors import ProtocolError, quoted
from .json_text import finite_number, loads_shallow
from .modeldir import ModelDirectory

DEFAULT_BOOST = 1.5  # bonus per matched token (sherpa-onnx's default context score)
MAX_BOOST = 10.0  # beyond this a hotword overrides clear acoustic evidence
MAX_HOTWORDS = 256  # per stream (the server-wide list counts separately)
MAX_HOTWORD_CHARS = 64
FUNASR_WEIGHT_PER_BOOST = 10.0  # FunASR's weights are ~10-40 for Paraformer: weight 20 -> boost 2.0
FUNASR_DEFAULT_WEIGHT = 20.0  # a plain-text hotword line without a weight
NO_CTC_ARCHITECTURES = ("paraformer",)  # models that take no hotwords: no per-frame log-probs, no prompt
QWEN3 = "qwen3-asr"  # hotwords go into its prompt as a context (pipeline/qwen3_context.py)


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


def check_model_takes_hotwords(model: ModelDirectory) -> None:
    """Hotwords bias a CTC beam search, or a Qwen3-ASR's prompt; a Paraformer (no CTC output) cannot take them."""
    if model.manifest.architecture in NO_CTC_ARCHITECTURES:
        raise _bad(f"hotwords need a CTC model (SenseVoice) or Qwen3-ASR; this model is a "
                   f"{model.manifest.architecture.capitalize()}")


_COLON_BOOST = re.compile(r":\s*\d+(\.\d+)?\s*$")


def read_hotwords_file(path: str | Path, tokens: Sequence[str] | None) -> tuple[Hotword, ...]:
    """A server-wide list: one phrase a line, optionally a tab and its boost; blank lines and # comments
    are skipped; UTF-8, with or without the byte-order mark Windows editors write. ValueError (with the
    line number) on a bad line, an unreadable file or a phrase the model (`tokens`; None: no spelling, a
    Qwen3-ASR's byte-level tokens spell anything) cannot spell."""
    speller = Speller(tokens) if tokens is not None else None
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
            if speller is not None:
                speller.spellings(words[-1])
        except (ProtocolError, ValueError) as exc:
            # "volume up:3" is the clients' --hotword syntax; here it would be a phrase ending in ":3"
            hint = " (in this file a boost follows a TAB, not ':')" if _COLON_BOOST.search(text) else ""
            raise ValueError(f"{path}:{number}: {exc}{hint}") from None
    return merge_hotwords(words)


def read_model_hotwords(path: str | Path, model: ModelDirectory) -> tuple[Hotword, ...]:
    """read_hotwords_file for the model a server serves (--hotwords FILE): ValueError at startup for a model
    that takes no hotwords, or a Qwen3-ASR whose prompt they do not fit, rather than a bad_start for every
    stream."""
    try:
        check_model_takes_hotwords(model)
    except ProtocolError as exc:
        raise ValueError(f"--hotwords {path}: {exc}; serve it without --hotwords") from None
    if model.manifest.architecture != QWEN3:
        return read_hotwords_file(path, model.tokens)
    from .qwen3_context import ContextEncoder

    words = read_hotwords_file(path, None)
    try:
        ContextEncoder(model).context(words)
    except ProtocolError as exc:
        raise ValueError(f"--hotwords {path}: {exc}") from None
    return words


def _number(text: str) -> float | str:
    """A boost written in a file; text that is no number stays text, for make_hotword to refuse by name."""
    try:
        return float(text)
    except ValueError:
        return text.strip()


# ---- spelling ----------------------------------------------------------------------------------------

class Speller:
    """Greedy longest match of text on a model's pieces (tokens.txt order = ids)."""

    def __init__(self, tokens: Sequence[str]) -> None:
        self.ids = {piece: i for i, piece in enumerate(tokens)
                    if piece and piece not in SPECIAL_TOKENS and not piece.startswith("<|")}
        self.longest = max((len(p) for p in self.ids), default=0)

    def spell(self, text: str) -> list[int] | None:
        """Token ids of `text` ("▁" already in place), or None when some part has no piece."""
        ids, i = [], 0
        while i < len(text):
            for j in range(min(len(text), i + self.longest), i, -1):
                token = self.ids.get(text[i:j])
                if token is not None:
                    ids.append(token)
                    i = j
                    break
            else:
                return None
        return ids

    def spellings(self, word: Hotword) -> list[list[int]]:
        """Every way the model may write the hotword (see the module doc); ProtocolError when there is none."""
        variants = []
        for text in dict.fromkeys([word.text, word.text.lower()]):  # as written, and as a lower-case model has it
            marked = WORD_START + text.replace(" ", WORD_START)
            variants += [marked, marked[1:]] if is_cjk(text[0]) else [marked]
        found = [ids for ids in map(self.spell, variants) if ids]
        if not found:
            raise _bad(f"hotword {word.text!r} cannot be spelled with this model's tokens", hotword=word.text)
        return [ids for n, ids in enumerate(found) if ids not in found[:n]]


# ---- the graph ---------------------------------------------------------------------------------------

@dataclass(eq=False)
class ContextState:
    token: int = -1  # -1 at the root
    token_score: float = 0.0  # bonus for reaching this state from its parent
    node_score: float = 0.0  # bonus accumulated from the root to here
    output_score: float = 0.0  # bonus kept for good when a hotword ends here (itself or a suffix of it)
    is_end: bool = False
    next: dict[int, "ContextState"] = field(default_factory=dict)
    fail: "ContextState | None" = None
    output: "ContextState | None" = None  # the longest hotword that ends here as a proper suffix


class ContextGraph:
    """A trie of hotword token sequences with failure links. `root` is the state of an unmatched prefix."""

    def __init__(self, hotwords: Sequence[Hotword], speller: Speller) -> None:
        self.hotwords = tuple(hotwords)
        self.root = ContextState()
        self.root.fail = self.root
        for word in self.hotwords:
            for ids in speller.spellings(word):
                self._insert(ids, word.boost)
        self._link()

    def _insert(self, ids: list[int], boost: float) -> None:
        node = self.root
        for j, token in enumerate(ids):
            child = node.next.get(token)
            if child is None:
                child = node.next[token] = ContextState(token=token, token_score=boost)
            else:
                child.token_score = max(child.token_score, boost)
            child.node_score = node.node_score + child.token_score
            child.is_end = child.is_end or j == len(ids) - 1
            node = child
        # Scores along a shared prefix may have grown: recompute the whole trie's node scores.
        self._rescore(self.root)

    def _rescore(self, node: ContextState) -> None:
        for child in node.next.values():
            child.node_score = node.node_score + child.token_score
            child.output_score = child.node_score if child.is_end else 0.0
            self._rescore(child)

    def _link(self) -> None:
        """Breadth-first: failure links to the longest proper suffix in the trie, and output links."""
        queue = deque()
        for child in self.root.next.values():
            child.fail = self.root
            queue.append(child)
        while queue:
            node = queue.popleft()
            for token, child in node.next.items():
                fail = node.fail
                while token not in fail.next and fail is not self.root:
                    fail = fail.fail
                child.fail = fail.next.get(token, self.root)
                output = child.fail
                while output is not self.root and not output.is_end:
                    output = output.fail
                child.output = None if output is self.root else output
                if child.output is not None:
                    child.output_score += child.output.output_score
                queue.append(child)
        states = list(self._states(self.root))
        self.max_bonus = max((s.output_score for s in states), default=0.0)  # the most a prefix keeps

    def _states(self, node: ContextState):
        for child in node.next.values():
            yield child
            yield from self._states(child)

    def step(self, state: ContextState, token: int) -> tuple[float, ContextState]:
        """Advance a prefix's state by one emitted token: (score change, new state)."""
        node = state.next.get(token)
        if node is not None:
            score = node.token_score
        else:
            node = state.fail
            while token not in node.next and node is not self.root:
                node = node.fail
            node = node.next.get(token, self.root)
            score = node.node_score - state.node_score  # give back the bonus of the broken match
        return score + node.output_score, node

    def run_bonus(self, state: ContextState) -> float:
        """The bonus each further frame earns while the token that led to `state` goes on: its boost when it
        completed a hotword (kept for good, so never given back), else nothing (a partial match's bonus may
        be given back, a frame's could not)."""
        return state.token_score if state.is_end else 0.0

    def finish(self, state: ContextState) -> float:
        """Score change at the end of the utterance: an unfinished match gives its bonus back."""
        return -state.node_score
