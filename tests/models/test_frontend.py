"""The in-graph frontend (models.frontend.Frontend) against kaldi-native-fbank and FunASR's LFR, and its
padding invariance, on real espeak-ng speech (tests/fixtures/three_utterances.wav).

Tolerances on log-mel values (natural log of int16-scaled power):
- against kaldi-native-fbank: 5e-4 absolute. knf's own float32 FFT is off by up to 4.0e-4 from a float64
  evaluation of the same Kaldi recipe on this audio (on quiet bins, log-mel ~3); ours is within 8e-5;
- against that float64 evaluation (numpy rfft, independent of our DFT-as-convolution): 1e-4 absolute.
"""
from __future__ import annotations

from pathlib import Path

import kaldi_native_fbank as knf
import numpy as np
import pytest
import torch

from models.frontend import FEATURE_SIZE, LOG_FLOOR, PCM_SCALE, PREEMPHASIS, Frontend, mel_banks, read_am_mvn
from pipeline.audio import FBANK_FFT, FBANK_SHIFT, FBANK_WINDOW, LFR_SHIFT, LFR_WINDOW, N_MELS, SAMPLE_RATE

KNF_TOL = 5e-4
# float32 against float64 on log-mels up to 16: the DFT of int16-scaled samples cancels its DC, so a
# frame's 400-term sums lose about 5 digits; 1.3e-4 (relative 1.8e-5) at worst on three_utterances.wav,
# whether the sums run as one matrix product or in slices (models/frontend.py GEMM_SLICE).
FLOAT64_TOL = 2e-4
PADDING_TOL = 1e-5  # float rounding only (see test_padding_invariance); export.verify's bound too
PARITY_MVN = Path(__file__).resolve().parents[1] / "fixtures" / "parity" / "am.mvn"


def knf_fbank(audio: np.ndarray, high_freq: float) -> np.ndarray:
    """kaldi-native-fbank with FunASR's options: float [N] in [-1, 1] -> log-mel [T, 80]."""
    opts = knf.FbankOptions()
    opts.frame_opts.samp_freq = SAMPLE_RATE
    opts.frame_opts.frame_length_ms = 1000 * FBANK_WINDOW / SAMPLE_RATE
    opts.frame_opts.frame_shift_ms = 1000 * FBANK_SHIFT / SAMPLE_RATE
    opts.frame_opts.dither = 0.0
    opts.frame_opts.snip_edges = True
    opts.frame_opts.window_type = "hamming"
    opts.mel_opts.num_bins = N_MELS
    opts.mel_opts.low_freq = 20.0
    opts.mel_opts.high_freq = high_freq
    opts.energy_floor = 0.0
    fbank = knf.OnlineFbank(opts)
    fbank.accept_waveform(SAMPLE_RATE, (audio * PCM_SCALE).astype(np.float32).tolist())  # FunASR's int16 scale
    fbank.input_finished()
    return np.stack([fbank.get_frame(i) for i in range(fbank.num_frames_ready)])


def float64_fbank(audio: np.ndarray) -> np.ndarray:
    """The Kaldi recipe step by step in float64 with numpy's FFT: log-mel [T, 80]."""
    x = audio.astype(np.float64) * PCM_SCALE
    count = 1 + (len(x) - FBANK_WINDOW) // FBANK_SHIFT
    frames = np.stack([x[i * FBANK_SHIFT: i * FBANK_SHIFT + FBANK_WINDOW] for i in range(count)])
    frames = frames - frames.mean(1, keepdims=True)
    frames = np.concatenate([frames[:, :1] * (1 - PREEMPHASIS), frames[:, 1:] - PREEMPHASIS * frames[:, :-1]], 1)
    frames = frames * np.hamming(FBANK_WINDOW)  # 0.54 - 0.46 cos(2 pi n / (N - 1)), Kaldi's "hamming"
    power = np.abs(np.fft.rfft(frames, FBANK_FFT)) ** 2
    return np.log(np.maximum(power @ mel_banks().T, LOG_FLOOR))


