"""The in-graph, length-aware SenseVoice frontend: Kaldi fbank, LFR 7/6 and CMVN as torch modules.

Everything the released model's Python frontend does outside its graph happens here inside it, so the
exported ONNX graph takes raw audio. Each stage is written so that padding after the valid samples
cannot change a valid output value:
- samples past `audio_lengths` are zeroed before anything reads them;
- frames are gathered from cumsum-built sample indices, never Tensor.unfold (it exports a Range: issue 60);
- the Kaldi frame pipeline (DC removal, pre-emphasis, Hamming window, 512-point DFT) is linear in a
  frame's 400 samples, so it is one matrix: a frame reads only its own samples. Frames are rows
  ([frames, 400] @ [400, 514], then the mel banks the same way), each product in slices of at most
  GEMM_SLICE along the summed axis. Why: onnxruntime's GEMM (MLAS) picks its blocking of the summed axis
  from the other two sizes; as a Conv (frames as columns) or with a long summed axis, a 0.3 s clip alone
  and the same clip in a 30 s container summed in different orders, and the last-bit difference moved
  int8's dynamic quantisation of the first layer (0.0099 at 0.3 s; issue 37). With frames as rows and no
  slice past one block, a frame's value is the same bits whatever the number of frames;
- LFR replicate padding is a gather whose indices are clamped to the valid frame range;
- padded LFR rows are zeroed after CMVN, so no padded value reaches the encoder.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from torch import nn

from pipeline.audio import FBANK_FFT, FBANK_SHIFT, FBANK_WINDOW, LFR_SHIFT, LFR_WINDOW, N_MELS, SAMPLE_RATE

PREEMPHASIS = 0.97
MEL_LOW_HZ = 20.0
MEL_HIGH_HZ = SAMPLE_RATE / 2
LOG_FLOOR = float(np.finfo(np.float32).eps)  # Kaldi floors the mel energies at float epsilon
PCM_SCALE = 32768.0  # FunASR feeds Kaldi int16-scaled samples
FEATURE_SIZE = N_MELS * LFR_WINDOW  # 560
GEMM_SLICE = 128  # MLAS's smallest block of the summed axis: a slice this long is never split (docstring)


def frame_kernel() -> np.ndarray:
    """The linear map from one 400-sample frame to its DFT: [2 * 257, 400] (real rows, then imaginary).

    Kaldi's per-frame steps in order: remove the DC offset, pre-emphasise (x[0] -= 0.97 x[0]), apply a
    Hamming window, zero-pad to 512 and take the DFT. Composed in float64, rounded once to float32.
    """
    n = FBANK_WINDOW
    dc_removal = np.eye(n) - np.full((n, n), 1.0 / n)
    preemphasis = np.eye(n) - PREEMPHASIS * np.eye(n, k=-1)
    preemphasis[0, 0] = 1.0 - PREEMPHASIS
    window = 0.54 - 0.46 * np.cos(2 * np.pi * np.arange(n) / (n - 1))
    bins = np.arange(FBANK_FFT // 2 + 1)[:, None] * np.arange(n)[None, :]
    dft = np.concatenate([np.cos(2 * np.pi * bins / FBANK_FFT), -np.sin(2 * np.pi * bins / FBANK_FFT)])
    return (dft * window[None, :]) @ preemphasis @ dc_removal


def mel_banks() -> np.ndarray:
    """Kaldi's triangular mel filters over the power spectrum: [N_MELS, 257] (the Nyquist bin unused)."""

    def mel(hz: np.ndarray | float) -> np.ndarray:
        return 1127.0 * np.log(1.0 + np.asarray(hz) / 700.0)

    num_fft_bins = FBANK_FFT // 2
    fft_bin_width = SAMPLE_RATE / FBANK_FFT
    mel_low, mel_high = mel(MEL_LOW_HZ), mel(MEL_HIGH_HZ)
    delta = (mel_high - mel_low) / (N_MELS + 1)
    bin_mel = mel(fft_bin_width * np.arange(num_fft_bins))
    banks = np.zeros((N_MELS, num_fft_bins + 1))
    for m in range(N_MELS):
        left, center, right = mel_low + m * delta, mel_low + (m + 1) * delta, mel_low + (m + 2) * delta
        up = (bin_mel - left) / (center - left)
        down = (right - bin_mel) / (right - center)
        inside = (bin_mel > left) & (bin_mel < right)
        banks[m, :num_fft_bins] = np.where(inside, np.where(bin_mel <= center, up, down), 0.0)
    return banks


