"""Uploaded audio files (bytes of anything soundfile reads) -> float32 mono at SAMPLE_RATE, block by block.

Why blocks: compressed audio is small for its length (an hour of Opus fits in 3 MB, so OpenAI's 25 MB upload
limit admits ten hours), and decoding it whole held every second at the file's rate, then again at 16 kHz:
over a gigabyte per hour of audio, enough for one upload to exhaust the machine and take every live stream
with it. Read block by block, an upload holds one block decoded at a time. Streaming soxr gives the same
samples as resampling the whole file at once.
"""
from __future__ import annotations

import io
from typing import Any, Iterable, Iterator

import numpy as np
import soxr

from pipeline.audio import MIN_FILE_RATE, SAMPLE_RATE
from pipeline.errors import AudioFormatError

BLOCK_SECONDS = 10  # decoded at a time ...
BLOCK_SAMPLES = BLOCK_SECONDS * 48000 * 2  # ... unless that is more samples than 10 s of 48 kHz stereo (3.8 MB):
# Vorbis and Opus carry up to 255 channels, and silence in them compresses to nearly nothing.


def open_audio(data: bytes, name: str) -> Any:
    """The file as a soundfile.SoundFile; AudioFormatError if soundfile cannot read it or it holds no samples."""
    import soundfile  # the streaming path never needs it

    try:
        file = soundfile.SoundFile(io.BytesIO(data))
    except (RuntimeError, OSError, ValueError) as exc:  # LibsndfileError is a RuntimeError
        reason = getattr(exc, "error_string", None) or exc  # libsndfile's own words, not "Error opening <BytesIO>"
        raise AudioFormatError(f"Cannot decode the {name} file ({len(data)} bytes): {reason}",
                               wav_format=name) from None
    if file.samplerate < MIN_FILE_RATE:
        raise AudioFormatError(f"The {name} file's sample rate is {file.samplerate} Hz; files below {MIN_FILE_RATE} "
                               "Hz are refused (no speech fits there)", wav_format=name)
    if file.frames == 0:
        raise no_samples(name)
    return file


def file_blocks(file: Any, seconds: float = BLOCK_SECONDS) -> Iterator[np.ndarray]:
    """An open_audio() file -> float32 [frames, channels] blocks of `seconds` at its own rate (fewer frames where
    it has many channels: BLOCK_SAMPLES at most), the last empty."""
    frames = max(1, min(int(seconds * file.samplerate), BLOCK_SAMPLES // file.channels))
    while True:
        block = file.read(frames, dtype="float32", always_2d=True)
        yield block
        if len(block) == 0:
            return


def mono_blocks(rate: int, blocks: Iterable[np.ndarray], channel: int | None = None,
                name: str | None = None) -> Iterator[np.ndarray]:
    """float32 [frames, channels] blocks at `rate`, the last one empty (file_blocks) -> float32 [n] blocks in
    [-1, 1] at SAMPLE_RATE: `channel` alone, or every channel averaged. AudioFormatError at a NaN or infinite
    sample, naming the `name` file when there is one."""
    stream = None if rate == SAMPLE_RATE else soxr.ResampleStream(rate, SAMPLE_RATE, 1, dtype="float32")
    for block in blocks:
        mono = (block[:, channel] if channel is not None else
                block.mean(axis=1, dtype=np.float32) if block.shape[1] > 1 else block[:, 0])
        if not np.isfinite(mono).all():
            if name is None:
                raise AudioFormatError("the audio contains NaN or infinite samples")
            raise AudioFormatError(f"The {name} file contains NaN or infinite samples.", wav_format=name)
        last = len(block) == 0
        if stream is not None:
            mono = stream.resample_chunk(np.ascontiguousarray(mono), last=last)
        if len(mono):
            yield np.clip(mono, -1.0, 1.0)
        if last:
            return


def audio_blocks(file: Any, name: str, seconds: float = BLOCK_SECONDS) -> Iterator[np.ndarray]:
    """An open_audio() file -> float32 [n] blocks in [-1, 1] at SAMPLE_RATE (channels averaged), `seconds`
    of the file at a time; AudioFormatError at a NaN or infinite sample."""
    return mono_blocks(file.samplerate, file_blocks(file, seconds), name=name)


def no_samples(name: str) -> AudioFormatError:
    """For a file whose header promised frames that are not there (found once its blocks are read)."""
    return AudioFormatError(f"The {name} file contains no samples.", wav_format=name)
