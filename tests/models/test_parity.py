"""Parity with FunASR's own SenseVoiceSmall, frontend and CTC on the committed fixture (no funasr needed).

tests/fixtures/parity/ was made by tests/fixtures/make_parity_fixture.py: FunASR's classes with seeded
random tiny weights (LayerNorms and the prompt embedding randomised too), its WavFrontend with dither 0 and
a CMVN file, and its inference() building the language / text-norm prompt rows. Tolerances:
- features: |ours - FunASR| <= 1e-4 + 1e-4 |FunASR| (float32 DFT-as-matmul vs kaldi-native-fbank's FFT;
  measured about 2e-5 on CMVN-normalised values of magnitude up to ~1.5);
- log-probs from FunASR's own features: 1e-5 (the same float32 operations, isolates the encoder);
- log-probs from audio in torch: 1e-4 (measured 1.0e-5). The exported ONNX graph of the same weights, in a
  larger container, is held to the same bound by tests/export/test_export_cli.py
  (test_checkpoint_export_matches_funasr, through `python -m export sensevoice --checkpoint`; measured 8.6e-6).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch

from models.frontend import read_am_mvn
from models.sensevoice import ModelDimensions, SenseVoice, load_checkpoint_state, load_state_strict
from pipeline.audio import SAMPLE_RATE

PARITY = Path(__file__).resolve().parents[1] / "fixtures" / "parity"
CONFIG = json.loads((PARITY / "config.json").read_text(encoding="utf-8"))
RUNS = sorted(CONFIG["runs"])
FEATURE_TOL = 1e-4
ENCODER_TOL = 1e-5
LOGPROB_TOL = 1e-4


def greedy(logprobs: np.ndarray) -> list[int]:
    best = logprobs.argmax(-1)
    keep = np.concatenate([[True], best[1:] != best[:-1]]) & (best != 0)
    return best[keep].tolist()


def reference(run: str) -> np.ndarray:
    return np.load(PARITY / f"logprobs_{run}.npy")


def prompts(run: str) -> tuple[torch.Tensor, torch.Tensor]:
    entry = CONFIG["runs"][run]
    return torch.tensor([entry["language_row"]]), torch.tensor([entry["textnorm_row"]])


@pytest.fixture(scope="module")
def audio() -> np.ndarray:
    samples, rate = soundfile.read(PARITY / "audio.wav", dtype="float32")
    assert rate == SAMPLE_RATE == CONFIG["sample_rate"]
    return samples


@pytest.fixture(scope="module")
def model() -> SenseVoice:
    conf = CONFIG["model"]["encoder_conf"]
    dims = ModelDimensions(
        input_size=CONFIG["model"]["input_size"], output_size=conf["output_size"],
        attention_heads=conf["attention_heads"], linear_units=conf["linear_units"], num_blocks=conf["num_blocks"],
        tp_blocks=conf["tp_blocks"], kernel_size=conf["kernel_size"], sanm_shift=conf["sanm_shfit"],
        vocab_size=CONFIG["model"]["vocab_size"],
    )
    model = SenseVoice(dims)
    load_state_strict(model, load_checkpoint_state(PARITY / "model.pt"))
    model.set_cmvn(*read_am_mvn(PARITY / "am.mvn"))
    return model.eval()


def test_fixture_is_not_trivial() -> None:
    """Guards the fixture itself: LayerNorm affine and prompt rows are random, runs differ in prompts."""
    state = load_checkpoint_state(PARITY / "model.pt")
    assert not torch.allclose(state["encoder.after_norm.weight"], torch.ones(1))
    assert not torch.allclose(state["encoder.encoders0.0.norm1.bias"], torch.zeros(1))
    assert len({(e["language_row"], e["textnorm_row"]) for e in CONFIG["runs"].values()}) == len(RUNS)
    assert np.abs(reference(RUNS[0]) - reference(RUNS[1])).max() > 1e-2


def test_loads_funasr_state_dict_strictly(model: SenseVoice) -> None:
    state = load_checkpoint_state(PARITY / "model.pt")
    assert set(state) == set(model.state_dict())
    for key, value in model.state_dict().items():
        assert torch.equal(value, state[key]), key


def test_features_match_funasr_frontend(model: SenseVoice, audio: np.ndarray) -> None:
    expected = np.load(PARITY / "features.npy")
    with torch.no_grad():
        features, lengths = model.features(torch.from_numpy(audio)[None], torch.tensor([len(audio)]))
    assert int(lengths[0]) == expected.shape[0] == CONFIG["feature_frames"]
    np.testing.assert_allclose(features[0].numpy(), expected, rtol=FEATURE_TOL, atol=FEATURE_TOL)


@pytest.mark.parametrize("run", RUNS)
def test_encoder_matches_funasr_on_its_features(model: SenseVoice, run: str) -> None:
    features = torch.from_numpy(np.load(PARITY / "features.npy"))[None]
    with torch.no_grad():
        logprobs, lengths = model.encode(features, torch.tensor([features.shape[1]]), *prompts(run))
    assert int(lengths[0]) == CONFIG["runs"][run]["frames"]
    np.testing.assert_allclose(logprobs[0].numpy(), reference(run), rtol=0, atol=ENCODER_TOL)


@pytest.mark.parametrize("run", RUNS)
def test_torch_logprobs_match_funasr(model: SenseVoice, audio: np.ndarray, run: str) -> None:
    with torch.no_grad():
        logprobs, lengths = model(torch.from_numpy(audio)[None], torch.tensor([len(audio)]), *prompts(run))
    assert int(lengths[0]) == logprobs.shape[1] == reference(run).shape[0]
    np.testing.assert_allclose(logprobs[0].numpy(), reference(run), rtol=0, atol=LOGPROB_TOL)
    assert greedy(logprobs[0].numpy()) == greedy(reference(run))
