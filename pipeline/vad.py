"""Frame voice activity: a speech score in [0, 1] for each 30 ms frame (VAD_FRAME samples at 16 kHz).

Two detectors, one contract. Each is per stream and stateful: it must see a stream's frames in order,
once, and then gives the same scores however the samples were split into feeds (a file and a live
microphone, an upload and a commit, segment alike).

- `webrtc`: webrtcvad's GMM (modes 0-3), a yes/no per frame (score 0 or 1). Fast, but it takes low
  coloured room noise (brown, pink) for speech, and more so after a 16 -> 24 -> 16 kHz round trip.
- `silero`: Silero VAD v6 (MIT; pipeline/data/silero_vad.onnx, from the `silero-vad` wheel, sha256 below),
  a small recurrent network, run here on ONNX Runtime's CPU provider (no torch). It scores 512-sample
  windows (32 ms) and carries a state and the last 64 samples from one window to the next, as its own
  OnnxWrapper does. Windows do not line up with 30 ms frames: a frame's score is that of the latest window
  complete by the frame's end (so it lags the frame by under one window; the segmenter's pre-roll covers
  it), 0 before the first window. About 0.4 ms of one core per window: ~1 % of real time per stream.
  Each stream's state starts as if the model had heard WARMUP_WINDOWS of digital silence: from the zero
  state it missed speech that begins at a stream's first sample (a tight commit, push-to-talk), hearing
  "one nine eight" not at all and the first words of others late (held-out recordings with no lead: 6.0 %
  WER at the upload, 4.0 % warmed, 3.9 % with webrtc; docs/history.md, "Silero VAD as the default: not taken").
"""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Protocol

import numpy as np

from .audio import SAMPLE_RATE, VAD_FRAME

VADS = ("webrtc", "silero")
SILERO_MODEL = Path(__file__).resolve().parent / "data" / "silero_vad.onnx"
# silero-vad 6.2.3's silero_vad/data/silero_vad.onnx (the same file pipecat ships)
SILERO_SHA256 = "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3"
SILERO_WINDOW = 512  # samples at 16 kHz: the only window the model takes at this rate
SILERO_CONTEXT = 64  # samples of the previous window it hears before each one
SILERO_STATE = (2, 1, 128)
WARMUP_WINDOWS = 16  # 0.5 s of silence heard before each stream


class FrameVad(Protocol):
    def scores(self, frames: np.ndarray) -> np.ndarray:
        """float32 [k, VAD_FRAME] frames in [-1, 1], the next ones of the stream -> float32 [k] in [0, 1]."""
        ...


class WebrtcVad:
    def __init__(self, mode: int) -> None:
        import webrtcvad

        self._vad = webrtcvad.Vad(mode)

    def scores(self, frames: np.ndarray) -> np.ndarray:
        pcm = np.clip(frames * 32768.0, -32768, 32767).astype("<i2").tobytes()  # webrtcvad wants int16 bytes
        size = 2 * frames.shape[1]
        return np.array([self._vad.is_speech(pcm[i:i + size], SAMPLE_RATE) for i in range(0, len(pcm), size)],
                        np.float32)


@functools.cache
def silero_warm_state() -> np.ndarray:
    """The state after WARMUP_WINDOWS windows of digital silence (the same for every stream: computed once)."""
    session, state = silero_session(), np.zeros(SILERO_STATE, np.float32)
    silence = np.zeros((1, SILERO_CONTEXT + SILERO_WINDOW), np.float32)
    for _ in range(WARMUP_WINDOWS):
        _, state = session.run(None, {"input": silence, "state": state,  # type: ignore[attr-defined]
                                      "sr": np.array(SAMPLE_RATE, np.int64)})
    state.setflags(write=False)
    return state


@functools.cache
def silero_session() -> object:
    """The one ONNX Runtime session every stream's SileroVad shares (Run is thread-safe; the state is the
    stream's). One thread: a window is too small to split, and the result is the same on every machine."""
    import onnxruntime as ort

    data = SILERO_MODEL.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != SILERO_SHA256:
        raise RuntimeError(f"{SILERO_MODEL} is not the shipped Silero VAD model (sha256 {digest}, "
                           f"expected {SILERO_SHA256}): reinstall the package")
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


class SileroVad:
    def __init__(self) -> None:
        self._session = silero_session()
        self._state = silero_warm_state()  # the context after silence is silence: zeros
        self._buffer = np.zeros(SILERO_CONTEXT, np.float32)  # the context, then samples of the next window
        self._last = 0.0  # the latest window's speech probability
        self._rate = np.array(SAMPLE_RATE, np.int64)

    def scores(self, frames: np.ndarray) -> np.ndarray:
        out = np.empty(len(frames), np.float32)
        for i, frame in enumerate(frames):
            self._buffer = np.concatenate([self._buffer, frame.astype(np.float32, copy=False)])
            while len(self._buffer) >= SILERO_CONTEXT + SILERO_WINDOW:
                window = self._buffer[: SILERO_CONTEXT + SILERO_WINDOW]
                probability, self._state = self._session.run(  # type: ignore[attr-defined]
                    None, {"input": window[None, :], "state": self._state, "sr": self._rate})
                self._last = float(probability[0, 0])
                self._buffer = self._buffer[SILERO_WINDOW:]  # its last 64 samples: the next one's context
            out[i] = self._last
        return out


def frame_vad(kind: str, webrtc_mode: int) -> FrameVad:
    if kind == "webrtc":
        return WebrtcVad(webrtc_mode)
    if kind == "silero":
        return SileroVad()
    raise ValueError(f"vad must be one of {', '.join(VADS)}, got {kind!r}")
