from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from pipeline.audio import load_audio
from pipeline.families.sensevoice.beam_search import BLANK_SKIP, TOP_K_WINDOW, beam_search, top_k
from pipeline.families.sensevoice.decoding import decode_ctc
from pipeline.errors import ProtocolError
from pipeline.families.sensevoice.hotwords import ContextGraph, Speller
from pipeline.hotwords import DEFAULT_BOOST, MAX_HOTWORDS, Hotword, parse_hotwords, parse_word_weights, read_hotwords_file
from fixtures.make_hotword_fixture import BLEND_BOOST

TOKENS = ["<blank>", "<unk>", "<|en|>", "<|NEUTRAL|>", "<|Speech|>", "<|woitn|>",
          "\u2581four", "\u2581oh", "\u2581save", "\u2581send", "\u2581turn", "\u2581on", "\u2581the", "\u2581music",
          "\u2581mu", "sic", "阿", "里", "巴", "\u2581阿"]
ID = {t: i for i, t in enumerate(TOKENS)}
PROMPT = ["<|en|>", "<|NEUTRAL|>", "<|Speech|>", "<|woitn|>"]
SPELLER = Speller(TOKENS)


def frames(path: list[dict[str, float] | str]) -> np.ndarray:
    """Log-probabilities [T, V]: a frame is a token ("" for blank) at probability ~1, or a {token: prob}
    mixture whose remainder goes to the blank."""
    lp = np.full((len(path), len(TOKENS)), math.log(1e-6), np.float32)
    for t, frame in enumerate(path):
        probs = {frame: 0.999} if isinstance(frame, str) else dict(frame)
        probs = {("<blank>" if k == "" else k): v for k, v in probs.items()}
        probs.setdefault("<blank>", max(1e-6, 1.0 - sum(probs.values())))
        for token, p in probs.items():
            lp[t, ID[token]] = math.log(p)
    return lp


def decode(lp: np.ndarray, words=None, beam: int = 4):
    graph = ContextGraph(parse_hotwords(words), SPELLER) if words else None
    ids, values = top_k(lp, len(lp))
    return beam_search(ids, values, len(lp), TOKENS, graph, beam)


# ---- the context graph -----------------------------------------------------------------------------------

def test_graph_gives_bonus_while_matching_and_takes_it_back_when_the_match_breaks():
    graph = ContextGraph((Hotword("turn on the music", 2.0),), SPELLER)
    state, total = graph.root, 0.0
    for token in ["\u2581turn", "\u2581on"]:
        gain, state = graph.step(state, ID[token])
        total += gain
    assert total == pytest.approx(4.0)
    gain, state = graph.step(state, ID["\u2581save"])  # the match breaks: everything given back
    assert total + gain == pytest.approx(0.0) and state is graph.root


def test_a_completed_hotword_keeps_its_bonus():
    graph = ContextGraph((Hotword("turn on", 2.0),), SPELLER)
    state, total = graph.root, 0.0
    for token in ["\u2581turn", "\u2581on", "\u2581save"]:
        gain, state = graph.step(state, ID[token])
        total += gain
    assert total + graph.finish(state) == pytest.approx(4.0)


def test_failure_links_keep_the_suffix_that_still_matches():
    graph = ContextGraph((Hotword("on the music", 1.0), Hotword("turn on", 1.0)), SPELLER)
    state, total = graph.root, 0.0
    for token in ["\u2581turn", "\u2581on", "\u2581the", "\u2581music"]:
        gain, state = graph.step(state, ID[token])
        total += gain
    # "turn on" completed (kept: 2), then "on the music" matched through the failure link (3, kept)
    assert total + graph.finish(state) == pytest.approx(5.0)


def test_spelling_uses_the_longest_pieces_and_cjk_without_a_word_start():
    assert SPELLER.spellings(Hotword("music")) == [[ID["\u2581music"]]]
    assert SPELLER.spellings(Hotword("阿里巴巴")) == [[ID["\u2581阿"], ID["里"], ID["巴"], ID["巴"]],
                                                   [ID["阿"], ID["里"], ID["巴"], ID["巴"]]]
    with pytest.raises(ProtocolError) as err:
        SPELLER.spellings(Hotword("zebra"))
    assert err.value.code == "bad_start"


# ---- validation ------------------------------------------------------------------------------------------

def test_parse_hotwords_accepts_strings_and_objects():
    words = parse_hotwords(["save", {"text": "  Turn   ON ", "boost": 3}, "save"])
    assert words == (Hotword("Turn ON", 3.0), Hotword("save", DEFAULT_BOOST))
    assert SPELLER.spellings(words[0]) == [[ID["\u2581turn"], ID["\u2581on"]]]  # a lower-case model


