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
For the server: `punctuate_transcript` gives a final's Transcript its Punctuation (pipeline/transcript.py): the
text above, each of the transcript's words as that text writes it and its sentences (`aligned`: FunASR's
words matched with the transcript's by their characters; the words' times are the transcript's, unchanged);
`punctuation_languages` says which languages a model's vocabulary reads (the server's check at start).
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from .errors import ModelLoadError
from .families import CT_TRANSFORMER
from .modeldir import PUNCTUATION_FREE_DIMENSIONS, PUNCTUATION_INPUT_NAMES, ModelDirectory, read_model_directory
from .shapes import DEFAULT_PUNCTUATION_CONTAINERS, punctuation_container
from .transcript import Punctuation, Sentence, TokenTiming, Transcript, is_cjk

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
    the model, in order (a call is a mini-sentence with the words carried into it). Per word of the text
    (split_words), in order: `words` as given, `written` as the text writes it (capitalised where FunASR
    capitalises; no blank), `marks` the punctuation the text writes after it, in its ASCII form after an ASCII
    word ("" for none; a "<unk>" class is no mark, though FunASR writes "<unk>" in the text)."""

    text: str
    classes: tuple[int, ...] | None
    calls: tuple[tuple[int, ...], ...] = ()
    words: tuple[str, ...] = ()
    written: tuple[str, ...] = ()
    marks: tuple[str, ...] = ()


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
        cache, cache_ids, out, classes, calls, written = [], [], "", [], [], []
        for index, (chunk, chunk_ids) in enumerate(zip(chunks, id_chunks)):
            sentence, ids = cache + chunk, cache_ids + chunk_ids
            calls.append(tuple(ids))
            punctuation = [int(c) for c in self.logits(np.asarray(ids, dtype=np.int64)).argmax(-1)]
            if index < len(chunks) - 1:
                end = self.cut(punctuation, len(sentence))
                cache, cache_ids = sentence[end + 1:], ids[end + 1:]
                sentence, punctuation = sentence[:end + 1], punctuation[:end + 1]
            text, forms = self.join(sentence, punctuation)
            out, written = out + text, written + forms
            if index == len(chunks) - 1:
                out = self.close(out, punctuation)
            classes += punctuation
        # the text ends with a sentence end (close), written after the last word: "." even after a Chinese word
        # whose "<unk>" class FunASR wrote as "<unk>"
        marks = tuple(self.mark(c, w) for c, w in zip(classes[:-1], words)) + (out[-1],)
        return Punctuated(out, tuple(classes), tuple(calls), tuple(words), tuple(written), marks)

    def mark(self, punctuation: int, word: str) -> str:
        """The punctuation a class writes after `word`: "，。？、" (ASCII forms after an ASCII word), or ""."""
        mark = self.punc_list[punctuation]
        if mark not in SENTENCE_ENDS + (COMMA, PAUSE):
            return ""
        return ASCII_FORMS.get(mark, mark) if is_ascii(word) else mark

    def warm_up(self) -> None:
        """Run every word container once, where `logits` is a graph that has them (PunctuationGraph)."""
        warm_up = getattr(self.logits, "warm_up", None)
        if warm_up is not None:
            warm_up()

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

    def join(self, sentence: list[str], punctuation: list[int]) -> tuple[str, list[str]]:
        """One call's words and their punctuation as FunASR writes them; and each word as written (no blank)."""
        words, parts, written = list(sentence), [], []
        for i, word in enumerate(words):
            if (i == 0 or self.punc_list[punctuation[i - 1]] in SENTENCE_ENDS) and is_ascii(word):
                word = word.capitalize()
            written.append(word)
            if is_ascii(word) and (i == 0 or is_ascii(words[i - 1])):
                word = " " + word
            words[i] = word
            parts.append(word)
            mark = self.punc_list[punctuation[i]]
            if mark != NONE:
                parts.append(ASCII_FORMS.get(mark, mark) if is_ascii(word) else mark)
        return "".join(parts), written

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


LANGUAGE_SHARE = 0.01  # a language is read when this share of the vocabulary's words is written in its script
_LATIN_WORD = re.compile(r"[A-Za-z][A-Za-z']*")


def punctuation_languages(tokens: Sequence[str]) -> tuple[str, ...]:
    """The languages a punctuation model's vocabulary reads (a word outside it is "<unk>" to the model): "zh"
    where at least LANGUAGE_SHARE of its words are Han characters, "en" where as many are Latin words."""
    han = sum(1 for t in tokens if t and is_cjk(t[0]) and not 0x3000 <= ord(t[0]) <= 0x30FF)
    latin = sum(1 for t in tokens if _LATIN_WORD.fullmatch(t))
    least = LANGUAGE_SHARE * len(tokens)
    return tuple(code for code, count in (("zh", han), ("en", latin)) if count and count >= least)


# A text holding any of these was punctuated by its speech model (SenseVoice with ITN, Qwen3-ASR): left as it is.
WRITTEN_MARKS = frozenset("，。？！、；：,.?!;:")


def punctuate_transcript(punctuator: Punctuator, transcript: Transcript) -> Transcript:
    """`transcript` with its Punctuation (the punctuator's text of transcript.text; its words' punctuated forms
    and its sentences, `aligned`); words, tokens and times unchanged. A blank text, or one that already holds
    punctuation (WRITTEN_MARKS), comes back as it was."""
    if not transcript.text.strip() or WRITTEN_MARKS.intersection(transcript.text):
        return transcript
    return dataclasses.replace(transcript, punctuation=aligned(punctuator.punctuate(transcript.text), transcript.words))


