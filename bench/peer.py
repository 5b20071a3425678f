"""The peer, run the way `funasr_onnx` (FunASR's ONNX runtime package) runs SenseVoiceSmall.

Features outside the graph, in Python: kaldi-native-fbank (dither 0, Hamming window, 80 mel bins, the
waveform scaled by 32768, one `get_frame` call per frame as funasr_onnx's WavFrontend does), LFR 7/6 by
numpy stacking and CMVN from am.mvn; then one ONNX Runtime run at the clip's exact length (dynamic
shapes). The graph is FunASR's own export (bench/make_peer.py) with our model's weights, so
timing it beside ours compares the graphs and the frontends, not the weights.

    PeerModel(peer_dir, precision, threads).run(audio float32 [n] at SAMPLE_RATE) -> ctc_logits [T + 4, V]
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort

from pipeline.audio import FBANK_SHIFT, FBANK_WINDOW, LFR_SHIFT, LFR_WINDOW, N_MELS, SAMPLE_RATE
from pipeline.errors import ModelLoadError

PEER_FILE = "peer.json"


def fbank(audio: np.ndarray) -> np.ndarray:
    """float32 [n] in [-1, 1] -> Kaldi log-mel features float32 [frames, N_MELS] (funasr_onnx WavFrontend)."""
    import kaldi_native_fbank as knf

    opts = knf.FbankOptions()
    opts.frame_opts.samp_freq = SAMPLE_RATE
    opts.frame_opts.dither = 0.0
    opts.frame_opts.window_type = "hamming"
    opts.frame_opts.frame_shift_ms = 1000.0 * FBANK_SHIFT / SAMPLE_RATE
    opts.frame_opts.frame_length_ms = 1000.0 * FBANK_WINDOW / SAMPLE_RATE
    opts.frame_opts.snip_edges = True
    opts.mel_opts.num_bins = N_MELS
    opts.energy_floor = 0
    computer = knf.OnlineFbank(opts)
    computer.accept_waveform(SAMPLE_RATE, (audio * (1 << 15)).tolist())
    frames = computer.num_frames_ready
    mat = np.empty([frames, N_MELS], np.float32)
    for i in range(frames):
        mat[i, :] = computer.get_frame(i)
    return mat


def apply_lfr(inputs: np.ndarray) -> np.ndarray:
    """funasr_onnx's apply_lfr: [T, 80] -> [ceil(T / 6), 560], first frame repeated 3x on the left,
    the last frame repeated to fill the final window."""
    frames = []
    t = inputs.shape[0]
    t_lfr = int(np.ceil(t / LFR_SHIFT))
    left = np.tile(inputs[0], ((LFR_WINDOW - 1) // 2, 1))
    inputs = np.vstack((left, inputs))
    t += (LFR_WINDOW - 1) // 2
    for i in range(t_lfr):
        if LFR_WINDOW <= t - i * LFR_SHIFT:
            frames.append(inputs[i * LFR_SHIFT: i * LFR_SHIFT + LFR_WINDOW].reshape(1, -1))
        else:
            pad = LFR_WINDOW - (t - i * LFR_SHIFT)
            frame = inputs[i * LFR_SHIFT:].reshape(-1)
            for _ in range(pad):
                frame = np.hstack((frame, inputs[-1]))
            frames.append(frame)
    return np.vstack(frames).astype(np.float32)


def load_cmvn(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """funasr_onnx's load_cmvn: the <AddShift> and <Rescale> vectors of a Kaldi am.mvn, float32 [560] each."""
    lines = path.read_text(encoding="utf-8").split("\n")
    found: dict[str, np.ndarray] = {}
    for i, line in enumerate(lines[:-1]):
        tag = line.split(" ")[0]
        if tag in ("<AddShift>", "<Rescale>") and lines[i + 1].startswith("<LearnRateCoef>"):
            found[tag] = np.array(lines[i + 1].split()[3:-1], dtype=np.float32)
    if set(found) != {"<AddShift>", "<Rescale>"}:
        raise ModelLoadError(f"{path}: not a Kaldi am.mvn (no <AddShift>/<Rescale>)", path=str(path))
    return found["<AddShift>"], found["<Rescale>"]


def read_peer_info(peer_dir: str | Path) -> dict:
    """peer.json of a directory make_peer.py wrote; ModelLoadError when it is not one."""
    path = Path(peer_dir) / PEER_FILE
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelLoadError(f"{peer_dir} is not a peer directory: no {PEER_FILE} "
                             "(make one with /opt/funasr-venv/bin/python -m bench.make_peer)") from None
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: unreadable ({exc})") from None
    if not isinstance(info, dict) or "files" not in info:
        raise ModelLoadError(f"{path}: not a peer description")
    return info


class PeerModel:
    """FunASR's SenseVoice export in `peer_dir` (see make_peer.py) in one ONNX Runtime session."""

    def __init__(self, peer_dir: str | Path, precision: str, options: ort.SessionOptions,
                 providers: list[str] | None = None) -> None:
        self.dir = Path(peer_dir)
        self.info = read_peer_info(self.dir)
        if precision not in self.info["files"]:
            raise ModelLoadError(f"{self.dir}: no {precision} peer graph (has {', '.join(self.info['files'])})")
        self.shift, self.scale = load_cmvn(self.dir / self.info.get("cmvn", "am.mvn"))
        self.session = ort.InferenceSession(str(self.dir / self.info["files"][precision]), options,
                                            providers=providers or ["CPUExecutionProvider"])

    def features(self, audio: np.ndarray) -> np.ndarray:
        """float32 [n] -> normalised LFR features float32 [ceil(T / 6), 560]."""
        return (apply_lfr(fbank(audio)) + self.shift) * self.scale

    def run(self, audio: np.ndarray, language: int = 0, textnorm: int = 15) -> np.ndarray:
        """float32 [n] at SAMPLE_RATE -> raw CTC logits float32 [T + 4, V] (frontend + one run)."""
        feats = self.features(audio)
        logits, _ = self.session.run(None, {
            "speech": feats[None], "speech_lengths": np.array([len(feats)], np.int32),
            "language": np.array([language], np.int32), "textnorm": np.array([textnorm], np.int32)})
        return logits[0]
