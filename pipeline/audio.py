"""Audio constants and PCM intake: the one place that knows the sample rate and frame geometry.

Every other module (the in-graph frontend in `models/`, the segmenter, the engine, the clients' helpers
and the tests) imports these names; nothing else retypes 16000.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import soxr

from .errors import AudioFormatError


def exact_div(x: int, y: int) -> int:
    assert x % y == 0, f"{x} is not a multiple of {y}"
    return x // y


SAMPLE_RATE = 16000  # what the model hears, in Hz
FBANK_WINDOW = 400  # 25 ms analysis window, in samples
FBANK_SHIFT = 160  # 10 ms frame shift, in samples
FBANK_FFT = 512  # FFT size (the window zero-padded to a power of two)
N_MELS = 80
LFR_WINDOW = 7  # low frame rate: stack 7 fbank frames ...
LFR_SHIFT = 6  # ... every 6 frames
OUTPUT_FRAME_SHIFT = FBANK_SHIFT * LFR_SHIFT  # 960 samples: one encoder/CTC frame
OUTPUT_FRAME_SECONDS = OUTPUT_FRAME_SHIFT / SAMPLE_RATE  # 0.06 s
PROMPT_FRAMES = 4  # language, emotion, event, text-norm rows prepended by SenseVoice
VAD_FRAME = exact_div(SAMPLE_RATE * 30, 1000)  # 480 samples: webrtcvad's 30 ms frame

MIN_INPUT_RATE = 8000
MAX_INPUT_RATE = 48000
# Files may have any rate soxr takes down or up to SAMPLE_RATE, but a header's low rate multiplies what must
# be held and heard: a 64 KB WAV that says 1 Hz is 9 hours at 16 kHz (decoded whole, 2 GB). No speech fits
# under 4 kHz (2 kHz of bandwidth), so a file below it is refused: at most 4 samples heard per sample read.
MIN_FILE_RATE = 4000
PCM_FORMATS = ("s16le", "f32le")


def encoder_frames(samples: int) -> int:
    """Encoder (LFR) frames the in-graph frontend makes of `samples` (>= FBANK_WINDOW): ceil(fbank frames / 6)
    with 1 + (samples - 400) // 160 fbank frames, i.e. 1 + (samples - 400) // 960."""
    return (samples - FBANK_WINDOW) // OUTPUT_FRAME_SHIFT + 1


def seconds_to_samples(seconds: float) -> int:
    return int(round(seconds * SAMPLE_RATE))


def samples_to_seconds(samples: int) -> float:
    return samples / SAMPLE_RATE


@dataclass(frozen=True)
class AudioFormat:
    """How a client's PCM bytes are laid out."""

    sample_rate: int = SAMPLE_RATE
    encoding: str = "s16le"  # one of PCM_FORMATS
    channels: int = 1  # 1, or 2 interleaved (downmixed to mono)

    @property
    def bytes_per_frame(self) -> int:
        return (2 if self.encoding == "s16le" else 4) * self.channels


# ---- PCM intake --------------------------------------------------------------------------------------

def check_format(fmt: AudioFormat) -> None:
    """Raise AudioFormatError unless `fmt` is something `decode_pcm` and `Resampler` accept."""
    if fmt.encoding not in PCM_FORMATS:
        raise AudioFormatError(
            f"encoding must be one of {', '.join(PCM_FORMATS)}, got {fmt.encoding!r}", encoding=fmt.encoding
        )
    if fmt.channels not in (1, 2) or isinstance(fmt.channels, bool):
        raise AudioFormatError(f"channels must be 1 or 2, got {fmt.channels!r}", channels=fmt.channels)
    check_rate(fmt.sample_rate)


def check_rate(rate: int) -> None:
    if isinstance(rate, bool) or not isinstance(rate, int) or not MIN_INPUT_RATE <= rate <= MAX_INPUT_RATE:
        raise AudioFormatError(
            f"sample rate must be an integer from {MIN_INPUT_RATE} to {MAX_INPUT_RATE} Hz, got {rate!r}",
            sample_rate=rate,
        )