@pytest.mark.parametrize("value", [
    "save", [3], [""], ["x" * 65], [{"text": "save", "weight": 2}], [{"boost": 2}], [{"text": "a", "boost": 0}],
    [{"text": "a", "boost": 11}], [{"text": "a", "boost": True}], [{"text": "a", "boost": "2"}], ["a\x00b"],
    ["w"] * (MAX_HOTWORDS + 1),
])
def test_bad_hotwords_are_bad_start(value):
    with pytest.raises(ProtocolError) as err:
        parse_hotwords(value)
    assert err.value.code == "bad_start"


def test_funasr_word_weights():
    assert parse_word_weights('{"阿里巴巴": 20, "hello world": 40, "off": 0}') == (
        Hotword("阿里巴巴", 2.0), Hotword("hello world", 4.0))
    assert parse_word_weights("save 30\nturn on 15\n") == (Hotword("save", 3.0), Hotword("turn on", 1.5))
    assert parse_word_weights('{"save": 1000}') == (Hotword("save", 10.0),)
    # plain text as FunASR's Python client passes it on: a word list, split on spaces (FunASR's server does)
    # or commas (its newer client joins a file's words so); a bare number is a word, not a JSON value
    both = (Hotword("阿里巴巴", 2.0), Hotword("达摩院", 2.0))
    assert parse_word_weights("阿里巴巴 达摩院") == parse_word_weights("阿里巴巴,达摩院") == both
    assert parse_word_weights("2024") == (Hotword("2024", 2.0),)
    for bad in ('{"save": "x"}', '["save"]', '{"save": null}'):
        with pytest.raises(ProtocolError):
            parse_word_weights(bad)
    # JSON nested past the interpreter's recursion is no JSON value (it was a RecursionError: an internal
    # error at the FunASR door); as words it is one word, too long
    with pytest.raises(ProtocolError, match="5000 characters long"):
        parse_word_weights("[" * 5000)


def test_hotwords_file(tmp_path):
    path = tmp_path / "hot.txt"
    path.write_text("# commands\nsave\n\nturn on the music\t2.5\n", encoding="utf-8")
    assert read_hotwords_file(path, SPELLER.spellings) == (Hotword("save"), Hotword("turn on the music", 2.5))
    path.write_text("save\nzebra\n", encoding="utf-8")
    with pytest.raises(ValueError, match=":2:.*zebra"):
        read_hotwords_file(path, SPELLER.spellings)
    # as Windows Notepad saves it: a byte-order mark and CRLF line ends
    path.write_bytes("\ufeffsave\r\nturn on the music\t2.5\r\n".encode("utf-8"))
    assert read_hotwords_file(path, SPELLER.spellings) == (Hotword("save"), Hotword("turn on the music", 2.5))


# ---- the search ------------------------------------------------------------------------------------------

AMBIGUOUS = PROMPT + ["", {"\u2581four": 0.5, "\u2581oh": 0.4}, {"\u2581four": 0.5, "\u2581oh": 0.4}, "", "",
                      {"\u2581save": 0.55, "\u2581send": 0.4}, "", ""]
CLEAR = PROMPT + ["", {"\u2581four": 0.97, "\u2581oh": 0.02}, "\u2581four", "", "", "\u2581save", "", ""]


def test_without_hotwords_the_search_gives_greedy_output_times_included():
    for path in (AMBIGUOUS, CLEAR):
        lp = frames(path)
        assert decode(lp) == decode_ctc(lp, len(lp), TOKENS)


def test_hotwords_flip_ambiguous_frames():
    lp = frames(AMBIGUOUS)
    assert decode_ctc(lp, len(lp), TOKENS).text == "four save"
    biased = decode(lp, ["oh", "send"])
    assert biased.text == "oh send"
    greedy = decode_ctc(lp, len(lp), TOKENS)
    assert [(t.start, t.end) for t in biased.tokens] == [(t.start, t.end) for t in greedy.tokens]
    assert biased.language == "en" and biased.event == "Speech"


def test_hotwords_do_not_override_clear_evidence():
    lp = frames(CLEAR)
    assert decode(lp, ["oh", "send", "turn on the music"]) == decode_ctc(lp, len(lp), TOKENS)


def test_a_hotword_replaces_the_word_it_competes_with_instead_of_joining_it():
    # one word over two frames, the first a tie of "save" and "send", the second leaning to "send" (the
    # demo model's reading of a blend of the two): a boosted "save" takes both frames, not the first alone
    path = PROMPT + ["", {"\u2581save": 0.48, "\u2581send": 0.48}, {"\u2581send": 0.6, "\u2581save": 0.3}, "", "",
                     "\u2581music", "", ""]
    lp = frames(path)
    assert decode(lp).text == "send music"
    for words, expected in ((["save"], "save music"), ([{"text": "save", "boost": 4}], "save music"),
                            (["save", "send"], "send music"), ([{"text": "send", "boost": 4}], "send music")):
        result = decode(lp, words)
        assert result.text == expected, words
        assert result.tokens[-1] == decode(lp).tokens[-1]  # "music" where it was


