from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pipeline.audio import SAMPLE_RATE, VAD_FRAME, seconds_to_samples
from pipeline.segmenter import (
    PartialDue,
    SegmenterOptions,
    Segmenter,
    SegmentFinished,
    SpeechStarted,
)

TOLERANCE = 0.3  # seconds between a segment's times and where the fixture's speech really is


def run(samples: np.ndarray, options: SegmenterOptions | None = None, chunk: int = 1600) -> list:
    segmenter = Segmenter(options)
    events = []
    for i in range(0, len(samples), chunk):
        events += segmenter.feed(samples[i:i + chunk])
    return events + segmenter.finish()


def finals(events: list) -> list[SegmentFinished]:
    return [e for e in events if isinstance(e, SegmentFinished)]


def check_event_order(events: list) -> None:
    """Exactly one SpeechStarted, then partials, then one SegmentFinished per segment, numbered 0, 1, 2..."""
    open_segment = None
    expected = 0
    for e in events:
        if isinstance(e, SpeechStarted):
            assert open_segment is None and e.segment == expected
            open_segment = e
        elif isinstance(e, PartialDue):
            assert open_segment is not None and e.segment == open_segment.segment
        else:
            assert open_segment is not None and e.segment == open_segment.segment
            assert e.start >= open_segment.start  # later when its lead proved to be steady noise
            open_segment, expected = None, expected + 1
    assert open_segment is None


def silence(seconds: float) -> np.ndarray:
    return np.zeros(seconds_to_samples(seconds), np.float32)


def test_three_utterances_give_three_segments_where_the_speech_is(speech):
    events = run(speech.audio)
    check_event_order(events)
    segments = finals(events)
    assert len(segments) == len(speech.utterances) == 3
    for seg, utt in zip(segments, speech.utterances):
        assert abs(seg.start - utt["start"]) < TOLERANCE
        assert abs(seg.end - utt["end"]) < TOLERANCE
        # The audio starts with the pre-roll and stops soon after the speech (post_roll).
        assert seg.audio.dtype == np.float32
        assert seg.audio_start == pytest.approx(seg.start - 0.3, abs=0.031)
        audio_end = seg.audio_start + len(seg.audio) / SAMPLE_RATE
        assert seg.end <= audio_end <= seg.end + 0.2 + 1e-6


@pytest.mark.parametrize("chunk", [7, VAD_FRAME, 4000, 10**7])
def test_events_do_not_depend_on_how_the_audio_is_chunked(speech, chunk):
    reference = run(speech.audio, chunk=1600)
    events = run(speech.audio, chunk=chunk)
    got = [(type(e).__name__, e.segment, e.start) for e in events if not isinstance(e, PartialDue)]
    want = [(type(e).__name__, e.segment, e.start) for e in reference if not isinstance(e, PartialDue)]
    assert got == want
    for a, b in zip(finals(events), finals(reference)):
        assert a.end == b.end
        np.testing.assert_array_equal(a.audio, b.audio)


def test_segment_audio_is_the_stream_audio(speech):
    for seg in finals(run(speech.audio)):
        first = seconds_to_samples(seg.audio_start)
        np.testing.assert_array_equal(seg.audio, speech.audio[first:first + len(seg.audio)])


def test_digital_silence_gives_no_events():
    assert run(silence(20.0)) == []


def test_quiet_white_noise_gives_no_events():
    # Measured: webrtcvad (aggressiveness 2 or 3) marks about 1% of white-noise frames at -30 dBFS as
    # voiced, too few to open a segment. At -25 dBFS and louder it marks nearly all of them voiced: see
    # test_loud_noise_is_speech_but_segments_stay_bounded.
    noise = np.random.default_rng(1).standard_normal(seconds_to_samples(20.0)).astype(np.float32)
    assert run(noise * 10 ** (-30 / 20)) == []


def test_loud_noise_is_speech_but_segments_stay_bounded():
    noise = np.random.default_rng(2).standard_normal(seconds_to_samples(25.0)).astype(np.float32)
    options = SegmenterOptions(max_segment_seconds=8.0)
    segments = finals(run(noise * 10 ** (-20 / 20), options))
    assert len(segments) >= 3
    assert all(len(s.audio) <= seconds_to_samples(8.0) for s in segments)


def test_speech_in_moderate_noise_still_gives_three_segments(speech):
    noise = np.random.default_rng(3).standard_normal(len(speech.audio)).astype(np.float32)
    segments = finals(run(speech.audio + noise * 10 ** (-40 / 20)))
    assert len(segments) == 3
    for seg, utt in zip(segments, speech.utterances):
        assert abs(seg.start - utt["start"]) < TOLERANCE and abs(seg.end - utt["end"]) < TOLERANCE


