"""pipeline/punctuation.py against FunASR's own CTTransformer.inference, the text side alone: each call answered
with FunASR's logits of the same call (tests/ct_punc_reference.py), the words, the calls (which ids, cut where),
the text and the classes must be FunASR's, on every generated text of 1-500 words (and the blank ones).
The fixture's texts reach every branch: cuts at a sentence end, none (every word carried on), the comma cut
past 200 words, a 500-word text that is one growing call, and each ending rule. Then what the server makes of
a final with it: each word as the punctuated text writes it, and the sentences, word times unchanged."""
from __future__ import annotations

import numpy as np
import pytest

from ct_punc_reference import MODEL_CONF, REFERENCE, TOKENS, call_logits, replay
from pipeline.punctuation import (CACHE_POP_TRIGGER_LIMIT, Punctuated, Punctuator, Vocabulary, aligned,
                                  punctuate_transcript, punctuation_languages, split_to_mini_sentence, split_words)
from pipeline.shapes import DEFAULT_PUNCTUATION_CONTAINERS, punctuation_container
from pipeline.transcript import TokenTiming, Transcript

VOCABULARY = Vocabulary.from_tokens(TOKENS)


def punctuator(logits) -> Punctuator:
    return Punctuator(VOCABULARY, MODEL_CONF["punc_list"], MODEL_CONF["sentence_end_id"], logits)


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_funasr_text_classes_and_calls(name: str) -> None:
    expected = REFERENCE[name]
    result = punctuator(replay(name)).punctuate(expected["text"])
    assert split_words(expected["text"]) == expected["words"]
    assert [list(call) for call in result.calls] == expected["calls"]
    assert result.text == expected["funasr_text"]
    assert (None if result.classes is None else list(result.classes)) == expected["punc_array"]


def test_the_texts_reach_every_branch_of_the_cutting() -> None:
    """1-500 words; calls past 200 words cut at a comma; one text that is a single call growing to 500 words."""
    words = [len(r["words"]) for r in REFERENCE.values() if r["words"]]
    assert min(words) == 1 and max(words) == 500
    longest = {name: max(map(len, r["calls"]), default=0) for name, r in REFERENCE.items()}
    assert longest["no_end_500"] == 500 and len(REFERENCE["no_end_500"]["calls"]) == 25
    for name in ("commas_230", "commas_410"):  # the cache grew past the trigger, then was cut at a comma
        assert CACHE_POP_TRIGGER_LIMIT < longest[name] < 500
        cut_at = [punctuator(None).cut(classes, len(classes)) for classes in
                  ([int(c) for c in logits.argmax(-1)] for logits in call_logits(name)[:-1])
                  if len(classes) > CACHE_POP_TRIGGER_LIMIT]
        assert cut_at and all(end >= 0 for end in cut_at)
        assert not any(MODEL_CONF["punc_list"][int(c)] in ("。", "？") for logits in call_logits(name)
                       for c in logits.argmax(-1)[2:-1])  # no sentence end where the cut looks for one
    endings = {r["funasr_text"][-1] for r in REFERENCE.values() if r["funasr_text"]}
    assert endings == {"。", ".", "？"}


def test_split_words_as_funasr() -> None:
    assert split_words("abc中文def  ok好的\tiPhone很好AI\n") == [
        "abc", "中", "文", "def", "ok", "好", "的", "iPhone", "很", "好", "AI"]
    assert split_words("it's 3.5 km，好") == ["it's", "3.5", "km", "，", "好"]
    assert split_words("   ") == []


def test_split_to_mini_sentence_as_funasr() -> None:
    assert split_to_mini_sentence(list(range(45))) == [list(range(20)), list(range(20, 40)), list(range(40, 45))]
    assert split_to_mini_sentence(list(range(40))) == [list(range(20)), list(range(20, 40))]
    assert split_to_mini_sentence([]) == [[]]
    with pytest.raises(ValueError):
        split_to_mini_sentence([1, 2], 1)


def test_unknown_words_take_the_unknown_id() -> None:
    assert VOCABULARY.encode(["的", "zebra", "Hello"]) == [TOKENS.index("的"), TOKENS.index("<unk>"),
                                                          TOKENS.index("<unk>")]  # case kept, as FunASR
    with pytest.raises(ValueError, match="no unknown symbol"):
        Vocabulary.from_tokens(["a", "b"])


def test_word_containers() -> None:
    assert [punctuation_container(n) for n in (1, 32, 33, 200, 512, 513, 1500)] == [32, 32, 64, 256, 512, 1024, 1536]
    assert punctuation_container(5, (8,)) == 8 and punctuation_container(17, (8,)) == 24
    assert max(DEFAULT_PUNCTUATION_CONTAINERS) == 512
    with pytest.raises(ValueError):
        punctuation_container(0)


