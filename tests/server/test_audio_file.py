"""Uploaded files decoded block by block (server/audio_file.py): the same samples as decoding at once,
in bounded memory, and clear errors."""
from __future__ import annotations

import io
import tracemalloc

import numpy as np
import pytest
import soundfile
import soxr

from pipeline.audio import SAMPLE_RATE
from pipeline.errors import AudioFormatError
from server.audio_file import BLOCK_SAMPLES, MIN_FILE_RATE, audio_blocks, file_blocks, open_audio


def encoded(audio: np.ndarray, rate: int, **kw: str) -> bytes:
    out = io.BytesIO()
    soundfile.write(out, audio, rate, **kw)
    return out.getvalue()


def test_blocks_are_the_whole_file_decoded_at_once():
    rng = np.random.default_rng(0)
    stereo = (rng.standard_normal((44100 * 25, 2)) * 0.1).astype(np.float32)
    data = encoded(stereo, 44100, format="FLAC")
    blocks = list(audio_blocks(open_audio(data, "a.flac"), "a.flac", seconds=10))
    whole = soxr.resample(soundfile.read(io.BytesIO(data), dtype="float32")[0].mean(axis=1), 44100, SAMPLE_RATE)
    assert max(len(b) for b in blocks) <= 10 * SAMPLE_RATE + 1000
    np.testing.assert_array_equal(np.concatenate(blocks), np.clip(whole, -1, 1))


def test_a_long_file_is_never_decoded_whole():
    """Hours of compressed audio fit in an upload: decoding must hold a block, not the file (it held
    over 1 GB per hour of Opus before). Measured in allocations, not time."""
    data = encoded(np.zeros(48000 * 120, np.float32), 48000, format="WAV", subtype="FLOAT")
    tracemalloc.start()
    try:
        for _ in audio_blocks(open_audio(data, "long.wav"), "long.wav"):
            pass
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < len(data) / 4  # 23 MB at 48 kHz; a 10 s block is 1.9 MB there


def test_many_channels_are_read_in_fewer_frames():
    """Vorbis carries up to 255 channels, and silence in it is nearly free: 20 s of 32 channels is 9 KB, and
    a 10 s block of it 61 MB decoded (a 25 MB upload of 255 channels: 490 MB a block)."""
    out = io.BytesIO()
    with soundfile.SoundFile(out, "w", 48000, 32, format="OGG", subtype="VORBIS") as vorbis:
        for _ in range(200):  # libsndfile's Vorbis writer crashes on one large write
            vorbis.write(np.zeros((4800, 32), np.float32))
    data = out.getvalue()
    assert max(len(b) * b.shape[1] for b in file_blocks(open_audio(data, "a.ogg"))) <= BLOCK_SAMPLES
    tracemalloc.start()
    try:
        heard = sum(len(b) for b in audio_blocks(open_audio(data, "a.ogg"), "a.ogg"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert heard == 20 * SAMPLE_RATE and peak < 4 * BLOCK_SAMPLES * 4  # a block, its mean and resampling


@pytest.mark.parametrize("data, message", [
    (b"", "Format not recognised"),
    (encoded(np.zeros(0, np.int16), 16000, format="WAV"), "no samples"),
    (encoded(np.full(48000, np.nan, np.float32), 16000, format="WAV", subtype="FLOAT"), "NaN"),
])
def test_unreadable_files_are_audio_format_errors(data, message):
    with pytest.raises(AudioFormatError, match=message) as error:
        list(audio_blocks(open_audio(data, "x.wav"), "x.wav"))
    assert "BytesIO" not in str(error.value)


def test_a_rate_below_4_khz_is_refused_before_decoding():
    """A header's low rate multiplies the samples heard (1 Hz: 16000 per sample sent); none is speech."""
    for rate in (1, 100, MIN_FILE_RATE - 1):
        with pytest.raises(AudioFormatError, match=f"sample rate is {rate} Hz; files below 4000 Hz are refused"):
            open_audio(encoded(np.zeros(8000, np.int16), rate, format="WAV"), "x.wav")
    blocks = list(audio_blocks(open_audio(encoded(np.zeros(8000, np.int16), MIN_FILE_RATE, format="WAV"), "x.wav"),
                               "x.wav"))
    assert sum(len(b) for b in blocks) == 4 * 8000  # 2 s at 4 kHz: 2 s at 16 kHz