def long_speech(speech, seconds: float, gap: float = 0.15) -> np.ndarray:
    """The fixture's utterances over and over with gaps shorter than end_silence: one long stretch."""
    pieces = [silence(0.5)]
    total = 0.5
    while total < seconds:
        for utt in speech.utterances:
            piece = speech.audio[seconds_to_samples(utt["start"]):seconds_to_samples(utt["end"])]
            pieces += [piece, silence(gap)]
            total += len(piece) / SAMPLE_RATE + gap
    return np.concatenate(pieces + [silence(1.0)])


def noise_after_a_muted_gap(speech, dbfs: float) -> tuple[np.ndarray, float]:
    """The fixture, 1 s of digital zeros (a muted microphone), then the fixture again over steady white
    noise at `dbfs`; and the time where the second copy starts."""
    noise = np.random.default_rng(5).standard_normal(len(speech.audio)).astype(np.float32) * 10 ** (dbfs / 20)
    second = len(speech.audio) / SAMPLE_RATE + 1.0
    return np.concatenate([speech.audio, silence(1.0), speech.audio + noise]), second


@pytest.mark.parametrize("dbfs", [-45.0, -40.0])
def test_steady_noise_after_digital_silence_is_not_the_start_of_speech(speech, dbfs):
    stream, second = noise_after_a_muted_gap(speech, dbfs)
    events = run(stream)
    check_event_order(events)
    first = next(s for s in finals(events) if s.end > second)
    assert abs(first.start - (second + speech.utterances[0]["start"])) < TOLERANCE
    pre_roll = SegmenterOptions().pre_roll
    assert first.audio_start == pytest.approx(first.start - pre_roll, abs=0.031)  # the pre-roll, no more
    at = seconds_to_samples(first.audio_start)
    assert np.array_equal(first.audio, stream[at: at + len(first.audio)])
    # Without the rule webrtcvad's verdict stands: the segment opens where the noise does.
    unruled = run(stream, SegmenterOptions(steady_lead_db=0))
    assert next(s for s in finals(unruled) if s.end > second).start < second + 0.1