# ---- a final's punctuation: each word as the text writes it, and the sentences (punctuate_transcript) ------

@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_each_word_as_the_text_writes_it(name: str) -> None:
    """The words' written forms and marks spell FunASR's text, blanks aside (a "<unk>" class, which FunASR
    writes as "<unk>", is no mark)."""
    result = punctuator(replay(name)).punctuate(REFERENCE[name]["text"])
    assert result.words == tuple(REFERENCE[name]["words"])
    assert [w.lower() for w in result.written] == [w.lower() for w in result.words]
    assert "".join(w + m for w, m in zip(result.written, result.marks)) == "".join(
        result.text.replace("<unk>", "").split())


def timed(*texts: str) -> tuple[TokenTiming, ...]:
    return tuple(TokenTiming(t, i * 0.25, i * 0.25 + 0.2) for i, t in enumerate(texts))


class FixedClasses:
    """A Punctuator's logits that give each word (by its id) the class `classes` names, else "_"."""

    def __init__(self, classes: dict[str, str]) -> None:
        self.classes = {VOCABULARY.ids[w]: MODEL_CONF["punc_list"].index(c) for w, c in classes.items()}

    def __call__(self, ids):
        logits = np.zeros((len(ids), len(MODEL_CONF["punc_list"])), dtype=np.float32)
        for i, word_id in enumerate(ids):
            logits[i, self.classes.get(int(word_id), 1)] = 1.0
        return logits


def test_a_transcript_gets_its_text_words_and_sentences_with_times_unchanged() -> None:
    words = timed("open", "the", "window", "的", "一", "是", "please", "在")
    transcript = Transcript("open the window的一是please在", words=words)
    marks = FixedClasses({"window": "，", "一": "。", "please": "？"})
    out = punctuate_transcript(punctuator(marks), transcript)
    assert out.words == words and out.text == transcript.text  # the transcript's own fields stay
    assert out.punctuation.text == " Open the window,的一。是please?在。"
    assert out.punctuated_text == "Open the window,的一。是please?在。"
    assert out.punctuation.words == ("Open", "the", "window,", "的", "一。", "是", "please?", "在。")
    assert [(s.words, s.mark) for s in out.punctuation.sentences] == [
        (words[:3], ","), (words[3:5], "。"), (words[5:7], "?"), (words[7:], "。")]
    assert (out.punctuation.sentences[1].start, out.punctuation.sentences[1].end) == (words[3].start, words[4].end)


def test_words_split_otherwise_keep_their_characters_and_times() -> None:
    """FunASR's words are split_words of the text; a transcript word holding several of them (a Latin word with
    an accented letter) gets their marks inside it, and ends a sentence only with the mark of its last one."""
    words = timed("caf", "café", "一")
    out = aligned(Punctuated("caf，caf，é一。", (2, 2, 1, 3), (), ("caf", "caf", "é", "一"),
                             ("caf", "caf", "é", "一"), (",", ",", "", "。")), words)
    assert out.words == ("caf,", "caf,é", "一。")
    assert [(s.words, s.mark) for s in out.sentences] == [(words[:1], ","), (words[1:], "。")]


def test_a_transcript_whose_words_do_not_spell_its_text_stays_one_sentence() -> None:
    words = timed("hello", "world")
    out = aligned(Punctuated(" Hello world.", (1, 3), (), ("hello", "there"), ("Hello", "there"), ("", ".")), words)
    assert out.text == " Hello world." and out.words == ("hello", "world")
    assert [(s.words, s.mark) for s in out.sentences] == [(words, "")]


def test_a_text_the_model_punctuated_itself_or_a_blank_one_is_left_as_it_was() -> None:
    never = punctuator(lambda ids: pytest.fail("the model ran"))
    for text in ("你好，世界。", "Hello, world", "  "):
        transcript = Transcript(text, words=timed(*text.split()))
        assert punctuate_transcript(never, transcript) is transcript


def test_the_languages_a_vocabulary_reads() -> None:
    assert punctuation_languages(TOKENS) == ("zh", "en")
    assert punctuation_languages(["<unk>", "的", "是"] + ["x"] * 10) == ("zh", "en")
    assert punctuation_languages(["<unk>", "的", "是"] + [f"{n}" for n in range(150)]) == ("zh",)
    assert punctuation_languages(["<unk>", "的"] + [f"{n}" for n in range(150)]) == ()  # under 1 % of the words
    assert punctuation_languages(["<blank>", "▁zero", "▁one"]) == ()  # sentencepiece pieces are no words