def test_a_partial_match_earns_nothing():
    # "turn on" is clearly said; the hotword "turn on the music" must not pull "the" out of noise
    path = PROMPT + ["\u2581turn", "", "\u2581on", "", {"\u2581the": 0.05}, "", ""]
    lp = frames(path)
    assert decode(lp, ["turn on the music"]).text == "turn on"


def test_repeated_tokens_need_a_blank_between_them():
    path = PROMPT + ["\u2581four", "\u2581four", "", "\u2581four", "", ""]
    lp = frames(path)
    result = decode(lp, ["four"])
    assert result.text == "four four"
    assert [(t.start, t.end) for t in result.tokens] == [(0.0, 0.12), (0.18, 0.24)]


def test_top_k_keeps_only_the_blank_on_blank_frames():
    lp = frames(AMBIGUOUS)
    ids, values = top_k(lp, len(lp), k=3)
    assert ids.shape == (len(lp), 3)
    blank_rows = lp[:, 0] > BLANK_SKIP
    assert np.all(ids[blank_rows, 0] == 0) and np.all(np.isneginf(values[blank_rows, 1:]))
    assert list(ids[5][:3]) == [ID["\u2581four"], ID["\u2581oh"], 0]
    assert np.all(np.diff(np.maximum(values[~blank_rows], -1e30), axis=1) <= 0)  # best first, -inf last


def test_padding_frames_past_the_length_are_ignored():
    lp = frames(CLEAR + ["\u2581send"] * 5)
    ids, values = top_k(lp, len(CLEAR))
    assert decode_ctc(lp, len(CLEAR), TOKENS) == beam_search(ids, values, len(CLEAR), TOKENS, None)


# ---- the demo model on real speech -------------------------------------------------------------------------

DEMO = Path(__file__).resolve().parents[2] / "models" / "demo"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "demo"


@pytest.fixture(scope="module")
def demo_engine():
    if not (DEMO / "manifest.json").is_file():
        pytest.skip("the demo model is not in this checkout")
    from pipeline.engine import Engine, EngineOptions

    return Engine(DEMO, EngineOptions(device="cpu", containers=(2, 4))).load()


def hot(engine, *words: str):
    return engine.hotword_graph(parse_hotwords(list(words)))


def test_hotwords_decide_acoustically_ambiguous_speech(demo_engine):
    audio = load_audio(FIXTURES / "save_send_blend.wav")  # "save"/"send" blended (make_hotword_fixture.py)
    greedy = demo_engine.transcribe(audio, offset=2.0)
    assert greedy.text in ("save message", "send message")
    for word in ("save", "send"):
        graph = demo_engine.hotword_graph(parse_hotwords([{"text": word, "boost": BLEND_BOOST}, "four"]))
        biased = demo_engine.transcribe(audio, offset=2.0, hotwords=graph)
        assert biased.text == f"{word} message"
        assert [(t.start, t.end) for t in biased.tokens] == [(t.start, t.end) for t in greedy.tokens]
        assert (biased.language, biased.emotion, biased.event) == (greedy.language, greedy.emotion, greedy.event)


def test_hotwords_leave_clear_speech_alone(demo_engine):
    entries = json.loads((FIXTURES / "transcripts.json").read_text())
    graph = hot(demo_engine, "four", "save", "send", "oh", "turn on the music")
    for entry in entries[:4]:
        audio = load_audio(FIXTURES / entry["audio"])
        greedy = demo_engine.transcribe(audio)
        assert demo_engine.transcribe(audio, hotwords=graph) == greedy, entry["audio"]


def test_demo_hotword_spelling_is_checked(demo_engine):
    with pytest.raises(ProtocolError) as err:
        hot(demo_engine, "save", "zebra")
    assert err.value.code == "bad_start" and "zebra" in str(err.value)


def test_top_k_matches_a_full_sort_within_its_window():
    rng = np.random.default_rng(0)
    lp = rng.normal(-40, 3, (60, 500)).astype(np.float32)
    lp[:, 0] = -1e-4  # blank frames ...
    lp[::3, 0] = -2.0  # ... and busy ones: peaky (a few tokens near the best) or flat (many)
    lp[::3, 7], lp[::6, 20:40] = -0.3, -1.0 - 0.01 * np.arange(20)
    ids, values = top_k(lp, len(lp), k=8)
    for t in range(0, len(lp), 3):
        best = np.argsort(-lp[t], kind="stable")[:8]
        near = lp[t, best] >= lp[t].max() - TOP_K_WINDOW
        assert np.array_equal(values[t, :near.sum()], lp[t, best[near]]), t
        assert set(ids[t, :near.sum()]) == set(best[near]) and np.all(np.isneginf(values[t, near.sum():])), t