def aligned(punctuated: Punctuated, words: Sequence[TokenTiming]) -> Punctuation:
    """FunASR's words of a text (split_words) aligned with the transcript's words by their characters (blanks
    aside): each transcript word written as the punctuated text writes those characters (capitalised where it
    is), followed by the mark of each FunASR word that ends inside it (one word each, as a rule: a CJK character,
    or an ASCII word); a sentence ends with each word that ends in a mark, and the words after the last mark
    make one more, with no mark. Where the two spell different characters (a transcript whose text is not its
    words'), the words stay as they are and make one sentence."""
    spelled = "".join(w.text for w in words)
    if spelled != "".join(punctuated.words) or any(map(lambda a, b: len(a) != len(b), punctuated.words,
                                                       punctuated.written)):
        return Punctuation(punctuated.text, tuple(w.text for w in words),
                           (Sentence(tuple(words), ""),) if words else ())
    characters = "".join(punctuated.written)
    after = [""] * len(characters)  # the mark written after each character
    end = 0
    for word, mark in zip(punctuated.words, punctuated.marks):
        end += len(word)
        after[end - 1] = mark
    forms, sentences, current, at = [], [], [], 0
    for word in words:
        span = range(at, at + len(word.text))
        forms.append("".join(characters[i] + after[i] for i in span))
        current.append(word)
        at = span.stop
        if after[at - 1]:
            sentences.append(Sentence(tuple(current), after[at - 1]))
            current = []
    if current:
        sentences.append(Sentence(tuple(current), ""))
    return Punctuation(punctuated.text, tuple(forms), tuple(sentences))


class PunctuationGraph:
    """The exported graph on ONNX Runtime: each call padded into the smallest word container that holds it
    (pipeline/shapes.py punctuation_container), or with `open_shapes` run at its own length. On the CPU one
    session serves every shape (its provider compiles nothing per shape), and the server's runs at their own
    lengths (load_punctuator: a call's cost grows with its rows, 0.2-0.9 ms a row at ct-punc's sizes on two
    cores, so a 20-word call padded to 32 paid half as much again); elsewhere each container is a session of its
    own with every dimension fixed (DirectML specialises its kernels on the first shape it sees). Sessions are
    made on first use."""

    def __init__(self, path: Path, providers: Sequence = ("CPUExecutionProvider",),
                 provider_options: Sequence[dict] | None = None, session_config: dict[str, str] | None = None,
                 containers: tuple[int, ...] = DEFAULT_PUNCTUATION_CONTAINERS, per_container: bool = False,
                 threads: int = 0, open_shapes: bool = False) -> None:
        if open_shapes and per_container:
            raise ValueError("a graph with a session per container runs its containers' shapes only")
        self.path, self.providers, self.provider_options = Path(path), list(providers), provider_options
        self.session_config = session_config or {}
        self.containers, self.per_container, self.open_shapes = containers, per_container, open_shapes
        self.threads = threads  # intra-op threads; 0: ONNX Runtime's default (one per physical core)
        self.sessions: dict[int | None, object] = {}

    def session(self, size: int):
        """The session a call of `size` word rows runs on."""
        import onnxruntime as ort

        key = size if self.per_container else None
        if key not in self.sessions:
            options = ort.SessionOptions()
            options.intra_op_num_threads = self.threads
            for entry, value in self.session_config.items():
                options.add_session_config_entry(entry, value)
            if key is not None:
                for name, value in zip(PUNCTUATION_FREE_DIMENSIONS, (1, key)):
                    options.add_free_dimension_override_by_name(name, value)
            self.sessions[key] = ort.InferenceSession(str(self.path), options, providers=self.providers,
                                                      provider_options=self.provider_options)
        return self.sessions[key]

    def warm_up(self) -> None:
        """Every container once, at exactly its shape (with open shapes: the session made, and run once)."""
        for size in self.containers[:1] if self.open_shapes else self.containers:
            self(np.zeros(size, dtype=np.int64))

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        """ids int [words] -> logits float32 [words, classes]."""
        words = len(ids)
        size = words if self.open_shapes else punctuation_container(words, self.containers)
        padded = np.zeros((1, size), dtype=np.int32)
        padded[0, :words] = ids
        feeds = dict(zip(PUNCTUATION_INPUT_NAMES, (padded, np.array([words], dtype=np.int32))))
        return self.session(size).run(None, feeds)[0][0, :words]


def load_punctuator(model_dir: str | Path | ModelDirectory, precision: str = "fp32", device: str = "cpu",
                    threads: int = 0) -> Punctuator:
    """A Punctuator on the model directory's graph of `precision` (ModelLoadError for another kind of model);
    its sessions are made on first use (or by Punctuator.warm_up)."""
    from .providers import provider_config

    directory = model_dir if isinstance(model_dir, ModelDirectory) else read_model_directory(model_dir)
    if directory.manifest.architecture != CT_TRANSFORMER.architecture:
        raise ModelLoadError(f"{directory.path} holds a {directory.manifest.architecture} model, not a punctuation "
                             "model", path=str(directory.path))
    dims = directory.manifest.dimensions
    config = provider_config(device)
    graph = PunctuationGraph(directory.onnx_path(precision), config.providers, config.provider_options,
                             config.session_config, per_container=device != "cpu", threads=threads,
                             open_shapes=device == "cpu")
    vocabulary = Vocabulary.from_tokens(directory.tokens, dims.get("unk_symbol", "<unk>"))
    return Punctuator(vocabulary, dims["punc_list"], dims["sentence_end_id"], graph)