def read_am_mvn(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Read a Kaldi nnet `am.mvn`: (shift [560], scale [560]) applied as (x + shift) * scale.

    Raises ValueError naming the problem when the file is not such a CMVN file.
    """
    try:
        lines = Path(path).read_text(encoding="utf-8").split("\n")
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a text file (not a Kaldi am.mvn file)") from None
    found: dict[str, np.ndarray] = {}
    for i, line in enumerate(lines):
        tag = line.split(" ")[0] if line else ""
        if tag in ("<AddShift>", "<Rescale>") and i + 1 < len(lines):
            values = lines[i + 1].split()
            if len(values) < 3 or values[0] != "<LearnRateCoef>":
                raise ValueError(f"{path}: {tag} is not followed by a <LearnRateCoef> line")
            try:
                found[tag] = np.array([float(v) for v in values[3:-1]], dtype=np.float32)
            except ValueError:
                raise ValueError(f"{path}: non-numeric {tag} values") from None
    for tag in ("<AddShift>", "<Rescale>"):
        if tag not in found:
            raise ValueError(f"{path}: no {tag} vector (not a Kaldi am.mvn file)")
        if found[tag].shape != (FEATURE_SIZE,):
            raise ValueError(f"{path}: {tag} has {found[tag].size} values, expected {FEATURE_SIZE}")
        if not np.all(np.isfinite(found[tag])):
            raise ValueError(f"{path}: {tag} has non-finite values")
    return found["<AddShift>"], found["<Rescale>"]


def write_am_mvn(path: str | Path, shift: np.ndarray, scale: np.ndarray) -> None:
    """Write (shift, scale) in the Kaldi nnet text layout FunASR's `am.mvn` uses."""

    def row(values: np.ndarray) -> str:
        return "<LearnRateCoef> 0 [ " + " ".join(f"{v:.8g}" for v in values) + " ]"

    n = FEATURE_SIZE
    text = (
        f"<Nnet>\n<Splice> {n} {n}\n[ 0 ]\n<AddShift> {n} {n}\n{row(shift)}\n"
        f"<Rescale> {n} {n}\n{row(scale)}\n</Nnet>\n"
    )
    Path(path).write_text(text, encoding="utf-8")


class Frontend(nn.Module):
    """Raw audio -> normalised LFR features, length-aware.

    forward(audio float32 [B, N] in [-1, 1], audio_lengths int [B] valid samples)
        -> features float32 [B, ceil(T / 6), 560], feature_lengths int64 [B]
    where T = 1 + (N - 400) // 160 fbank frames (N >= 400). Rows past a feature length are zero.
    """

    def __init__(self) -> None:
        super().__init__()
        # Non-persistent: the state_dict stays exactly FunASR's; these are derived or set from am.mvn.
        self.register_buffer("frame_kernel", torch.tensor(frame_kernel().T, dtype=torch.float32), False)  # [400, 514]
        self.register_buffer("mel_kernel", torch.tensor(mel_banks().T, dtype=torch.float32), False)  # [257, 80]
        self.register_buffer("frame_offsets", torch.arange(FBANK_WINDOW), False)  # a constant in the graph
        self.register_buffer("lfr_offsets", torch.arange(LFR_WINDOW) - (LFR_WINDOW - 1) // 2, False)
        self.register_buffer("cmvn_shift", torch.zeros(FEATURE_SIZE), False)
        self.register_buffer("cmvn_scale", torch.ones(FEATURE_SIZE), False)

    def set_cmvn(self, shift: np.ndarray | torch.Tensor, scale: np.ndarray | torch.Tensor) -> None:
        self.cmvn_shift.copy_(torch.as_tensor(shift, dtype=torch.float32))
        self.cmvn_scale.copy_(torch.as_tensor(scale, dtype=torch.float32))

    def fbank(self, audio: torch.Tensor, audio_lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Kaldi log-mel fbank: ([B, T, 80], frame_lengths int64 [B])."""
        positions = torch.ones_like(audio, dtype=torch.int64).cumsum(-1)
        sample_mask = (positions <= audio_lengths.to(torch.int64)[:, None]).to(audio.dtype)
        frames = frame_rows(audio * PCM_SCALE * sample_mask, self.frame_offsets)  # [B, T, 400]
        spectrum = sliced_matmul(frames, self.frame_kernel)  # [B, T, 514]
        power = (spectrum * spectrum).unflatten(2, (2, FBANK_FFT // 2 + 1)).sum(2)  # [B, T, 257]
        mel = sliced_matmul(power, self.mel_kernel)  # [B, T, 80]
        log_mel = torch.log(torch.clamp(mel, min=LOG_FLOOR))
        valid = torch.div(audio_lengths.to(torch.int64) - FBANK_WINDOW, FBANK_SHIFT, rounding_mode="floor") + 1
        return log_mel, torch.clamp(valid, min=0)

    def lfr(
        self, frames: torch.Tensor, frame_lengths: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Stack frames 6i-3 .. 6i+3 clamped to the valid range.

        Returns (stacked [B, ceil(T/6), 560], lengths int64 [B], row_mask float [B, ceil(T/6), 1]).
        """
        anchors = frames[:, ::LFR_SHIFT, 0]  # one element per output frame; only its shape is used
        index = torch.ones_like(anchors, dtype=torch.int64).cumsum(1) - 1  # [B, T_lfr]
        last = torch.clamp(frame_lengths - 1, min=0)[:, None, None]
        gather_index = torch.minimum(index[:, :, None] * LFR_SHIFT + self.lfr_offsets, last).clamp(min=0)
        gather_index = gather_index.flatten(1)[:, :, None].expand(-1, -1, frames.shape[-1])
        stacked = torch.gather(frames, 1, gather_index).unflatten(1, (-1, LFR_WINDOW)).flatten(2)
        lengths = torch.div(frame_lengths + (LFR_SHIFT - 1), LFR_SHIFT, rounding_mode="floor")
        row_mask = (index < lengths[:, None]).to(stacked.dtype)[:, :, None]
        return stacked, lengths, row_mask

    def forward(self, audio: torch.Tensor, audio_lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        frames, frame_lengths = self.fbank(audio, audio_lengths)
        stacked, lengths, row_mask = self.lfr(frames, frame_lengths)
        features = (stacked + self.cmvn_shift) * self.cmvn_scale * row_mask
        return features, lengths


def frame_rows(samples: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """samples [B, N] -> frames [B, T, FBANK_WINDOW] every FBANK_SHIFT samples, T = 1 + (N - 400) // 160: what
    Tensor.unfold returns, as a gather. unfold exports a Range (arange), which DirectML's Reshape fails on (seeds
    001 4.1 and 003; export/graph_rules.py); here the frame starts are a cumsum over one sample per frame (the
    strided slice's length is T) and `offsets` ([400] int64, 0..399) is a constant of the graph."""
    one_per_frame = samples[0, : samples.shape[1] - (FBANK_WINDOW - 1) : FBANK_SHIFT]  # [T]; only its shape is used
    starts = (torch.ones_like(one_per_frame, dtype=torch.int64).cumsum(0) - 1) * FBANK_SHIFT
    index = (starts[:, None] + offsets[None, :]).flatten()  # [T * 400]
    return samples.index_select(1, index).unflatten(1, (-1, FBANK_WINDOW))


def sliced_matmul(rows: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """rows [..., K] @ matrix [K, N], summed in slices of GEMM_SLICE along K, added in order (module docstring)."""
    product = None
    for start in range(0, matrix.shape[0], GEMM_SLICE):
        part = rows[..., start:start + GEMM_SLICE] @ matrix[start:start + GEMM_SLICE]
        product = part if product is None else product + part
    return product


def sinusoid_timescales(depth: int) -> torch.Tensor:
    """FunASR's SinusoidalPositionEncoder timescales: [depth / 2]."""
    increment = math.log(10000.0) / (depth / 2 - 1)
    return torch.exp(torch.arange(depth // 2, dtype=torch.float32) * -increment)