@pytest.mark.parametrize("dbfs", [-45.0, -40.0])
def test_partials_never_move_where_a_segment_starts(speech, dbfs):
    # Where speech starts after a steady lead is worked out a little more at each partial (the scan goes on
    # from where the last one stopped), so a segment must come out the same with partials every frame or
    # none: a muted gap then white noise, and brown noise stepping up from digital zeros, cut at the limit too.
    white, _ = noise_after_a_muted_gap(speech, dbfs)
    brown = np.cumsum(np.random.default_rng(6).standard_normal(len(speech.audio) + SAMPLE_RATE)).astype(np.float32)
    brown *= 10 ** (dbfs / 20) / np.sqrt(np.mean(np.square(brown)))
    brown[len(speech.audio) // 2:][:SAMPLE_RATE] = 0  # digital silence in the middle, then the noise again
    brown = np.concatenate([silence(0.5), brown[:SAMPLE_RATE], speech.audio + brown[SAMPLE_RATE:]])
    for stream in (white, brown):
        for limit in (30.0, 4.0):
            options = SegmenterOptions(max_segment_seconds=limit, cut_search=1.0)
            quiet = finals(run(stream, dataclasses.replace(options, partial_interval=0.0)))
            busy = run(stream, dataclasses.replace(options, partial_interval=0.03), chunk=480)
            assert len([e for e in busy if isinstance(e, PartialDue)]) > 50
            assert [(s.start, s.end, s.audio_start) for s in finals(busy)] == [(s.start, s.end, s.audio_start)
                                                                            for s in quiet]
            assert all(np.array_equal(a.audio, b.audio) for a, b in zip(finals(busy), quiet))


@pytest.mark.parametrize("limit", [30.0, 7.0])
def test_long_speech_is_cut_below_the_limit_without_losing_audio(speech, limit):
    audio = long_speech(speech, 45.0)
    events = run(audio, SegmenterOptions(max_segment_seconds=limit))
    check_event_order(events)
    segments = finals(events)
    assert len(segments) >= int(45.0 / limit) + 1
    assert all(len(s.audio) <= seconds_to_samples(limit) for s in segments)
    # Cut segments join without gap or overlap: each next one's audio starts where the previous one's ends.
    for a, b in zip(segments, segments[1:]):
        assert b.audio_start == pytest.approx(a.audio_start + len(a.audio) / SAMPLE_RATE, abs=1e-6)
        assert a.end <= b.start
        assert np.sqrt(np.mean(np.square(a.audio[-VAD_FRAME:]))) < 0.01  # cut in a pause between words
    stitched = np.concatenate([s.audio for s in segments])
    first = seconds_to_samples(segments[0].audio_start)
    np.testing.assert_array_equal(stitched, audio[first:first + len(stitched)])


def test_partials_are_periodic_bounded_and_inside_their_segment(speech):
    events = run(speech.audio, SegmenterOptions(partial_interval=0.5, partial_window=1.0))
    check_event_order(events)
    partials = [e for e in events if isinstance(e, PartialDue)]
    assert len(partials) >= 6  # each utterance lasts over 1 s
    for p in partials:
        assert len(p.audio) <= seconds_to_samples(1.0)
        assert p.audio_start + len(p.audio) / SAMPLE_RATE == pytest.approx(p.end, abs=1e-6)
        assert p.start >= p.audio_start
    for a, b in zip(partials, partials[1:]):
        if a.segment == b.segment:
            assert b.end - a.end >= 0.5 - 1e-6


def test_partials_off():
    options = SegmenterOptions(partial_interval=0)
    rng = np.random.default_rng(4)
    events = run(rng.standard_normal(seconds_to_samples(5.0)).astype(np.float32) * 0.1, options)
    assert events and not any(isinstance(e, PartialDue) for e in events)


def test_blips_shorter_than_min_speech_are_dropped(speech):
    onset = seconds_to_samples(speech.utterances[1]["start"]) + 3200
    for seconds, expected in [(0.06, 0), (0.4, 1)]:
        burst = speech.audio[onset:onset + seconds_to_samples(seconds)]
        audio = np.concatenate([silence(1.0), burst, silence(1.0)])
        assert len(finals(run(audio, SegmenterOptions(min_speech=0.2)))) == expected


def test_finish_in_mid_speech_closes_the_segment(speech):
    cut = (speech.utterances[1]["start"] + speech.utterances[1]["end"]) / 2
    audio = speech.audio[:seconds_to_samples(cut) + 123]  # not a whole number of VAD frames
    segmenter = Segmenter()
    events = segmenter.feed(audio)
    assert len(finals(events)) == 1
    last = segmenter.finish()
    assert [type(e) for e in last] == [SegmentFinished]
    assert last[0].end == pytest.approx(len(audio) / SAMPLE_RATE, abs=1e-6)
    assert last[0].audio_start + len(last[0].audio) / SAMPLE_RATE == pytest.approx(last[0].end, abs=1e-6)
    assert segmenter.finish() == []
    with pytest.raises(RuntimeError):
        segmenter.feed(audio)


@pytest.mark.parametrize("into", [0.1, 0.125, 0.15])
def test_a_cut_keeps_speech_too_short_for_a_segment_only_while_it_goes_on(speech, into):
    """finish(cut=True), a client's commit: speech still going on in the last frame is a segment however
    short (the audio after the cut completes it); a blip that already ended is dropped as always."""
    onset = speech.utterances[1]["start"]
    piece = speech.audio[seconds_to_samples(onset - 0.3):seconds_to_samples(onset + into)]
    audio = np.concatenate([silence(1.0), piece])
    blip = np.concatenate([audio, silence(0.5)])
    for buffer, cut, expected in [(audio, False, 0), (audio, True, 1), (blip, True, 0)]:
        segmenter = Segmenter()
        found = finals(segmenter.feed(buffer) + segmenter.finish(cut=cut))
        assert len(found) == expected, (buffer is blip, cut)
        if found:  # up to the cut, from the pre-roll before the speech
            assert found[0].end == pytest.approx(len(buffer) / SAMPLE_RATE, abs=1e-6)
            assert found[0].audio_start <= found[0].start - 0.2 and 1.0 <= found[0].start <= 1.0 + 0.3 + into


def test_memory_stays_bounded_while_silent():
    segmenter = Segmenter()
    block = silence(1.0) + np.float32(1e-4)
    for _ in range(120):
        assert segmenter.feed(block[:-5]) == []
    assert len(segmenter._ring) <= segmenter._ring.maxlen
    assert len(segmenter._pending) < VAD_FRAME
    assert segmenter.seconds == pytest.approx(120 * (SAMPLE_RATE - 5) // VAD_FRAME * VAD_FRAME / SAMPLE_RATE)


@pytest.mark.parametrize(
    "change, match",
    [
        ({"vad_aggressiveness": 4}, "vad_aggressiveness"),
        ({"start_frames": 0}, "start_frames"),
        ({"start_frames": 11, "start_window": 10}, "start_frames"),
        ({"pre_roll": -0.1}, "pre_roll"),
        ({"end_silence": float("nan")}, "end_silence"),
        ({"end_silence": 0.01}, "end_silence"),
        ({"post_roll": 0.6, "end_silence": 0.5}, "post_roll"),
        ({"max_segment_seconds": 0.5}, "max_segment_seconds"),
        ({"cut_search": 20.0}, "cut_search"),
        ({"partial_window": 0.0}, "partial_window"),
        ({"min_speech": "0.2"}, "min_speech"),
    ],
)
def test_invalid_options_are_named(change, match):
    with pytest.raises(ValueError, match=match):
        Segmenter(dataclasses.replace(SegmenterOptions(), **change))
