"""The append-only rule (pipeline/stable_prefix.py): deltas never revise, and add up to the completed text."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.stable_prefix import StablePrefix, units


def test_words_and_cjk_characters_are_units():
    assert units("play  music") == [("play", 4), ("music", 11)]
    assert units("你好 world。") == [("你", 1), ("好", 2), ("world", 8), ("。", 9)]


def test_two_agreeing_partials_commit_all_but_the_last_word():
    prefix = StablePrefix()
    assert prefix.update("four") == ""  # one partial proves nothing
    assert prefix.update("four four") == "four"  # agreed: "four"; held back: the newest last word
    assert prefix.update("four for six") == ""  # revises an uncommitted word: nothing new agrees
    assert prefix.update("four for six") == " for"
    assert prefix.update("for four six") == ""  # revises committed words: ignored until the final
    assert prefix.complete("four four six") == " six"  # committed words kept, the rest after their match
    assert prefix.text == "four for six"


def test_the_final_keeps_the_committed_prefix_and_loses_no_word():
    prefix = StablePrefix()
    prefix.update("call seven")
    assert prefix.update("call seven two") == "call seven"
    assert prefix.complete("call eleven two one") == " two one"  # "seven" stays: it was sent
    fresh = StablePrefix()
    assert fresh.complete(" stop zero eight ") == "stop zero eight"  # no partials: the final as it is
    cjk = StablePrefix()
    cjk.update("你好世")
    assert cjk.update("你好世界") == "你好世"
    assert cjk.complete("你好世界。") == "界。"


WORDS = st.lists(st.sampled_from(["one", "two", "three", "oh", "go", "stop"]), max_size=8)


@settings(max_examples=300, deadline=None)
@given(partials=st.lists(WORDS, max_size=10), final=WORDS, agreement=st.integers(1, 3), holdback=st.integers(0, 2),
       honest=st.booleans())
def test_deltas_are_always_a_prefix_of_the_completed_transcript(partials, final, agreement, holdback, honest):
    """Whatever the partials say, the deltas add up to the start of the completed text; when every partial
    is a start of the final (it revised nothing that was sent), the completed text is exactly the final."""
    if honest:
        partials = [final[:len(p)] for p in partials]
    prefix = StablePrefix(agreement, holdback)
    sent = ""
    for partial in partials:
        sent += prefix.update(" ".join(partial))
        assert sent == prefix.text
    completed = sent + prefix.complete(" ".join(final))
    assert completed == prefix.text and completed.startswith(sent)
    if honest:
        assert completed == " ".join(final)
