from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile
import soxr

from pipeline.audio import (
    SAMPLE_RATE,
    AudioFormat,
    Resampler,
    decode_pcm,
    load_audio,
)
from pipeline.errors import AudioFormatError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


# ---- decode_pcm --------------------------------------------------------------------------------------

def test_s16le_mono_scales_to_unit_range():
    data = np.array([0, 16384, -32768, 32767], "<i2").tobytes()
    out = decode_pcm(data, AudioFormat(encoding="s16le"))
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, [0.0, 0.5, -1.0, 32767 / 32768])


def test_f32le_is_clipped_not_rejected():
    data = np.array([0.25, 1.5, -3.0, -0.5], "<f4").tobytes()
    out = decode_pcm(data, AudioFormat(encoding="f32le"))
    np.testing.assert_allclose(out, [0.25, 1.0, -1.0, -0.5])
    assert out.flags.writeable  # a copy, not a read-only view of the message


@pytest.mark.parametrize("encoding, dtype", [("s16le", "<i2"), ("f32le", "<f4")])
def test_interleaved_stereo_is_averaged(encoding, dtype):
    left = np.array([1000, 2000, -3000], dtype)
    right = np.array([3000, 0, -1000], dtype)
    if encoding == "f32le":
        left, right = left / 32768, right / 32768
    data = np.stack([left, right], axis=1).astype(dtype).tobytes()
    out = decode_pcm(data, AudioFormat(encoding=encoding, channels=2))
    np.testing.assert_allclose(out, np.array([2000, 1000, -2000]) / 32768, rtol=1e-6)


def test_empty_message_is_no_samples():
    assert decode_pcm(b"", AudioFormat()).shape == (0,)


@pytest.mark.parametrize(
    "size, fmt",
    [
        (3, AudioFormat(encoding="s16le")),
        (6, AudioFormat(encoding="s16le", channels=2)),  # one and a half stereo frames
        (6, AudioFormat(encoding="f32le")),
        (12, AudioFormat(encoding="f32le", channels=2)),
    ],
)
def test_partial_sample_frames_are_an_error(size, fmt):
    with pytest.raises(AudioFormatError, match=f"{size} bytes is not a whole number"):
        decode_pcm(bytes(size), fmt)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_float_samples_are_an_error(bad):
    data = np.array([0.1, bad, 0.2], "<f4").tobytes()
    with pytest.raises(AudioFormatError, match="NaN or infinite") as info:
        decode_pcm(data, AudioFormat(encoding="f32le"))
    assert info.value.code == "unsupported_audio"


@pytest.mark.parametrize(
    "fmt, match",
    [
        (AudioFormat(encoding="u8"), "encoding must be one of"),
        (AudioFormat(channels=3), "channels must be 1 or 2"),
        (AudioFormat(sample_rate=4000), "sample rate must be"),
        (AudioFormat(sample_rate=96000), "sample rate must be"),
    ],
)
def test_unsupported_formats(fmt, match):
    with pytest.raises(AudioFormatError, match=match):
        decode_pcm(b"", fmt)


# ---- Resampler -----------------------------------------------------------------------------------

def _stream(resampler: Resampler, samples: np.ndarray, chunk: int) -> np.ndarray:
    parts = [resampler.process(samples[i:i + chunk]) for i in range(0, len(samples), chunk)]
    return np.concatenate(parts + [resampler.flush()])


def test_16k_is_an_identity_passthrough():
    x = np.random.default_rng(0).uniform(-1, 1, 5000).astype(np.float32)
    out = _stream(Resampler(SAMPLE_RATE), x, 777)
    np.testing.assert_array_equal(out, x)


@pytest.mark.parametrize("rate", [8000, 22050, 44100, 48000])
def test_streaming_resampler_keeps_length_and_pitch(rate):
    seconds, tone = 1.5, 440.0
    t = np.arange(int(seconds * rate)) / rate
    x = (0.5 * np.sin(2 * np.pi * tone * t)).astype(np.float32)
    out = _stream(Resampler(rate), x, 1234)  # odd chunk sizes: the filter state spans the chunks
    assert out.dtype == np.float32
    assert len(out) == round(len(x) * SAMPLE_RATE / rate)  # flush() returned the tail
    spectrum = np.abs(np.fft.rfft(out))
    assert abs(np.argmax(spectrum) * SAMPLE_RATE / len(out) - tone) < 2
    # Streaming agrees with soxr's one-shot resampling away from the edges.
    whole = soxr.resample(x, rate, SAMPLE_RATE)
    np.testing.assert_allclose(out[800:-800], whole[800:-800], atol=1e-3)


def test_resampler_rejects_rates_outside_the_protocol_range():
    with pytest.raises(AudioFormatError):
        Resampler(7999)


def test_process_after_flush_is_a_misuse():
    r = Resampler(48000)
    r.flush()
    assert len(r.flush()) == 0
    with pytest.raises(RuntimeError):
        r.process(np.zeros(10, np.float32))


# ---- load_audio ----------------------------------------------------------------------------------

def test_load_audio_reads_the_fixture(speech):
    audio = load_audio(FIXTURES / "three_utterances.wav")
    assert audio.dtype == np.float32 and audio.ndim == 1
    np.testing.assert_allclose(audio, speech.audio, atol=1e-6)


def test_load_audio_downmixes_and_resamples(tmp_path):
    rate = 44100
    t = np.arange(rate) / rate  # one second
    wave = np.sin(2 * np.pi * 300 * t)
    path = tmp_path / "stereo.flac"
    soundfile.write(path, np.stack([0.6 * wave, 0.2 * wave], axis=1), rate)  # mono: 0.4 * wave
    audio = load_audio(path)
    assert len(audio) == SAMPLE_RATE
    assert 0.38 < np.abs(audio).max() < 0.42


@pytest.mark.parametrize("content", [b"", b"this is not audio at all" * 10])
def test_load_audio_rejects_unreadable_files(tmp_path, content):
    path = tmp_path / "broken.wav"
    path.write_bytes(content)
    with pytest.raises(AudioFormatError, match="cannot read audio file .*broken.wav"):
        load_audio(path)


def test_load_audio_rejects_missing_and_empty_files(tmp_path):
    with pytest.raises(AudioFormatError, match="cannot read audio file"):
        load_audio(tmp_path / "missing.wav")
    empty = tmp_path / "empty.wav"
    soundfile.write(empty, np.zeros(0, np.float32), SAMPLE_RATE)
    with pytest.raises(AudioFormatError, match="contains no samples"):
        load_audio(empty)
