"""pipeline/punctuation.py against FunASR's own CTTransformer.inference, the text side alone: each call answered
with FunASR's logits of the same call (tests/ct_punc_reference.py), the words, the calls (which ids, cut where),
the text and the classes must be FunASR's, on every generated text of 1-500 words (and the blank ones).
The fixture's texts reach every branch: cuts at a sentence end, none (every word carried on), the comma cut
past 200 words, a 500-word text that is one growing call, and each ending rule."""
from __future__ import annotations

import pytest

from ct_punc_reference import MODEL_CONF, REFERENCE, TOKENS, call_logits, replay
from pipeline.punctuation import (CACHE_POP_TRIGGER_LIMIT, Punctuator, Vocabulary, split_to_mini_sentence,
                                  split_words)
from pipeline.shapes import DEFAULT_PUNCTUATION_CONTAINERS, punctuation_container

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
