"""Paraformer decoding: FunASR's text rules and token times, on hand-made graph outputs (no model)."""
from __future__ import annotations

import gzip
import json
from functools import cache
from pathlib import Path

import numpy as np

from pipeline.families.paraformer.decoding import (ParaformerOutput, cif_peaks, decode_paraformer, inference_peaks, postprocess,
                                         token_times_ms, torch_sum)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "paraformer" / "text_cases.json.gz"

TOKENS = ["<blank>", "<s>", "</s>", "你", "好", "世", "界", "hello", "wor@@", "ld", "a", "b", "c", "2024", "，", "<unk>"]


def output(ids: list[int], frames: int = 40) -> ParaformerOutput:
    """Evenly spread CIF weights: one token every 40 / (len + 1) frames, as a model would fire them."""
    alphas = np.full(frames, (len(ids) + 0.5) / frames, np.float32)
    return ParaformerOutput(np.array(ids, np.int32), np.zeros(len(ids), np.float32), alphas,
                            cif_peaks(alphas, 1.0))


def text(ids: list[int]) -> str:
    return decode_paraformer(output(ids), TOKENS).text


def test_chinese_without_spaces_english_with_spaces():
    assert text([3, 4, 5, 6]) == "你好世界"
    assert text([7, 8, 9]) == "hello world"
    assert text([3, 4, 7, 5, 6]) == "你好hello世界"  # no space between an English word and a character
    assert text([7, 13, 3]) == "hello2024你"  # FunASR treats digits as characters: no space either


def test_specials_dropped_and_abbreviations_joined():
    assert text([1, 3, 15, 4, 2]) == "你好"
    assert text([10, 11, 12, 3]) == "ABC你"
    assert text([3, 14, 4]) == "你，好"


def test_tokens_join_to_the_text_and_words_have_times():
    transcript = decode_paraformer(output([7, 8, 9, 3, 4]), TOKENS, offset=10.0)
    assert "".join(t.text for t in transcript.tokens) == transcript.text == "hello world你好"
    assert [w.text for w in transcript.words] == ["hello", "world", "你", "好"]
    starts = [w.start for w in transcript.words]
    assert starts == sorted(starts) and all(10.0 <= w.start <= w.end <= 10.0 + 40 * 0.06 for w in transcript.words)


def test_no_tokens_no_text():
    assert decode_paraformer(output([]), TOKENS).text == ""
    assert token_times_ms(np.zeros(10, np.float32), np.zeros(10, np.float32), 0) == []


def test_long_gap_is_cut_to_twelve_frames():
    """A token 30 frames after the previous one lasts at most 12 frames (0.72 s); the rest is silence."""
    alphas = np.zeros(60, np.float32)
    alphas[[2, 3]] = 0.5  # token 0 fires at frame 3
    alphas[[34, 35]] = 0.5  # token 1 fires at frame 35
    alphas[50] = 1.0  # the extra peak FunASR's rule expects
    times = token_times_ms(alphas, cif_peaks(alphas, 1.0), 2)
    assert len(times) == 2
    (s0, e0), (s1, e1) = times
    assert e0 - s0 <= 720 and s1 >= e0 + 1000  # the silence between them belongs to neither


@cache
def funasr_cases() -> dict:
    """FunASR's own outputs on seeded random inputs (tests/fixtures/make_paraformer_text_fixture.py)."""
    return json.loads(gzip.decompress(FIXTURE.read_bytes()))


def test_issue_37_space_kept_after_an_english_word_when_a_character_cuts_the_pieces():
    items, spans = postprocess(["yugolo", "tiel@@", "蕱", "ab"], [(0, 7), (10, 17), (20, 27), (30, 37)])
    assert "".join(items) == "yugolo 蕱tielab"  # FunASR's sentence_postprocess, quirk included
    assert spans == [(0, 7), (10, 17), (30, 37)]  # 蕱 takes tiel@@'s time, "tielab" only ab's


def test_text_and_word_times_match_funasr_on_every_generated_case():
    cases = funasr_cases()["text_cases"]
    assert len(cases) >= 5000
    for case in cases:
        tokens = case["tokens"]
        items, spans = postprocess(tokens, [(10 * i, 10 * i + 7) for i in range(len(tokens))])
        assert ("".join(items), [w.strip() for w in items]) == (case["text"], case["words"]), tokens
        if case["word_times"] is not None:  # None: FunASR itself raised IndexError on this one
            assert [list(s) for s in spans] == case["word_times"], tokens


def test_token_times_match_funasr_on_every_generated_case():
    fixture = funasr_cases()
    for case in fixture["time_cases"]:
        alphas = np.array(case["alpha_units"], np.float32) / np.float32(fixture["alpha_unit"])
        tokens = case["tokens"]
        count = len(tokens) - (bool(tokens) and tokens[-1] == "</s>")
        times = token_times_ms(alphas, cif_peaks(alphas, 1.0 - 1e-4), count)
        expected = case["times"] if case["times"] is not None else []  # None: FunASR raised IndexError
        assert [list(t) for t in times] == expected, case


def test_inference_peaks_and_token_times_match_funasrs_inference():
    """Whole clips' CIF weights: FunASR's inference peaks (cif_v1, its running sum rounded to float32) made from
    the alphas bit for bit, and the token times it prints of them; 20 of the 30 rows are timed otherwise when
    the peaks are exact (the graph's), the 61 ms difference a real 25 s clip showed (docs/benchmarks.md)."""
    fixture = funasr_cases()
    cases = fixture["inference_cases"]
    assert sum(case["differs_without_rounding"] for case in cases) >= 20
    for case in cases:
        alphas = np.array(case["alpha_units"], np.float32) / np.float32(fixture["inference_unit"])
        peaks = inference_peaks(alphas)
        np.testing.assert_array_equal(peaks, np.array(case["peak_bits"], np.int32).view(np.float32))
        assert [list(t) for t in token_times_ms(alphas, peaks, case["count"])] == case["times"]
        ids = np.full(case["count"], 3, np.int32)
        exact = ParaformerOutput(ids, np.zeros(len(ids), np.float32), alphas, cif_peaks(alphas, 1.0))
        words = decode_paraformer(exact, TOKENS).words  # given the graph's exact peaks, times as FunASR's
        assert [[round(w.start * 1000), round(w.end * 1000)] for w in words] == [[max(s, 0), e] for s, e in case["times"]]


def test_torch_sum_is_torchs_float32_sum_bit_for_bit():
    """The sum FunASR rescales the peaks by (`alphas.sum()`), on the lengths a clip gives and past them."""
    import torch

    rng = np.random.default_rng(37)
    for length in list(range(1, 70)) + [int(n) for n in rng.integers(70, 5000, 60)]:
        values = (rng.random(length) * rng.random() * 3).astype(np.float32)
        assert torch_sum(values) == torch.from_numpy(values).sum().item(), length
