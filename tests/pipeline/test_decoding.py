from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.audio import OUTPUT_FRAME_SECONDS, PROMPT_FRAMES
from pipeline.families.sensevoice.decoding import decode_ctc
from pipeline.transcript import TokenTiming, merge_words

TOKENS = [
    "<blank>", "<unk>", "<s>", "</s>",
    "<|en|>", "<|zh|>", "<|NEUTRAL|>", "<|HAPPY|>", "<|Speech|>", "<|Laughter|>", "<|woitn|>", "<|withitn|>",
    "\u2581hel", "lo", "\u2581world", ",", "\u2581it", "'s", "你", "好", "<0xE4>", "<0xBD>", "<0xA0>", "\u2581l",
]
ID = {t: i for i, t in enumerate(TOKENS)}


def matrix(path: list[str], vocab: int = len(TOKENS)) -> np.ndarray:
    """Log-probabilities [T, V] whose argmax spells `path` frame by frame ("" means blank)."""
    lp = np.full((len(path), vocab), -10.0, np.float32)
    for t, token in enumerate(path):
        lp[t, ID[token] if token else 0] = -0.01
    return lp


PROMPT = ["<|en|>", "<|NEUTRAL|>", "<|Speech|>", "<|woitn|>"]  # what SenseVoice puts in its 4 prompt frames


def test_tags_repeats_and_blanks():
    path = PROMPT + ["", "\u2581hel", "\u2581hel", "lo", "", "", "\u2581world", "\u2581world", "", ","]
    result = decode_ctc(matrix(path), len(path), TOKENS)
    assert result.text == "hello world,"
    assert (result.language, result.emotion, result.event) == ("en", "NEUTRAL", "Speech")
    assert [t.text for t in result.tokens] == [" hel", "lo", " world", ","]
    assert [w.text for w in result.words] == ["hello", "world,"]


def test_token_times_come_from_their_frame_runs_after_the_prompt():
    path = PROMPT + ["", "\u2581hel", "\u2581hel", "lo", "", "", "\u2581world", "\u2581world"]
    f = OUTPUT_FRAME_SECONDS
    result = decode_ctc(matrix(path), len(path), TOKENS, offset=10.0)
    hel, lo, world = result.tokens
    assert (hel.start, hel.end) == pytest.approx((10 + 1 * f, 10 + 3 * f))
    assert (lo.start, lo.end) == pytest.approx((10 + 3 * f, 10 + 4 * f))
    assert (world.start, world.end) == pytest.approx((10 + 6 * f, 10 + 8 * f))
    hello = result.words[0]
    assert (hello.start, hello.end) == pytest.approx((hel.start, lo.end))


def test_times_never_precede_the_offset():
    # A text token inside the prompt frames (a model that emits no tags) is clamped to the offset.
    path = ["\u2581hel", "", "", "", "", "lo"]
    result = decode_ctc(matrix(path), len(path), TOKENS, offset=2.5)
    assert result.tokens[0].start == result.tokens[0].end == 2.5
    assert result.tokens[1].start == pytest.approx(2.5 + OUTPUT_FRAME_SECONDS)
    assert result.language is None and result.emotion is None and result.event is None


def test_a_blank_separates_a_repeated_token():
    path = PROMPT + ["\u2581l", "", "\u2581l", "\u2581l"]
    assert decode_ctc(matrix(path), len(path), TOKENS).text == "l l"


def test_tags_anywhere_never_reach_the_text_and_the_first_of_each_kind_wins():
    path = ["<|zh|>", "<|HAPPY|>", "<|Speech|>", "<|withitn|>", "你", "<|Laughter|>", "好", "<|en|>", "<|woitn|>"]
    result = decode_ctc(matrix(path), len(path), TOKENS)
    assert result.text == "你好"
    assert (result.language, result.emotion, result.event) == ("zh", "HAPPY", "Speech")
    assert [w.text for w in result.words] == ["你", "好"]  # every CJK character is a word


def test_special_tokens_are_dropped():
    path = PROMPT + ["<unk>", "\u2581it", "<s>", "'s", "</s>"]
    result = decode_ctc(matrix(path), len(path), TOKENS)
    assert result.text == "it's"
    assert [t.text for t in result.tokens] == [" it", "'s"]


def test_frames_beyond_length_are_padding():
    path = PROMPT + ["\u2581world", "", "\u2581hel", "\u2581hel"]
    result = decode_ctc(matrix(path), PROMPT_FRAMES + 2, TOKENS)
    assert result.text == "world"
    assert decode_ctc(matrix(path), 0, TOKENS).text == ""


def test_byte_fallback_pieces_become_characters():
    path = PROMPT + ["<0xE4>", "<0xBD>", "<0xA0>", "好"]
    result = decode_ctc(matrix(path), len(path), TOKENS)
    assert result.text == "你好"
    assert result.tokens[0].start == pytest.approx(0.0) and result.tokens[0].end == pytest.approx(3 * OUTPUT_FRAME_SECONDS)


def test_shape_errors():
    with pytest.raises(ValueError, match="tokens for a vocabulary"):
        decode_ctc(np.zeros((3, 5), np.float32), 3, TOKENS)
    with pytest.raises(ValueError, match="frames, vocab"):
        decode_ctc(np.zeros((3,), np.float32), 3, TOKENS)


def test_merge_words_keeps_punctuation_with_its_word():
    tokens = [TokenTiming(" hel", 0, 1), TokenTiming("lo", 1, 2), TokenTiming(",", 2, 3), TokenTiming(" you", 3, 4)]
    assert merge_words(tokens) == [TokenTiming("hello,", 0, 3), TokenTiming("you", 3, 4)]


def reference_decode(logprobs: np.ndarray, length: int, tokens: list[str]) -> list[tuple[str, int, int]]:
    """The textbook loop: (piece, first frame, last frame + 1) of each emitted non-blank run."""
    out, prev = [], None
    for t in range(length):
        k = int(np.argmax(logprobs[t]))
        if k != prev and k != 0:
            out.append([tokens[k], t, t + 1])
        elif k == prev and k != 0:
            out[-1][2] = t + 1
        prev = k
    return [tuple(x) for x in out]


@settings(max_examples=60, deadline=None)
@given(
    ids=st.lists(st.sampled_from([0, 0, 0, ID["\u2581hel"], ID["lo"], ID["\u2581world"], ID[","]]), max_size=40),
    seed=st.integers(0, 2**16),
)
def test_matches_a_plain_loop(ids, seed):
    rng = np.random.default_rng(seed)
    lp = rng.uniform(-9, -5, (len(ids), len(TOKENS))).astype(np.float32)
    lp[np.arange(len(ids)), ids] = -0.1
    f = OUTPUT_FRAME_SECONDS
    got = decode_ctc(lp, len(ids), TOKENS, prompt_frames=0)
    want = reference_decode(lp, len(ids), TOKENS)
    assert [t.text for t in got.tokens] == [p.replace("\u2581", " ") for p, _, _ in want]
    got_times = [x for t in got.tokens for x in (t.start, t.end)]
    assert got_times == pytest.approx([x for _, a, b in want for x in (a * f, b * f)])


def test_container_sized_input():
    # A 30 s container: 4 + 500 frames over SenseVoice's 25055 tokens.
    vocab = 25055
    tokens = ["<blank>"] + [f"\u2581w{i}" for i in range(1, vocab)]
    lp = np.random.default_rng(0).standard_normal((504, vocab)).astype(np.float32)
    result = decode_ctc(lp, 504, tokens)
    assert len(result.tokens) == len(result.words) > 400
