"""Punctuation for a transcript as FunASR's ct-punc adds it: words, ids, the long-text cutting, the text.

A port of FunASR's own steps (funasr 1.4.16), each function citing the one it follows:
- `split_words`: funasr/models/ct_transformer/utils.py `split_words` without a jieba dictionary: the text
  split at blanks, then every non-ASCII character a word of its own and every run of ASCII characters one
  word ("abc中文def" -> abc, 中, 文, def).
- `Vocabulary.encode`: funasr/tokenizer CharTokenizer.encode of that word list: each word's id in the
  vocabulary, the unknown symbol's for any other (case kept).
- `split_to_mini_sentence`: the same function of utils.py: 20-word mini-sentences, the last one shorter.
- `Punctuator.punctuate`: CTTransformer.inference (funasr/models/ct_transformer/model.py): each mini-sentence
  runs with the words carried from the call before; every call but the last is cut after its last "。" or
  "？" (looked for from its second-to-last word down to its third), or, when it holds more than 200 words and
  has none, after its last "，", which becomes a sentence end; the words after the cut are carried on. The
  text: an ASCII word that opens a call or follows a sentence end is capitalised (str.capitalize), an ASCII
  word that opens a call or follows another ASCII word gets a blank before it, each word's punctuation follows
  it ("，。？" in their ASCII forms after an ASCII word); the text ends with a sentence end (a final "，", "、"
  or "," replaced, else "。" or "." added). Quirks included, for the same text as FunASR: each call's first word
  counts as a sentence start, a "<unk>" class writes "<unk>".
FunASR splits into jieba's words instead when the model directory holds a jieba dictionary (ModelScope's copy
of the 471,067-word zh-en model): not ported, and export/ct_punc.py refuses such a directory. Hugging Face's
funasr/ct-punc (the same model without the dictionary) and the 272,727-word ct-punc-c split as above.

Sans-I/O beside the graph: `Punctuator` takes any function from a call's ids to their logits;
`PunctuationGraph` is the exported graph on ONNX Runtime, each call padded into its word container
(pipeline/shapes.py), and `load_punctuator` builds both from a model directory. numpy and onnxruntime only.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from .errors import ModelLoadError
from .families import CT_TRANSFORMER
from .modeldir import PUNCTUATION_FREE_DIMENSIONS, PUNCTUATION_INPUT_NAMES, read_model_directory
from .shapes import DEFAULT_PUNCTUATION_CONTAINERS, punctuation_container

SPLIT_SIZE = 20  # words per mini-sentence (CTTransformer.inference's split_size default)
CACHE_POP_TRIGGER_LIMIT = 200  # past this many words without a sentence end, a call is cut at its last comma
SENTENCE_ENDS = ("。", "？")
COMMA, PAUSE, NONE = "，", "、", "_"
ASCII_FORMS = {"，": ",", "。": ".", "？": "?"}  # after an ASCII word

Logits = Callable[[np.ndarray], np.ndarray]  # one call's ids int64 [words] -> logits float32 [words, classes]


def is_ascii(word: str) -> bool:
    """FunASR's test of a word: its first character is one byte in UTF-8."""
    return len(word[0].encode()) == 1


def split_words(text: str) -> list[str]:
    """FunASR's split_words (no jieba dictionary): non-ASCII characters one by one, ASCII runs whole."""
    words = []
    for segment in text.split():
        run = ""
        for character in segment:
            if len(character.encode()) == 1:
                run += character
                continue
            if run:
                words.append(run)
                run = ""
            words.append(character)
        if run:
            words.append(run)
    return words


def split_to_mini_sentence(words: list, limit: int = SPLIT_SIZE) -> list[list]:
    """FunASR's split_to_mini_sentence: `limit` words at a time, the rest last."""
    if limit <= 1:
        raise ValueError(f"a mini-sentence holds more than one word, not {limit}")
    return [words[start:start + limit] for start in range(0, len(words), limit)] or [words]