def decode_pcm(data: bytes, fmt: AudioFormat) -> np.ndarray:
    """Little-endian PCM bytes -> float32 mono samples in [-1, 1], shape [n], at `fmt.sample_rate`.

    Every message must hold whole sample frames (all channels of one instant): anything else, or a NaN or
    infinite float sample, raises AudioFormatError. Interleaved stereo is averaged to mono; f32 samples
    beyond +-1 are clipped (a client's gain overshoot, not an error).
    """
    check_format(fmt)
    if len(data) % fmt.bytes_per_frame:
        raise AudioFormatError(
            f"{len(data)} bytes is not a whole number of {fmt.encoding} sample frames "
            f"({fmt.bytes_per_frame} bytes each with {fmt.channels} channel(s))",
            size=len(data),
        )
    if fmt.encoding == "s16le":
        samples = np.frombuffer(data, dtype="<i2").astype(np.float32) * np.float32(1 / 32768)
    else:
        samples = np.frombuffer(data, dtype="<f4").astype(np.float32)  # astype copies: frombuffer is read-only
        if not np.isfinite(samples).all():
            raise AudioFormatError("f32le audio contains NaN or infinite samples", size=len(data))
        np.clip(samples, -1.0, 1.0, out=samples)
    if fmt.channels == 2:
        samples = samples.reshape(-1, 2).mean(axis=1, dtype=np.float32)
    return samples


class Resampler:
    """Streaming resampler from `in_rate` to SAMPLE_RATE (soxr, high quality); a passthrough at 16 kHz.

    soxr compensates its own filter delay, so output sample i is at time i / SAMPLE_RATE, and after
    `flush()` the total output length is round(n_in * SAMPLE_RATE / in_rate): no tail is lost.
    """

    def __init__(self, in_rate: int) -> None:
        check_rate(in_rate)
        self.in_rate = in_rate
        self._stream = None if in_rate == SAMPLE_RATE else soxr.ResampleStream(in_rate, SAMPLE_RATE, 1, dtype="float32")
        self._flushed = False

    def process(self, samples: np.ndarray) -> np.ndarray:
        """float32 [n] at in_rate -> float32 [m] at SAMPLE_RATE (m may be 0 while the filter fills)."""
        if self._flushed:
            raise RuntimeError("Resampler.process() after flush()")
        samples = np.ascontiguousarray(samples, dtype=np.float32)
        if self._stream is None:
            return samples
        return self._stream.resample_chunk(samples)

    def flush(self) -> np.ndarray:
        """The samples still inside the filter, float32 [m]; the resampler takes no input afterwards."""
        if self._flushed:
            return np.zeros(0, np.float32)
        self._flushed = True
        if self._stream is None:
            return np.zeros(0, np.float32)
        return self._stream.resample_chunk(np.zeros(0, np.float32), last=True)


def resample(samples: np.ndarray, in_rate: int) -> np.ndarray:
    """One-shot: float32 [n] at `in_rate` -> float32 [m] at SAMPLE_RATE."""
    if in_rate == SAMPLE_RATE:
        return np.ascontiguousarray(samples, dtype=np.float32)
    return soxr.resample(np.ascontiguousarray(samples, dtype=np.float32), in_rate, SAMPLE_RATE).astype(np.float32)


def load_audio(path: str | os.PathLike) -> np.ndarray:
    """Read any file soundfile understands -> float32 mono samples in [-1, 1] at SAMPLE_RATE, shape [n].

    Unlike the wire protocol, files may have any rate (soxr handles it) and any channel count (averaged).
    An unreadable or empty file raises AudioFormatError naming the file.
    """
    import soundfile  # here, not at the top: the streaming path never reads files (the one non-core import)

    try:
        data, rate = soundfile.read(os.fspath(path), dtype="float32", always_2d=True)
    except (OSError, RuntimeError) as exc:  # LibsndfileError is a RuntimeError
        raise AudioFormatError(f"cannot read audio file {os.fspath(path)}: {exc}", path=os.fspath(path)) from None
    if data.shape[0] == 0:
        raise AudioFormatError(f"audio file {os.fspath(path)} contains no samples", path=os.fspath(path))
    samples = data.mean(axis=1, dtype=np.float32) if data.shape[1] > 1 else data[:, 0]
    if not np.isfinite(samples).all():
        raise AudioFormatError(f"audio file {os.fspath(path)} contains NaN or infinite samples", path=os.fspath(path))
    samples = resample(samples, rate)
    return np.clip(samples, -1.0, 1.0, out=samples)
