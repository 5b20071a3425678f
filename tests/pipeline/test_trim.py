"""pipeline/trim.py: the model hears speech with its pre-roll and never more silence; decoding.starting_at:
no word starts before the speech (issue 25)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile

from pipeline.audio import SAMPLE_RATE
from pipeline.transcript import TokenTiming, Transcript, after_context, before_cut, starting_at
from pipeline.segmenter import Segmenter, SegmenterOptions, SegmentFinished
from pipeline.families.sensevoice.decoding import transcript_from_runs
from pipeline.segmenter import PartialDue
from pipeline.trim import (CONTEXT_SECONDS, DIGITAL_SILENCE, JOIN_SILENCE, MAX_SAID_CHAIN, ONSET_LAG, SOUND_SCAN_BLOCK,
                           STREAM_START_LEAD, Context, Continuation, Said, for_model, prepared, segments_in, sound_end,
                           trim_to_speech)


def segments(audio: np.ndarray, options: SegmenterOptions) -> list[SegmentFinished]:
    segmenter = Segmenter(options)
    return [e for e in segmenter.feed(audio) + segmenter.finish() if isinstance(e, SegmentFinished)]


@pytest.mark.parametrize("zeros", [0, 1, SOUND_SCAN_BLOCK - 1, SOUND_SCAN_BLOCK, 3 * SOUND_SCAN_BLOCK + 7, 10**6])
def test_sound_end_is_the_last_sample_above_digital_silence(zeros):
    """Scanned from the end a block at a time: the same answer as the whole buffer's last sound, wherever the
    trailing digital silence ends (a block's edge, several blocks back, or no sound at all)."""
    sound = np.random.default_rng(zeros).uniform(-0.5, 0.5, 3 * SOUND_SCAN_BLOCK).astype(np.float32)
    sound[-5:] = DIGITAL_SILENCE / 2  # a resampler's +-1 LSB counts as silence too
    audio = np.concatenate([sound, np.zeros(zeros, np.float32)])
    assert sound_end(audio) == len(sound) - 5 == int(np.flatnonzero(np.abs(audio) > DIGITAL_SILENCE)[-1]) + 1
    assert sound_end(np.zeros(zeros, np.float32)) == 0


def test_trim_to_speech_keeps_the_rolls_and_never_reaches_past_the_audio():
    audio = np.arange(5 * SAMPLE_RATE, dtype=np.float32)  # each sample its own index
    cut, audio_start = trim_to_speech(audio, 10.0, 12.0, 13.0, 0.3, 0.2)
    assert audio_start == pytest.approx(11.7) and len(cut) == round(1.5 * SAMPLE_RATE)
    assert cut[0] == round(1.7 * SAMPLE_RATE)
    whole, start = trim_to_speech(audio, 10.0, 10.1, 14.9, 0.3, 0.2)  # less silence than the rolls: all kept
    assert start == 10.0 and len(whole) == len(audio)


def test_a_longer_client_pre_roll_is_cut_to_the_models(demo_speech):
    """Realtime's prefix_padding_ms 600 gives segments 0.6 s before the speech; the model hears what it hears
    of a segmenter's with the default pre-roll (here, after digital silence, its last STREAM_START_LEAD),
    with the speech times untouched."""
    audio = np.concatenate([np.zeros(2 * SAMPLE_RATE, np.float32), demo_speech.audio])
    model = SegmenterOptions(partial_interval=0.0)
    client = dataclasses.replace(model, pre_roll=0.6)
    for wide, usual in zip(segments(audio, client), segments(audio, model), strict=True):
        trimmed, heard = for_model(wide, model), for_model(usual, model)
        assert wide.audio_start == pytest.approx(wide.start - 0.6)
        assert (trimmed.start, trimmed.end) == (heard.start, heard.end)
        assert trimmed.audio_start == pytest.approx(heard.audio_start, abs=2e-6)
        np.testing.assert_array_equal(trimmed.audio, heard.audio)
        assert for_model(heard, model) is heard  # what the model hears, cut again, is the same


@pytest.mark.parametrize("noise_lead", [0.0, 0.05, 0.2, 0.3])
def test_the_model_never_hears_digital_silence_that_ends_in_the_room(noise_lead):
    """A segment's pre-roll of digital silence, then room noise from `noise_lead` s before the speech (a muted
    microphone, a client's gap): the model hears the noise and the speech, not the step out of the zeros,
    where it wrote a word ("oh", "back"); zeros that end at the speech or its soft onset (less than
    ONSET_LAG before it) are heard for STREAM_START_LEAD only; noise all the way is kept whole."""
    rng = np.random.default_rng(0)
    start, zeros = 5.0, round((0.3 - noise_lead) * SAMPLE_RATE)
    noise = (rng.standard_normal(round(0.3 * SAMPLE_RATE)) * 0.003).astype(np.float32)
    speech = (rng.standard_normal(SAMPLE_RATE) * 0.1).astype(np.float32)
    dither = rng.integers(-1, 2, zeros).astype(np.float32) / 32768  # a resampler's +-1 LSB (LiveKit's)
    audio = np.concatenate([dither, noise[zeros:], speech])
    segment = SegmentFinished(0, start, start + 1.0, audio, start - 0.3)
    heard = for_model(segment, SegmenterOptions())
    if noise_lead > ONSET_LAG:
        assert heard.audio_start == pytest.approx(start - noise_lead, abs=1 / SAMPLE_RATE)
        assert np.array_equal(heard.audio, audio[zeros:])
    else:  # the last STREAM_START_LEAD of the zeros, then the sound
        lead = round(STREAM_START_LEAD * SAMPLE_RATE)
        assert heard.audio_start == pytest.approx(start - noise_lead - STREAM_START_LEAD, abs=1 / SAMPLE_RATE)
        assert np.array_equal(heard.audio, audio[zeros - lead:])
    whole = SegmentFinished(0, start, start + 1.0, np.concatenate([noise, speech]), start - 0.3)
    assert for_model(whole, SegmenterOptions()) is whole


def test_zeros_before_the_room_are_cut_even_when_the_vad_took_the_room_for_speech():
    """webrtcvad, coming out of digital silence, often opens the segment on the room's first frames: the
    VAD's start is then the step itself. A sound that stays 20 dB under the speech's peak for 0.15 s after
    the zeros is still the room, and the zeros go; a fricative's onset, as quiet but briefer, keeps them."""
    rng = np.random.default_rng(1)
    start = 5.0
    zeros = np.zeros(round(0.3 * SAMPLE_RATE), np.float32)
    speech = (rng.standard_normal(SAMPLE_RATE) * 0.1).astype(np.float32)
    for quiet_seconds, cut in [(0.3, True), (0.08, False)]:
        quiet = (rng.standard_normal(round(quiet_seconds * SAMPLE_RATE)) * 0.003).astype(np.float32)
        audio = np.concatenate([zeros, quiet, speech])
        segment = SegmentFinished(0, start, start + 1.3, audio, start - 0.3)  # the VAD's start: at the step
        heard = for_model(segment, SegmenterOptions())
        first_sound = start if cut else start - STREAM_START_LEAD  # the fricative keeps STREAM_START_LEAD of zeros
        assert heard.audio_start == pytest.approx(first_sound, abs=1 / SAMPLE_RATE), quiet_seconds


@pytest.mark.parametrize("noise_trail", [0.05, 0.15])
def test_the_model_never_hears_digital_silence_after_the_room(noise_trail):
    """The speech, then room noise for `noise_trail` s past the VAD's last voiced frame, then digital silence
    (a client's zeros after a turn, a noise gate closing): the model hears the speech and the noise, not the
    step into the zeros, where it wrote a word ("back", "four five"); zeros after a sound that ends less than
    ONSET_LAG after the speech (a word's fading end) are kept; noise all the way is kept whole."""
    rng = np.random.default_rng(2)
    start, end = 5.0, 6.0
    speech = (rng.standard_normal(SAMPLE_RATE) * 0.1).astype(np.float32)
    noise = (rng.standard_normal(round(noise_trail * SAMPLE_RATE)) * 0.003).astype(np.float32)
    zeros = round((0.2 - noise_trail) * SAMPLE_RATE)  # to the post-roll's end
    dither = rng.integers(-1, 2, zeros).astype(np.float32) / 32768  # a resampler's +-1 LSB
    audio = np.concatenate([speech, noise, dither])
    heard = for_model(SegmentFinished(0, start, end, audio, start), SegmenterOptions())
    if noise_trail > ONSET_LAG:
        assert np.array_equal(heard.audio, audio[:len(speech) + len(noise)])
    else:
        assert np.array_equal(heard.audio, audio)
    room = (rng.standard_normal(round(0.2 * SAMPLE_RATE)) * 0.003).astype(np.float32)
    whole = SegmentFinished(0, start, end, np.concatenate([speech, room]), start)
    assert for_model(whole, SegmenterOptions()) is whole


def test_zeros_after_the_room_are_cut_even_when_the_vad_took_the_room_for_speech():
    """webrtcvad hears babble as speech up to the zeros: the VAD's end is then the step itself. A sound that
    stays 20 dB under the speech's peak for its last 0.15 s before the zeros is still the room, and the zeros
    go; a word's fading end, as quiet but briefer, keeps them."""
    rng = np.random.default_rng(3)
    start = 5.0
    speech = (rng.standard_normal(SAMPLE_RATE) * 0.1).astype(np.float32)
    zeros = np.zeros(round(0.2 * SAMPLE_RATE), np.float32)
    for quiet_seconds, cut in [(0.3, True), (0.08, False)]:
        quiet = (rng.standard_normal(round(quiet_seconds * SAMPLE_RATE)) * 0.003).astype(np.float32)
        audio = np.concatenate([speech, quiet, zeros])
        step = start + 1.0 + quiet_seconds  # the VAD's end: at the step
        heard = for_model(SegmentFinished(0, start, step, audio, start), SegmenterOptions())
        assert len(heard.audio) == (len(audio) - len(zeros) if cut else len(audio)), quiet_seconds


def test_zeros_after_loud_babble_are_cut_when_the_room_was_heard_before_the_speech():
    """Babble at -40 dBFS is not 20 dB under the speech, and webrtcvad hears it as speech up to the zeros; but
    a room heard before the speech (the pre-roll's sound) is the room after it too, and the zeros after it
    go. Out of digital silence the same loud end keeps its zeros, as a word's end does in a clean recording."""
    rng = np.random.default_rng(4)
    start = 5.0
    speech = (rng.standard_normal(SAMPLE_RATE) * 0.1).astype(np.float32)
    loud = (rng.standard_normal(round(0.3 * SAMPLE_RATE)) * 0.03).astype(np.float32)  # 10 dB under the speech
    zeros = np.zeros(round(0.2 * SAMPLE_RATE), np.float32)
    room = (rng.standard_normal(round(0.3 * SAMPLE_RATE)) * 0.01).astype(np.float32)
    lead = round(STREAM_START_LEAD * SAMPLE_RATE)  # what is heard of zeros that end in the speech
    for before, cut in [(room, True), (np.zeros_like(room), False)]:
        audio = np.concatenate([before, speech, loud, zeros])
        step = start + 1.3  # the VAD's end: at the step
        heard = for_model(SegmentFinished(0, start, step, audio, start - 0.3), SegmenterOptions())
        assert len(heard.audio) == (len(audio) - len(zeros) if cut else len(audio) - len(before) + lead), cut


def test_speech_from_the_first_sample_fed_is_heard_after_a_short_lead_of_zeros(demo_speech):
    """A file cut tight, a microphone opened mid-word, a commit of one utterance: the model hears
    STREAM_START_LEAD of zeros first (where the demo model makes a third fewer errors); a segment with a lead
    of its own, one that starts later in what was fed (the rest of a segment cut at its length limit), or a
    final heard after the context of the one it continues (zeros would split the utterance) is heard as it is."""
    speech = demo_speech.audio[np.flatnonzero(np.abs(demo_speech.audio) > 0.01)[0]:]
    found = segments_in(speech, SegmenterOptions())
    assert found[0].opens and not any(e.opens for e in found[1:])
    options = SegmenterOptions()
    lead = round(STREAM_START_LEAD * SAMPLE_RATE)
    tight = np.asarray(speech[:SAMPLE_RATE], np.float32)
    for event in (SegmentFinished(0, 0.0, 1.0, tight, 0.0, opens=True),
                  PartialDue(0, 5.03, 6.0, tight, 5.0, opens=True)):
        heard, context, _ = prepared(event, options)
        assert heard.audio_start == round(event.audio_start - STREAM_START_LEAD, 6) and context is None
        assert (heard.start, heard.end) == (event.start, event.end) and not heard.audio[:lead].any()
        np.testing.assert_array_equal(heard.audio[lead:], tight)
    later = SegmentFinished(3, 30.0, 31.0, tight, 30.0)
    with_lead = SegmentFinished(0, 0.3, 1.0, np.concatenate([np.zeros(4800, np.float32), tight[4800:]]), 0.0,
                                opens=True)
    assert prepared(later, options)[0] is later and prepared(with_lead, options)[0] is with_lead
    continuation = Continuation(options)
    first = SegmentFinished(0, 1.0, 2.0, np.concatenate([tight, tight[:6400]]), 0.7)  # its audio reaches 2.1 s
    prepared(first, options, continuation)
    after = SegmentFinished(1, 2.1, 3.0, tight, 2.1, opens=True)  # a commit right after: one utterance
    joined, context, _ = prepared(after, options, continuation)
    assert context is not None and joined.audio_start < after.audio_start
    np.testing.assert_array_equal(joined.audio[-len(tight):], tight)  # the context, then the speech: no zeros
    assert joined.audio[-len(tight) - lead:-len(tight)].any()


def test_no_word_starts_before_the_stream_does():
    """Decoded with its first sample at -STREAM_START_LEAD, a word spiking in the model's first frames
    starts at 0."""
    transcript = transcript_from_runs(np.array([0, 1]), np.array([4, 9]), np.array([5, 10]), ["a", "b"],
                                      prompt_frames=4, frame_seconds=0.06, offset=-STREAM_START_LEAD)
    assert [(t.start, t.end) for t in transcript.tokens] == [(0.0, pytest.approx(0.03)),
                                                             (pytest.approx(0.27), pytest.approx(0.33))]


def test_segments_in_a_whole_buffer_are_what_an_upload_of_it_holds(demo_speech):
    """2 s of silence, two utterances with their pause, 1.5 s of silence: the buffer becomes the two segments
    the segmenter cuts from it, times shifted by the buffer's offset (a commit holding two utterances is
    not one segment, issue 36); a buffer of silence or of a beep is no segment at all."""
    second = demo_speech.utterances[1]
    speech = demo_speech.audio[: int((second["end"] + 0.3) * SAMPLE_RATE)]
    audio = np.concatenate([np.zeros(2 * SAMPLE_RATE, np.float32), speech, np.zeros(SAMPLE_RATE * 3 // 2, np.float32)])
    options = SegmenterOptions()
    usual = segments(audio, dataclasses.replace(options, partial_interval=0.0))
    found = segments_in(audio, options, offset=5.0)
    assert len(found) == len(usual) == 2
    for mine, upload in zip(found, usual):
        assert mine.segment == upload.segment and mine.start == pytest.approx(upload.start + 5)
        assert mine.end == pytest.approx(upload.end + 5)
        assert mine.audio_start == pytest.approx(upload.audio_start + 5) == pytest.approx(mine.start - options.pre_roll)
        np.testing.assert_array_equal(mine.audio, upload.audio)
    t = np.arange(3 * SAMPLE_RATE) / SAMPLE_RATE
    beep = np.where((t > 1.0) & (t < 1.1), 0.2 * np.sin(2 * np.pi * 1000 * t), 0).astype(np.float32)
    assert segments_in(np.zeros(3 * SAMPLE_RATE, np.float32), options) == [] and segments_in(beep, options) == []


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


# ---- a segment that continues the one before (a client's VAD committed at a short pause) ------------------

def cut(segment: int, audio_start: float, start: float, end: float, post_roll: float = 0.2) -> SegmentFinished:
    """A segment whose samples are their own stream time in seconds (so a test reads where each came from)."""
    times = np.arange(round(audio_start * SAMPLE_RATE), round((end + post_roll) * SAMPLE_RATE)) / SAMPLE_RATE
    return SegmentFinished(segment, start, end, times.astype(np.float64).astype(np.float32), audio_start)


def test_a_segment_after_a_short_pause_is_heard_after_the_end_of_the_one_before():
    """0.2 s after the previous segment ended: the model hears its last CONTEXT_SECONDS up to where this
    one's audio starts (never the post-roll twice), then this one; the context says which stream seconds
    those were and whose words they held. A pause of JOIN_SILENCE or more starts afresh."""
    options = SegmenterOptions()
    continuation = Continuation(options)
    first, first_context, first_said = continuation.next(cut(0, 1.7, 2.0, 5.0))
    assert first_context is None and first.audio_start == 1.7
    following = cut(1, 5.0, 5.2, 6.0)
    joined, context, said = continuation.next(following)
    assert context == Context(5.0 - CONTEXT_SECONDS, 5.2, first_said) and said is not first_said
    assert joined.audio_start == 5.0 - CONTEXT_SECONDS and (joined.start, joined.end) == (5.2, 6.0)
    heard = first.audio[round((5.0 - CONTEXT_SECONDS - 1.7) * SAMPLE_RATE): round((5.0 - 1.7) * SAMPLE_RATE)]
    np.testing.assert_array_equal(joined.audio, np.concatenate([heard, following.audio]))
    later, none, _ = continuation.next(cut(2, 6.0 + JOIN_SILENCE - 0.3, 6.0 + JOIN_SILENCE, 7.0))
    assert none is None and later.audio_start == 6.0 + JOIN_SILENCE - 0.3


def test_the_context_fits_the_segment_limit_and_fills_what_no_segment_kept_with_silence():
    options = SegmenterOptions()
    continuation = Continuation(options)
    continuation.next(cut(0, 0.7, 1.0, 1.5, post_roll=0.0))  # short, and nothing kept after its end
    joined, context, _ = continuation.next(cut(1, 1.6, 1.75, 2.5))
    assert context.start == 0.7 and joined.audio_start == 0.7  # all of it: less than CONTEXT_SECONDS
    assert np.all(joined.audio[round(0.8 * SAMPLE_RATE): round(0.9 * SAMPLE_RATE)] == 0)  # 1.5-1.6 s: silence
    long = options.max_segment_seconds - 0.5
    joined, context, _ = continuation.next(cut(2, 2.6, 2.75, 2.6 + long, post_roll=0.0))
    assert context.start == pytest.approx(2.1) and len(joined.audio) == options.max_segment_seconds * SAMPLE_RATE
    full, none, _ = continuation.next(cut(3, 32.2, 32.3, 32.2 + options.max_segment_seconds, post_roll=0.0))
    assert none is None and full.audio_start == 32.2  # no room left in the longest container
    continuation.forget()  # the audio between was discarded (a cleared Realtime buffer)
    assert continuation.next(cut(4, 62.1, 62.4, 63.0))[1] is None  # 0.2 s after the last one ended


def words_at(*spans: tuple[str, float, float]) -> tuple[TokenTiming, ...]:
    return tuple(TokenTiming(text, start, end) for text, start, end in spans)


def test_the_context_words_are_counted_from_what_the_segment_before_said():
    """The previous segment said "call seven" with "seven" centred inside the context (from 3.0 s): one
    word is dropped, whatever the new decoding makes of it ("heaven" at a time CTC puts early). Without the
    previous words (its decoding failed), the words centred before the segment's own start go."""
    spoken = words_at(("heaven", 2.9, 3.1), ("two", 3.6, 3.8), ("one", 4.1, 4.3))
    joined = Transcript("heaven two one", tokens=words_at((" heaven", 2.9, 3.1), (" two", 3.6, 3.8), (" one", 4.1, 4.3)),
                        words=spoken)
    kept = after_context(joined, 3.0, 3.5, words_at(("call", 2.0, 2.4), ("seven", 3.0, 3.4)))
    assert kept.text == "two one" and kept.words == spoken[1:] and [t.text for t in kept.tokens] == [" two", " one"]
    assert after_context(joined, 3.0, 3.5, ()) is joined  # the previous segment said nothing
    assert after_context(joined, 3.0, 3.5, None).text == "two one"  # by time: "heaven" is centred at 3.0
    # Heard again, the context lost a word the previous segment said (the demo model drops short words at
    # a buffer's edge): the count says two, but "two" is centred past the context's end, so it stays.
    kept = after_context(joined, 3.0, 3.5, words_at(("seven", 3.0, 3.2), ("eight", 3.3, 3.45)))
    assert kept.text == "two one"
    assert after_context(joined, 3.0, 3.65, words_at(("x", 3, 3), ("y", 3.3, 3.4))).text == "one"  # within CONTEXT_SLACK


def test_the_context_words_are_aligned_not_counted():
    """pipecat's commits inside two utterances in brown noise (bench frameworks, issue 36): the first
    fragment said a word too many or one the context does not have, so counting its words dropped a word
    of the second ("four", "call") or kept one it had said ("delete"). Aligned by word edit distance, the
    second fragment keeps exactly its own words."""
    def joined(*spans: tuple[str, float, float]) -> Transcript:
        words = words_at(*spans)
        return Transcript(" ".join(w.text for w in words), tokens=words_at(*((" " + t, a, b) for t, a, b in spans)),
                          words=words)

    heard = joined(("delete", 15.8, 16.1), ("zero", 16.5, 16.8), ("four", 16.95, 17.15), ("seven", 17.5, 17.8))
    previous = words_at(("off", 15.75, 15.8), ("delete", 15.85, 16.1), ("zero", 16.5, 16.8))
    assert after_context(heard, 15.476, 16.981, previous).text == "four seven"
    heard = joined(("next", 21.6, 21.8), ("up", 21.9, 22.0), ("slower", 22.2, 22.6), ("call", 23.05, 23.2),
                   ("delete", 23.5, 23.8))
    previous = words_at(("next", 21.6, 21.7), ("next", 21.7, 21.8), ("up", 21.9, 22.0), ("slower", 22.2, 22.6))
    assert after_context(heard, 21.259, 23.1, previous).text == "call delete"
    heard = joined(("no", 15.7, 15.8), ("delete", 15.85, 16.1), ("zero", 16.5, 16.8), ("four", 17.3, 17.5))
    assert after_context(heard, 15.476, 16.9, words_at(("delete", 15.85, 16.1))).text == "zero four"


def test_a_context_reaches_back_past_a_final_that_said_nothing_of_its_own():
    """Three commits: "previous go hid-" (the first), "-e" (all of it context, so it said nothing), "stop".
    The third's context is the second's audio, where "hide" is heard again: the words said are looked for in
    the finals before, until they reach the context's start, and "hide" (centred a little before it, within
    CONTEXT_SLACK) is dropped. Before, only the second's words counted and "hide" came back."""
    options = SegmenterOptions()
    continuation = Continuation(options)
    _, _, first = continuation.next(cut(0, 0.3, 0.6, 2.08))
    _, _, second = continuation.next(cut(1, 2.08, 2.08, 2.5))
    _, context, _ = continuation.next(cut(2, 2.72, 2.72, 3.3))
    first.words, second.words = words_at(("previous", 0.84, 0.9), ("go", 1.62, 1.68), ("hide", 2.04, 2.1)), ()
    assert context.previous is second and second.since(context.start) == first.words
    heard = Transcript("hide stop", tokens=words_at((" hide", 2.14, 2.2), (" stop", 2.68, 2.74)),
                       words=words_at(("hide", 2.14, 2.2), ("stop", 2.68, 2.74)))
    assert after_context(heard, context.start, context.end, second.since(context.start)).text == "stop"
    failed = Said(None, before=first)
    assert failed.since(0.0) is None  # a failed final: after_context goes by time
    chain = [Said(words_at(("oh", n, n + 0.1))) for n in range(MAX_SAID_CHAIN + 4)]
    continuation = Continuation(options)
    for n in range(MAX_SAID_CHAIN + 4):  # a long run of finals, each continuing the one before
        _, _, said = continuation.next(cut(n, n + 0.1, n + 0.1, n + 1.0))
        said.words = chain[n].words
    depth, link = 0, said
    while link is not None:
        depth, link = depth + 1, link.before
    assert depth <= MAX_SAID_CHAIN + 1  # what since() reads, no more kept


def test_words_that_start_past_a_commit_are_left_to_the_next_item():
    spoken = words_at(("enter", 1.0, 1.1), ("save", 1.94, 2.0), ("open", 2.3, 2.4))
    heard = Transcript("enter save open", tokens=words_at((" enter", 1.0, 1.1), (" save", 1.94, 2.0), (" open", 2.3, 2.4)),
                       words=spoken, language="en")
    kept = before_cut(heard, 1.95)  # "save" began before the commit, heard whole with what followed it
    assert kept.text == "enter save" and kept.words == spoken[:2] and kept.language == "en"
    assert before_cut(heard, 1.9).text == "enter" and before_cut(heard, 3.0) is heard


def test_the_context_is_the_sound_received_when_a_commit_cut_a_word():
    """Two Realtime commits, the first ending inside a word: the speech the segmenter keeps of the first
    ends at its last voiced frame, so the trimmed copy has a hole at the cut. The context is taken from the
    audio as received instead: the joined audio is the stream itself, without a gap."""
    options = SegmenterOptions()
    stream = (np.arange(12 * SAMPLE_RATE) / SAMPLE_RATE).astype(np.float32)  # each sample its own time
    continuation = Continuation(options)
    continuation.heard(stream[:round(5.01 * SAMPLE_RATE)], 0.0)
    continuation.next(cut(0, 1.7, 2.0, 4.9, post_roll=0.0))  # its copy ends at 4.9 s, the commit at 5.01 s
    continuation.heard(stream[round(5.01 * SAMPLE_RATE):], 5.01)
    joined, context, _ = continuation.next(cut(1, 5.01, 5.01, 6.0))
    assert context.start == pytest.approx(5.01 - CONTEXT_SECONDS)
    first = round(context.start * SAMPLE_RATE)
    np.testing.assert_array_equal(joined.audio, stream[first:first + len(joined.audio)])
    continuation.forget()  # a cleared buffer: what was received no longer precedes what comes
    continuation.next(cut(2, 8.0, 8.3, 9.0, post_roll=0.0))
    joined, _, _ = continuation.next(cut(3, 9.2, 9.5, 10.0))
    assert np.all(joined.audio[round(1.0 * SAMPLE_RATE): round(1.2 * SAMPLE_RATE)] == 0)  # 9.0-9.2 s: not kept


# ---- the demo model on real speech, cut between its words ----------------------------------------------------

DEMO_MODEL = Path(__file__).resolve().parents[2] / "models" / "demo"
DEMO_CLIPS = Path(__file__).resolve().parents[1] / "fixtures" / "demo"


def test_fragments_cut_between_words_say_what_the_whole_utterance_says():
    """Each demo utterance cut at every pause between two of its words, as pipecat's VAD (stop_secs 0.2)
    commits it: the second fragment's words are the whole utterance's words after those of the first.
    Decoded alone, 7 of these 10 second fragments were wrong ("two" heard as "up two", "back home" as
    "home"); with the end of the first fragment heard before them, none."""
    if not (DEMO_MODEL / "manifest.json").is_file():
        pytest.skip("the demo model is not in this checkout")
    from pipeline.engine import Engine, EngineOptions

    engine = Engine(DEMO_MODEL, EngineOptions(device="cpu", containers=(2, 4))).load()
    options = SegmenterOptions()

    def transcribe(segment: SegmentFinished, context: Context | None = None) -> Transcript:
        heard = engine.transcribe(segment.audio, offset=segment.audio_start)
        if context is not None:
            heard = after_context(heard, context.start, context.end, context.previous.words)
        return starting_at(heard, segment.start)

    checked = 0
    for entry in json.loads((DEMO_CLIPS / "transcripts.json").read_text()):
        speech, _ = soundfile.read(DEMO_CLIPS / entry["audio"], dtype="float32")
        audio = np.concatenate([np.zeros(SAMPLE_RATE // 2, np.float32), speech, np.zeros(SAMPLE_RATE // 2, np.float32)])
        (whole,) = [transcribe(s) for s in segments_in(audio, options)]
        for before, after in zip(whole.words, whole.words[1:]):
            at = round((before.end + after.start) / 2 * SAMPLE_RATE)
            pieces = segments_in(audio[:at], options) + segments_in(audio[at:], options, offset=at / SAMPLE_RATE)
            if len(pieces) != 2:  # the VAD hears no speech in a piece of less than a word
                continue
            continuation, said = Continuation(options), []
            for piece in pieces:
                segment, context, box = continuation.next(for_model(piece, options))
                heard = transcribe(segment, context)
                box.words = heard.words
                said.append(heard.text.split())
            assert said[1] == whole.text.split()[len(said[0]):], (whole.text, said)
            checked += 1
    assert checked >= 8
