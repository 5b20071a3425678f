"""pipeline/trim.py: the model hears speech with its pre-roll and never more silence; decoding.starting_at:
no word starts before the speech (issue 25)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pipeline.audio import SAMPLE_RATE
from pipeline.decoding import TokenTiming, Transcript, starting_at
from pipeline.segmenter import Segmenter, SegmenterOptions, SegmentFinished
from pipeline.trim import for_model, speech_in, trim_to_speech


def segments(audio: np.ndarray, options: SegmenterOptions) -> list[SegmentFinished]:
    segmenter = Segmenter(options)
    return [e for e in segmenter.feed(audio) + segmenter.finish() if isinstance(e, SegmentFinished)]


def test_trim_to_speech_keeps_the_rolls_and_never_reaches_past_the_audio():
    audio = np.arange(5 * SAMPLE_RATE, dtype=np.float32)  # each sample its own index
    cut, audio_start = trim_to_speech(audio, 10.0, 12.0, 13.0, 0.3, 0.2)
    assert audio_start == pytest.approx(11.7) and len(cut) == round(1.5 * SAMPLE_RATE)
    assert cut[0] == round(1.7 * SAMPLE_RATE)
    whole, start = trim_to_speech(audio, 10.0, 10.1, 14.9, 0.3, 0.2)  # less silence than the rolls: all kept
    assert start == 10.0 and len(whole) == len(audio)


def test_a_longer_client_pre_roll_is_cut_to_the_models(demo_speech):
    """Realtime's prefix_padding_ms 600 gives segments 0.6 s before the speech; the model gets 0.3 s of it,
    the very samples a segmenter with the default pre-roll cuts, with the speech times untouched."""
    audio = np.concatenate([np.zeros(2 * SAMPLE_RATE, np.float32), demo_speech.audio])
    model = SegmenterOptions(partial_interval=0.0)
    client = dataclasses.replace(model, pre_roll=0.6)
    for wide, usual in zip(segments(audio, client), segments(audio, model), strict=True):
        trimmed = for_model(wide, model)
        assert wide.audio_start == pytest.approx(wide.start - 0.6)
        assert (trimmed.start, trimmed.end, trimmed.audio_start) == (usual.start, usual.end, usual.audio_start)
        np.testing.assert_array_equal(trimmed.audio, usual.audio)
        assert for_model(usual, model) is usual  # the segmenter's own segments are already what the model hears


def test_speech_in_a_whole_buffer_is_what_an_upload_segment_holds(demo_speech):
    """2 s of silence before one utterance and 1.5 s after: the buffer becomes the segment the segmenter
    cuts, times shifted by the buffer's offset; a buffer of silence or of a beep is no segment at all."""
    first = demo_speech.utterances[0]
    speech = demo_speech.audio[: int((first["end"] + 0.3) * SAMPLE_RATE)]
    audio = np.concatenate([np.zeros(2 * SAMPLE_RATE, np.float32), speech, np.zeros(SAMPLE_RATE * 3 // 2, np.float32)])
    options = SegmenterOptions()
    (usual,) = segments(audio, dataclasses.replace(options, partial_interval=0.0))
    found = speech_in(audio, options, offset=5.0, segment=3)
    assert found.segment == 3 and found.start == pytest.approx(usual.start + 5)
    assert found.end == pytest.approx(usual.end + 5)
    assert found.audio_start == pytest.approx(usual.audio_start + 5) == pytest.approx(found.start - options.pre_roll)
    np.testing.assert_array_equal(found.audio, usual.audio)
    t = np.arange(3 * SAMPLE_RATE) / SAMPLE_RATE
    beep = np.where((t > 1.0) & (t < 1.1), 0.2 * np.sin(2 * np.pi * 1000 * t), 0).astype(np.float32)
    assert speech_in(np.zeros(3 * SAMPLE_RATE, np.float32), options) is None and speech_in(beep, options) is None


def test_words_start_at_the_speech_not_in_the_pre_roll():
    """A word emitted in the pre-roll starts at the speech and keeps its length, up to the next word."""
    early = Transcript("three five", tokens=(TokenTiming(" three", 1.76, 1.82), TokenTiming(" five", 2.03, 2.09)),
                       words=(TokenTiming("three", 1.76, 1.82), TokenTiming("five", 2.03, 2.09)))
    fixed = starting_at(early, 2.0)
    assert [(w.text, w.start, w.end) for w in fixed.words] == [("three", 2.0, 2.03), ("five", 2.03, 2.09)]
    assert [(t.start, t.end) for t in fixed.tokens] == [(2.0, 2.03), (2.03, 2.09)]
    assert fixed.text == early.text and starting_at(fixed, 2.0) is fixed
    alone = starting_at(Transcript("three", words=(TokenTiming("three", 1.76, 1.82),)), 2.0)
    assert alone.words[0].start == 2.0 and alone.words[0].end == pytest.approx(2.06)


def test_a_false_start_before_the_speech_is_not_its_start(demo_speech):
    """webrtcvad takes the first frames of a noisy stream for speech: 0.5 s of a quiet room (-50 dBFS)
    before the speech opened the segment at 0 s, and the model heard all 0.5 s. Now the false start is
    dropped after false_start_silence and the speech opens its own segment, with the usual pre-roll."""
    first = demo_speech.utterances[0]
    speech = demo_speech.audio[int((first["start"] - 0.05) * SAMPLE_RATE): int((first["end"] + 0.3) * SAMPLE_RATE)]
    audio = np.concatenate([np.zeros(SAMPLE_RATE * 2 // 5, np.float32), speech])  # speech from 0.45 s
    audio += np.random.default_rng(0).standard_normal(len(audio)).astype(np.float32) * 10 ** (-50 / 20)
    options = SegmenterOptions(partial_interval=0.0)
    (found,) = segments(audio, options)
    assert 0.4 <= found.start <= 0.7
    assert found.audio_start == pytest.approx(found.start - options.pre_roll)
    with pytest.raises(ValueError, match="false_start_silence"):
        Segmenter(dataclasses.replace(options, false_start_silence=0.0))