@dataclass(frozen=True)
class Vocabulary:
    """The model's words by id (tokens.txt) and the id of its unknown symbol."""

    ids: dict[str, int]
    unk_id: int

    @classmethod
    def from_tokens(cls, tokens: Sequence[str], unk_symbol: str = "<unk>") -> Vocabulary:
        ids = {token: i for i, token in enumerate(tokens)}
        if len(ids) != len(tokens):
            raise ValueError("the vocabulary holds a word twice")
        if unk_symbol not in ids:
            raise ValueError(f"the vocabulary has no unknown symbol {unk_symbol!r}")
        return cls(ids, ids[unk_symbol])

    def encode(self, words: Sequence[str]) -> list[int]:
        return [self.ids.get(word, self.unk_id) for word in words]


@dataclass(frozen=True)
class Punctuated:
    """text: the punctuated text, as FunASR's inference returns it ("" for a blank one). classes: one class per
    word (FunASR's punc_array: its final edits included), None for a blank text. calls: the ids of each call of
    the model, in order (a call is a mini-sentence with the words carried into it)."""

    text: str
    classes: tuple[int, ...] | None
    calls: tuple[tuple[int, ...], ...] = ()


class Punctuator:
    """A transcript in, punctuated text out, by `logits` (a call's ids -> logits) and the model's classes."""

    def __init__(self, vocabulary: Vocabulary, punc_list: Sequence[str], sentence_end_id: int, logits: Logits,
                 split_size: int = SPLIT_SIZE) -> None:
        self.vocabulary, self.punc_list, self.sentence_end_id = vocabulary, tuple(punc_list), sentence_end_id
        self.logits, self.split_size = logits, split_size

    def punctuate(self, text: str) -> Punctuated:
        """CTTransformer.inference on one text (the module docstring lists its steps)."""
        if not text.strip():
            return Punctuated("", None)
        words = split_words(text)
        chunks = split_to_mini_sentence(words, self.split_size)
        id_chunks = split_to_mini_sentence(self.vocabulary.encode(words), self.split_size)
        cache, cache_ids, out, classes, calls = [], [], "", [], []
        for index, (chunk, chunk_ids) in enumerate(zip(chunks, id_chunks)):
            sentence, ids = cache + chunk, cache_ids + chunk_ids
            calls.append(tuple(ids))
            punctuation = [int(c) for c in self.logits(np.asarray(ids, dtype=np.int64)).argmax(-1)]
            if index < len(chunks) - 1:
                end = self.cut(punctuation, len(sentence))
                cache, cache_ids = sentence[end + 1:], ids[end + 1:]
                sentence, punctuation = sentence[:end + 1], punctuation[:end + 1]
            out += self.join(sentence, punctuation)
            if index == len(chunks) - 1:
                out = self.close(out, punctuation)
            classes += punctuation
        return Punctuated(out, tuple(classes), tuple(calls))

    def cut(self, punctuation: list[int], words: int) -> int:
        """Where a call that is not the last ends: its last sentence end, searched from its second-to-last word
        down to its third; else, past CACHE_POP_TRIGGER_LIMIT words, its last comma (made a sentence end, in
        place); else -1 (nothing kept, every word carried on)."""
        last_comma = -1
        for i in range(len(punctuation) - 2, 1, -1):
            if self.punc_list[punctuation[i]] in SENTENCE_ENDS:
                return i
            if last_comma < 0 and self.punc_list[punctuation[i]] == COMMA:
                last_comma = i
        if words > CACHE_POP_TRIGGER_LIMIT and last_comma >= 0:
            punctuation[last_comma] = self.sentence_end_id
            return last_comma
        return -1

    def join(self, sentence: list[str], punctuation: list[int]) -> str:
        """One call's words and their punctuation as FunASR writes them."""
        words, parts = list(sentence), []
        for i, word in enumerate(words):
            if (i == 0 or self.punc_list[punctuation[i - 1]] in SENTENCE_ENDS) and is_ascii(word):
                word = word.capitalize()
            if is_ascii(word) and (i == 0 or is_ascii(words[i - 1])):
                word = " " + word
            words[i] = word
            parts.append(word)
            mark = self.punc_list[punctuation[i]]
            if mark != NONE:
                parts.append(ASCII_FORMS.get(mark, mark) if is_ascii(word) else mark)
        return "".join(parts)

    def close(self, text: str, punctuation: list[int]) -> str:
        """The end of the text: a final "，", "、" or "," becomes a sentence end, a text ending otherwise gets one
        ("。", or "." after ASCII); the last word's class becomes sentence_end_id (in place) where either
        happened."""
        last = text[-1]
        if last in (COMMA, PAUSE):
            text = text[:-1] + "。"
        elif last == ",":
            text = text[:-1] + "."
        elif last not in SENTENCE_ENDS and len(last.encode()) != 1:
            text += "。"
        elif last not in (".", "?") and len(last.encode()) == 1:
            text += "."
        else:
            return text
        if punctuation:
            punctuation[-1] = self.sentence_end_id
        return text


