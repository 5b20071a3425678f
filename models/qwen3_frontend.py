"""Whisper's 128-bin log-mel (what Qwen3-ASR's WhisperFeatureExtractor computes) in-graph and length-aware.

The reference (transformers' WhisperFeatureExtractor, torch path): a centred STFT (reflect padding of 200
samples at each end, periodic Hann window of 400, hop 160), the power of bins 0..200, slaney mel filters
(0-8 kHz), log10 floored at 1e-10, the last frame dropped, everything floored at the utterance's maximum
minus 8, then (x + 4) / 4. Two of those steps read past a frame's own samples, and both are made to
depend on the valid length only:
- the right-hand reflection is a gather whose indices reflect at the valid end (and are clamped into the
  container), so the last frames of 5 s alone and of 5 s in a 30 s container see the same samples;
- the maximum is taken over the valid frames only (an additive mask before ReduceMax).
The DFT is a strided Conv1d whose kernel is the windowed DFT matrix, as in models/frontend.py.
Frames past the valid length come out zero.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from pipeline.audio import SAMPLE_RATE

N_FFT = 400
HOP = 160
N_BINS = N_FFT // 2 + 1
LOG_FLOOR = 1e-10
DYNAMIC_RANGE = 8.0  # log10 units kept below the utterance's maximum
MASK_VALUE = 1e4


def dft_kernel() -> np.ndarray:
    """Periodic-Hann-windowed real DFT of a 400-sample frame: [2 * 201, 400] (real rows, then imaginary)."""
    n = np.arange(N_FFT)
    window = 0.5 - 0.5 * np.cos(2 * np.pi * n / N_FFT)
    angles = 2 * np.pi * np.arange(N_BINS)[:, None] * n[None, :] / N_FFT
    return np.concatenate([np.cos(angles), -np.sin(angles)]) * window[None, :]


def slaney_mel_filters(n_mels: int, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Slaney-scale, slaney-normalised triangular filters [n_mels, 201] from 0 Hz to Nyquist (librosa's and
    transformers' `mel_filter_bank(norm="slaney", mel_scale="slaney")`)."""
    min_log_hz, min_log_mel, log_step = 1000.0, 15.0, np.log(6.4) / 27.0

    def to_mel(hz):
        hz = np.asarray(hz, dtype=np.float64)
        return np.where(hz >= min_log_hz, min_log_mel + np.log(np.maximum(hz, 1e-10) / min_log_hz) / log_step, 3.0 * hz / 200.0)

    def to_hz(mel):
        return np.where(mel >= min_log_mel, min_log_hz * np.exp(log_step * (mel - min_log_mel)), 200.0 * mel / 3.0)

    fft_hz = np.linspace(0, sample_rate / 2, N_BINS)
    edges = to_hz(np.linspace(to_mel(0.0), to_mel(sample_rate / 2), n_mels + 2))
    slopes = edges[None, :] - fft_hz[:, None]  # [bins, n_mels + 2]
    down = -slopes[:, :-2] / np.diff(edges)[:-1]
    up = slopes[:, 2:] / np.diff(edges)[1:]
    filters = np.maximum(0.0, np.minimum(down, up))  # [bins, n_mels]
    filters *= (2.0 / (edges[2:] - edges[:-2]))[None, :]
    return filters.T


class WhisperLogMel(nn.Module):
    """forward(audio float [B, N] in [-1, 1], audio_lengths int [B]) -> (mel [B, n_mels, N // 160],
    mel_lengths int64 [B] = audio_lengths // 160). Needs N >= 201 valid samples for the reflection."""

    def __init__(self, n_mels: int) -> None:
        super().__init__()
        # Non-persistent: derived constants, not part of the released state_dict.
        self.register_buffer("dft", torch.tensor(dft_kernel(), dtype=torch.float32)[:, None, :], False)
        self.register_buffer("mel_filters", torch.tensor(slaney_mel_filters(n_mels), dtype=torch.float32), False)
        self.register_buffer("pad_offsets", torch.arange(N_FFT) - N_FFT // 2, False)

    def forward(self, audio: torch.Tensor, audio_lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lengths = audio_lengths.to(torch.int64)[:, None]  # [B, 1]
        positions = torch.ones_like(audio, dtype=torch.int64).cumsum(1) - 1  # [B, N]
        audio = audio * (positions < lengths).to(audio.dtype)
        # Centred frames: padded sample p is sample p - 200, reflected at 0 and at the valid end.
        padded_positions = torch.cat([positions[:, :1] + self.pad_offsets[: N_FFT // 2], positions,
                                      positions[:, -1:] + 1 + self.pad_offsets[N_FFT // 2:]], 1)
        index = padded_positions.abs()
        index = torch.minimum(index, 2 * (lengths - 1) - index)
        index = torch.clamp(index, min=0, max=audio.shape[1] - 1)
        samples = torch.gather(audio, 1, index)[:, None, :]  # [B, 1, N + 400]
        spectrum = nn.functional.conv1d(samples, self.dft, stride=HOP)[:, :, :-1]  # [B, 402, N // 160]
        power = (spectrum * spectrum).unflatten(1, (2, N_BINS)).sum(1)  # [B, 201, T]
        log_mel = torch.log10(torch.clamp(torch.matmul(self.mel_filters, power), min=LOG_FLOOR))
        mel_lengths = torch.div(audio_lengths.to(torch.int64), HOP, rounding_mode="floor")
        frames = torch.ones_like(log_mel[:, 0, :], dtype=torch.int64).cumsum(1)  # [B, T] 1-based
        valid = (frames <= mel_lengths[:, None]).to(log_mel.dtype)[:, None, :]  # [B, 1, T]
        peak = (log_mel + (valid - 1.0) * MASK_VALUE).amax(dim=(1, 2), keepdim=True)
        log_mel = torch.maximum(log_mel, peak - DYNAMIC_RANGE)
        return (log_mel + 4.0) / 4.0 * valid, mel_lengths
