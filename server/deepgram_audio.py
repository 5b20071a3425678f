"""Deepgram's audio on the wire, pure: raw encodings (linear16, linear32, mulaw, alaw) of one or more
interleaved channels, and containerised audio (no `encoding`: a WAV header in the first bytes).

    PcmDecoder(encoding, channels)   bytes in any split -> float32 [frames, channels] in [-1, 1]
    read_wav_header(data)            the first bytes of a WAV stream -> WavHeader, or None: need more
G.711 is decoded with 256-entry tables built once here (audioop, which did this, left Python in 3.13).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from pipeline.errors import AudioFormatError

BYTES_PER_SAMPLE = {"linear16": 2, "linear32": 4, "float32": 4, "mulaw": 1, "alaw": 1}
WIRE_ENCODINGS = ("linear16", "linear32", "mulaw", "alaw")  # what `encoding=` may name (float32: WAV only)
MAX_WAV_HEADER = 64 << 10  # bytes before the data chunk we wait for (LIST/INFO chunks are small)
_WAV_FORMATS = {(1, 16): "linear16", (1, 32): "linear32", (3, 32): "float32", (6, 8): "alaw", (7, 8): "mulaw"}
_EXTENSIBLE = 0xFFFE


def _mulaw_table() -> np.ndarray:
    """ITU-T G.711 mu-law byte -> int16 sample (as audioop.ulaw2lin)."""
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    exponent, mantissa = (u >> 4) & 7, u & 0x0F
    magnitude = (((mantissa << 3) + 0x84) << exponent) - 0x84
    return np.where(u & 0x80, -magnitude, magnitude).astype(np.int16)


def _alaw_table() -> np.ndarray:
    """ITU-T G.711 A-law byte -> int16 sample (as audioop.alaw2lin)."""
    a = np.arange(256, dtype=np.int32) ^ 0x55
    exponent, mantissa = (a >> 4) & 7, a & 0x0F
    magnitude = np.where(exponent == 0, (mantissa << 4) + 8, ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0))
    return np.where(a & 0x80, magnitude, -magnitude).astype(np.int16)


MULAW = _mulaw_table()
ALAW = _alaw_table()


class PcmDecoder:
    """Raw audio of `channels` interleaved channels -> float32 frames; a message may end mid-frame (the rest
    waits for the next one, as Deepgram takes audio as a byte stream)."""

    def __init__(self, encoding: str, channels: int) -> None:
        self.encoding, self.channels = encoding, channels
        self.frame_bytes = BYTES_PER_SAMPLE[encoding] * channels
        self._carry = b""

    def feed(self, data: bytes) -> np.ndarray:
        """float32 [frames, channels]; AudioFormatError at a NaN or infinite float sample."""
        data = self._carry + data
        whole = len(data) - len(data) % self.frame_bytes
        data, self._carry = data[:whole], data[whole:]
        if self.encoding == "linear16":
            samples = np.frombuffer(data, "<i2").astype(np.float32) / 32768.0
        elif self.encoding == "linear32":
            samples = (np.frombuffer(data, "<i4").astype(np.float64) / 2147483648.0).astype(np.float32)
        elif self.encoding == "float32":
            samples = np.frombuffer(data, "<f4")
            if not np.isfinite(samples).all():
                raise AudioFormatError("float32 audio with NaN or infinite samples")
            samples = np.clip(samples, -1.0, 1.0)
        else:
            table = MULAW if self.encoding == "mulaw" else ALAW
            samples = table[np.frombuffer(data, np.uint8)].astype(np.float32) / 32768.0
        return samples.reshape(-1, self.channels)


@dataclass(frozen=True)
class WavHeader:
    encoding: str  # a BYTES_PER_SAMPLE key
    sample_rate: int
    channels: int
    data_offset: int  # where the samples begin in the stream


def read_wav_header(data: bytes) -> WavHeader | None:
    """The header of a WAV stream from its first bytes; None while the data chunk has not begun.
    AudioFormatError for anything that is not WAV, or a WAV whose samples we cannot read. The data chunk's
    size is not trusted: streaming writers put 0 or 0xFFFFFFFF there (everything after it is audio)."""
    if len(data) >= 4 and data[:4] != b"RIFF" or len(data) >= 12 and data[8:12] != b"WAVE":
        kind = "Ogg" if data[:4] == b"OggS" else "WebM/Matroska" if data[:4] == b"\x1a\x45\xdf\xa3" else "unknown"
        raise AudioFormatError(f"audio without `encoding` must be WAV (it begins with RIFF....WAVE); these bytes "
                               f"look {kind}: send WAV, or raw audio with encoding=linear16|mulaw|alaw and sample_rate")
    fmt, offset = None, 12
    while len(data) >= offset + 8:
        chunk, size = data[offset:offset + 4], struct.unpack("<I", data[offset + 4:offset + 8])[0]
        if chunk == b"data":
            if fmt is None:
                raise AudioFormatError("WAV data chunk before its fmt chunk")
            return WavHeader(fmt[0], fmt[1], fmt[2], offset + 8)
        if chunk == b"fmt ":
            if len(data) < offset + 8 + min(size, 26):
                return None
            fmt = _wav_format(data[offset + 8:offset + 8 + size])
        offset += 8 + size + size % 2
        if offset > MAX_WAV_HEADER:
            raise AudioFormatError(f"no WAV data chunk within the first {MAX_WAV_HEADER} bytes")
    return None


def _wav_format(chunk: bytes) -> tuple[str, int, int]:
    if len(chunk) < 16:
        raise AudioFormatError("WAV fmt chunk too short")
    tag, channels, rate, _, _, bits = struct.unpack("<HHIIHH", chunk[:16])
    if tag == _EXTENSIBLE and len(chunk) >= 26:
        tag = struct.unpack("<H", chunk[24:26])[0]  # the sub-format GUID begins with the format tag
    encoding = _WAV_FORMATS.get((tag, bits))
    if encoding is None:
        raise AudioFormatError(f"WAV format tag {tag} with {bits}-bit samples is not supported; send 16- or "
                               "32-bit PCM, 32-bit float, mu-law or A-law")
    if channels < 1:
        raise AudioFormatError("WAV with 0 channels")
    return encoding, rate, channels