class PunctuationGraph:
    """The exported graph on ONNX Runtime: each call padded into the smallest word container that holds it
    (pipeline/shapes.py punctuation_container). On the CPU one session serves every container (its provider
    compiles nothing per shape); elsewhere each container is a session of its own with every dimension fixed
    (DirectML specialises its kernels on the first shape it sees). Sessions are made on first use."""

    def __init__(self, path: Path, providers: Sequence = ("CPUExecutionProvider",),
                 provider_options: Sequence[dict] | None = None, session_config: dict[str, str] | None = None,
                 containers: tuple[int, ...] = DEFAULT_PUNCTUATION_CONTAINERS, per_container: bool = False) -> None:
        self.path, self.providers, self.provider_options = Path(path), list(providers), provider_options
        self.session_config = session_config or {}
        self.containers, self.per_container = containers, per_container
        self.sessions: dict[int | None, object] = {}

    def session(self, size: int):
        """The session a call of `size` word rows runs on."""
        import onnxruntime as ort

        key = size if self.per_container else None
        if key not in self.sessions:
            options = ort.SessionOptions()
            for entry, value in self.session_config.items():
                options.add_session_config_entry(entry, value)
            if key is not None:
                for name, value in zip(PUNCTUATION_FREE_DIMENSIONS, (1, key)):
                    options.add_free_dimension_override_by_name(name, value)
            self.sessions[key] = ort.InferenceSession(str(self.path), options, providers=self.providers,
                                                      provider_options=self.provider_options)
        return self.sessions[key]

    def warm_up(self) -> None:
        """Every container once, at exactly its shape."""
        for size in self.containers:
            self(np.zeros(size, dtype=np.int64))

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        """ids int [words] -> logits float32 [words, classes]."""
        words = len(ids)
        size = punctuation_container(words, self.containers)
        padded = np.zeros((1, size), dtype=np.int32)
        padded[0, :words] = ids
        feeds = dict(zip(PUNCTUATION_INPUT_NAMES, (padded, np.array([words], dtype=np.int32))))
        return self.session(size).run(None, feeds)[0][0, :words]


def load_punctuator(model_dir: str | Path, precision: str = "fp32", device: str = "cpu") -> Punctuator:
    """A Punctuator on the model directory's graph of `precision` (ModelLoadError for another kind of model)."""
    from .providers import provider_config

    directory = read_model_directory(model_dir)
    if directory.manifest.architecture != CT_TRANSFORMER.architecture:
        raise ModelLoadError(f"{directory.path} holds a {directory.manifest.architecture} model, not a punctuation "
                             "model", path=str(directory.path))
    dims = directory.manifest.dimensions
    config = provider_config(device)
    graph = PunctuationGraph(directory.onnx_path(precision), config.providers, config.provider_options,
                             config.session_config, per_container=device != "cpu")
    vocabulary = Vocabulary.from_tokens(directory.tokens, dims.get("unk_symbol", "<unk>"))
    return Punctuator(vocabulary, dims["punc_list"], dims["sentence_end_id"], graph)
