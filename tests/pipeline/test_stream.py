from __future__ import annotations

import numpy as np
import pytest
import soxr

from pipeline.audio import SAMPLE_RATE, AudioFormat, seconds_to_samples
from pipeline.errors import AudioFormatError
from pipeline.segmenter import PartialDue, SegmenterOptions, SegmentFinished, SpeechStarted
from pipeline.stream import StreamSession

TOLERANCE = 0.3


def encode(samples: np.ndarray, fmt: AudioFormat) -> bytes:
    """float32 mono at fmt.sample_rate -> the bytes a client would send (stereo: the same in both channels)."""
    if fmt.channels == 2:
        samples = np.repeat(samples, 2)
    if fmt.encoding == "s16le":
        return np.clip(np.round(samples * 32768), -32768, 32767).astype("<i2").tobytes()
    return samples.astype("<f4").tobytes()


def stream(session: StreamSession, data: bytes, message_seconds: float = 0.1) -> list:
    step = int(message_seconds * session.format.sample_rate) * session.format.bytes_per_frame
    events = []
    for i in range(0, len(data), step):
        events += session.feed(data[i:i + step])
    return events + session.finish()


@pytest.mark.parametrize(
    "fmt",
    [
        AudioFormat(SAMPLE_RATE, "s16le", 1),
        AudioFormat(8000, "s16le", 1),
        AudioFormat(44100, "f32le", 1),
        AudioFormat(48000, "s16le", 2),
        AudioFormat(22050, "f32le", 2),
    ],
    ids=lambda f: f"{f.sample_rate}-{f.encoding}-{f.channels}ch",
)
def test_formats_and_rates_give_the_same_segments(speech, fmt):
    audio = speech.audio if fmt.sample_rate == SAMPLE_RATE else soxr.resample(speech.audio, SAMPLE_RATE, fmt.sample_rate)
    session = StreamSession(fmt, SegmenterOptions())
    events = stream(session, encode(audio, fmt))
    assert session.received_seconds == pytest.approx(len(audio) / fmt.sample_rate)
    assert session.processed_seconds == pytest.approx(speech.duration, abs=0.03)
    starts = [e for e in events if isinstance(e, SpeechStarted)]
    finals = [e for e in events if isinstance(e, SegmentFinished)]
    assert [e.segment for e in starts] == [e.segment for e in finals] == [0, 1, 2]
    for seg, utt in zip(finals, speech.utterances):
        assert abs(seg.start - utt["start"]) < TOLERANCE and abs(seg.end - utt["end"]) < TOLERANCE
        assert seg.audio.dtype == np.float32


def test_partials_follow_the_options(speech):
    data = encode(speech.audio, AudioFormat())
    with_partials = stream(StreamSession(AudioFormat(), SegmenterOptions(partial_interval=0.5)), data)
    without = stream(StreamSession(AudioFormat(), SegmenterOptions(partial_interval=0)), data)
    assert any(isinstance(e, PartialDue) for e in with_partials)
    assert not any(isinstance(e, PartialDue) for e in without)


def test_finish_flushes_the_resampler_tail(speech):
    # Speech right up to the end of the stream at 48 kHz: the last samples sit in soxr's filter until finish().
    fmt = AudioFormat(48000, "f32le", 1)
    cut = seconds_to_samples(speech.utterances[0]["end"] - 0.3)
    audio = soxr.resample(speech.audio[:cut], SAMPLE_RATE, fmt.sample_rate)
    session = StreamSession(fmt)
    events = session.feed(encode(audio, fmt))
    assert not any(isinstance(e, SegmentFinished) for e in events)
    last = session.finish()
    assert [type(e) for e in last if not isinstance(e, PartialDue)] == [SegmentFinished]
    assert last[-1].end == pytest.approx(cut / SAMPLE_RATE, abs=0.002)
    assert session.finished and session.finish() == []
    with pytest.raises(RuntimeError):
        session.feed(b"\0\0")


def test_malformed_messages_raise_audio_format_errors():
    session = StreamSession(AudioFormat(encoding="s16le", channels=2))
    assert session.feed(bytes(400)) == []
    with pytest.raises(AudioFormatError, match="not a whole number"):
        session.feed(bytes(401))
    assert session.received_seconds == pytest.approx(100 / SAMPLE_RATE)  # the bad message was not counted
    floats = StreamSession(AudioFormat(encoding="f32le"))
    with pytest.raises(AudioFormatError, match="NaN"):
        floats.feed(np.array([0.0, np.nan], "<f4").tobytes())


@pytest.mark.parametrize(
    "fmt", [AudioFormat(sample_rate=96000), AudioFormat(encoding="mp3"), AudioFormat(channels=6)]
)
def test_unsupported_formats_are_refused_at_once(fmt):
    with pytest.raises(AudioFormatError):
        StreamSession(fmt)