def funasr_lfr(frames: torch.Tensor, lfr_m: int = LFR_WINDOW, lfr_n: int = LFR_SHIFT) -> torch.Tensor:
    """FunASR's apply_lfr (funasr/frontends/wav_frontend.py), line for line: [T, 80] -> [ceil(T/6), 560]."""
    inputs = frames
    t = inputs.shape[0]
    t_lfr = int(np.ceil(t / lfr_n))
    left_padding = inputs[0].repeat((lfr_m - 1) // 2, 1)
    inputs = torch.vstack((left_padding, inputs))
    t = t + (lfr_m - 1) // 2
    feat_dim = inputs.shape[-1]
    strides = (lfr_n * feat_dim, 1)
    sizes = (t_lfr, lfr_m * feat_dim)
    last_idx = (t - lfr_m) // lfr_n + 1
    num_padding = lfr_m - (t - last_idx * lfr_n)
    if num_padding > 0:
        num_padding = (2 * lfr_m - 2 * t + (t_lfr - 1 + last_idx) * lfr_n) / 2 * (t_lfr - last_idx)
        inputs = torch.vstack([inputs] + [inputs[-1:]] * int(num_padding))
    return inputs.as_strided(sizes, strides).clone()


@pytest.fixture(scope="module")
def frontend() -> Frontend:
    frontend = Frontend()
    frontend.set_cmvn(*read_am_mvn(PARITY_MVN))  # a real, non-trivial CMVN
    return frontend.eval()


def our_fbank(frontend: Frontend, audio: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        log_mel, lengths = frontend.fbank(torch.from_numpy(np.array(audio))[None], torch.tensor([len(audio)]))
    return log_mel[0, : int(lengths[0])].numpy()


def features(frontend: Frontend, buffer: np.ndarray, valid: int) -> tuple[np.ndarray, int]:
    with torch.no_grad():
        out, lengths = frontend(torch.from_numpy(np.array(buffer, dtype=np.float32))[None],
                                torch.tensor([valid]))
    return out[0].numpy(), int(lengths[0])


@pytest.mark.parametrize("high_freq", [0.0, SAMPLE_RATE / 2])
def test_fbank_matches_kaldi_native_fbank(frontend: Frontend, speech, high_freq: float) -> None:
    expected = knf_fbank(speech.audio, high_freq)
    ours = our_fbank(frontend, speech.audio)
    assert ours.shape == expected.shape == (1 + (len(speech.audio) - FBANK_WINDOW) // FBANK_SHIFT, N_MELS)
    assert (expected <= np.log(LOG_FLOOR) + 1e-6).any()  # digital silence: the log floor is exercised
    np.testing.assert_allclose(ours, expected, rtol=0, atol=KNF_TOL)


def test_fbank_matches_float64_kaldi_recipe(frontend: Frontend, speech) -> None:
    np.testing.assert_allclose(our_fbank(frontend, speech.audio), float64_fbank(speech.audio), rtol=0, atol=FLOAT64_TOL)


@pytest.fixture(scope="module")
def knf_log_mel(speech) -> np.ndarray:
    return knf_fbank(speech.audio, 0.0)


@pytest.mark.parametrize("frames", list(range(1, 20)) + [773])
def test_lfr_and_cmvn_match_funasr(frontend: Frontend, knf_log_mel: np.ndarray, frames: int) -> None:
    start = 0 if frames == len(knf_log_mel) else 80  # 0.8 s: inside the first sentence
    log_mel = torch.from_numpy(knf_log_mel[start: start + frames])
    # Garbage frames after the valid ones: LFR must repeat the last valid frame, never read past it.
    padded = torch.cat([log_mel, torch.full((11, N_MELS), 1e3)])[None]
    with torch.no_grad():
        stacked, lengths, row_mask = frontend.lfr(padded, torch.tensor([frames]))
    expected = funasr_lfr(log_mel)
    assert int(lengths[0]) == expected.shape[0] == -(-frames // LFR_SHIFT)
    torch.testing.assert_close(stacked[0, : expected.shape[0]], expected, rtol=0, atol=0)
    assert row_mask[0, :, 0].tolist() == [1.0] * expected.shape[0] + [0.0] * (row_mask.shape[1] - expected.shape[0])
    shift, scale = read_am_mvn(PARITY_MVN)
    cmvn = (expected.numpy() + shift) * scale  # FunASR's apply_cmvn: x += means; x *= vars (float32)
    assert cmvn.shape[1] == FEATURE_SIZE
    with torch.no_grad():
        normalised = ((stacked + frontend.cmvn_shift) * frontend.cmvn_scale * row_mask)[0]
    np.testing.assert_array_equal(normalised[: expected.shape[0]].numpy(), cmvn)


@pytest.mark.parametrize("valid", [FBANK_WINDOW, FBANK_WINDOW + 1, FBANK_WINDOW + 6 * FBANK_SHIFT - 1, 17_000, None])
def test_padding_invariance(frontend: Frontend, speech, valid: int | None) -> None:
    """Features of audio alone == the valid rows of the same audio in a longer buffer; padded rows zero.

    Zero and garbage padding of the same buffer must give bit-identical features (a leak of any padded
    sample would change them). Against the audio alone the tolerance is float rounding: the strided
    convolution picks its algorithm by buffer length, which moves log-mel values by up to ~7e-5 (within
    its float32 error) and normalised features by ~5e-6.
    """
    audio = speech.audio[:valid] if valid else speech.audio
    alone, alone_length = features(frontend, audio, len(audio))
    assert alone_length == alone.shape[0]
    for extra in (1, FBANK_SHIFT - 1, 3 * SAMPLE_RATE + 7):
        zeros = np.zeros(len(audio) + extra, np.float32)
        garbage = np.random.default_rng(extra).uniform(-1, 1, len(zeros)).astype(np.float32)
        zeros[: len(audio)] = garbage[: len(audio)] = audio
        with_zeros, length = features(frontend, zeros, len(audio))
        with_garbage, garbage_length = features(frontend, garbage, len(audio))
        assert length == garbage_length == alone_length
        np.testing.assert_array_equal(with_garbage, with_zeros)
        np.testing.assert_allclose(with_zeros[:length], alone, rtol=0, atol=PADDING_TOL)
        assert not with_zeros[length:].any()


def test_batch_items_are_independent(frontend: Frontend, speech) -> None:
    short, long = speech.audio[: SAMPLE_RATE], speech.audio[SAMPLE_RATE // 2:]
    batch = np.zeros((2, len(long)), np.float32)
    batch[0, : len(short)], batch[1] = short, long
    with torch.no_grad():
        out, lengths = frontend(torch.from_numpy(batch), torch.tensor([len(short), len(long)]))
    for i, audio in enumerate((short, long)):
        alone, length = features(frontend, audio, len(audio))
        assert int(lengths[i]) == length
        np.testing.assert_allclose(out[i, :length].numpy(), alone, rtol=0, atol=PADDING_TOL)
