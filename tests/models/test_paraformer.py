"""Paraformer against FunASR's own on the committed fixture (no funasr needed), and the loop-free CIF.

tests/fixtures/paraformer/ was made by tests/fixtures/make_paraformer_fixture.py: FunASR's Paraformer
classes (SANMEncoder, CifPredictorV2 with the 0.45 tail, ParaformerSANMDecoder) with seeded random tiny
weights and randomised LayerNorms, its WavFrontend and inference() on a 2.2 s clip, and FunASR's CIF on
synthetic alphas (padding, sums near whole numbers, a row that fires no token). Tolerances: features 1e-4
(as the SenseVoice parity test: float32 DFT-as-matmul against kaldi-native-fbank), everything from
FunASR's own features 1e-5 (CIF outputs) and 1e-4 (log-probs).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch

from models.cif import cif
from models.frontend import read_am_mvn
from models.paraformer import Paraformer, ParaformerDimensions
from models.sensevoice import load_checkpoint_state, load_state_strict
from pipeline.audio import SAMPLE_RATE
from pipeline.families.paraformer.decoding import ParaformerOutput, decode_paraformer

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "paraformer"
CONFIG = json.loads((FIXTURE / "config.json").read_text(encoding="utf-8"))
REFERENCE = np.load(FIXTURE / "reference.npz")
CIF_CASES = np.load(FIXTURE / "cif.npz")
TOKENS = json.loads((FIXTURE / "tokens.json").read_text(encoding="utf-8"))
FEATURE_TOL = 1e-4
CIF_TOL = 1e-5
LOGPROB_TOL = 1e-4


def fixture_dimensions() -> ParaformerDimensions:
    model, encoder, decoder = CONFIG["model"], CONFIG["model"]["encoder_conf"], CONFIG["model"]["decoder_conf"]
    return ParaformerDimensions(
        output_size=encoder["output_size"], attention_heads=encoder["attention_heads"],
        linear_units=encoder["linear_units"], num_blocks=encoder["num_blocks"],
        decoder_attention_heads=decoder["attention_heads"], decoder_linear_units=decoder["linear_units"],
        decoder_blocks=decoder["num_blocks"], tail_threshold=model["predictor_conf"]["tail_threshold"],
        vocab_size=model["vocab_size"],
    )


@pytest.fixture(scope="module")
def model() -> Paraformer:
    model = Paraformer(fixture_dimensions())
    load_state_strict(model, load_checkpoint_state(FIXTURE / "model.pt"))  # exactly FunASR's tensors
    model.set_cmvn(*read_am_mvn(FIXTURE / "am.mvn"))
    return model.eval()


@pytest.fixture(scope="module")
def audio() -> np.ndarray:
    samples, rate = soundfile.read(FIXTURE / "audio.wav", dtype="float32")
    assert rate == SAMPLE_RATE == CONFIG["sample_rate"]
    return samples


def run(model: Paraformer, audio: np.ndarray, container: int | None = None) -> list[np.ndarray]:
    padded = np.zeros(container or len(audio), np.float32)
    padded[: len(audio)] = audio
    with torch.no_grad():
        return [t.numpy() for t in model(torch.from_numpy(padded)[None], torch.tensor([len(audio)]))]


def test_features_match_funasr(model, audio):
    with torch.no_grad():
        features, lengths = model.features(torch.from_numpy(audio)[None], torch.tensor([len(audio)]))
    expected = REFERENCE["features"]
    assert int(lengths[0]) == len(expected)
    np.testing.assert_allclose(features[0].numpy(), expected, atol=FEATURE_TOL, rtol=FEATURE_TOL)


def test_predictor_and_decoder_match_funasr(model):
    features = torch.from_numpy(REFERENCE["features"])[None]
    with torch.no_grad():
        memory, mask = model.encode(features, torch.tensor([features.shape[1]]))
        embeddings, counts, alphas, peaks = model.predictor(memory, mask)
        logprobs = model.decode(memory, mask, embeddings, counts)
    count = CONFIG["result"]["token_count"]
    assert int(counts[0]) == count == int(REFERENCE["token_num"]) > 0
    np.testing.assert_allclose(alphas[0].numpy(), REFERENCE["alphas"], atol=CIF_TOL)
    np.testing.assert_allclose(peaks[0].numpy(), REFERENCE["peaks"], atol=CIF_TOL)
    np.testing.assert_allclose(embeddings[0, :count].numpy(), REFERENCE["embeddings"][:count], atol=CIF_TOL)
    assert not embeddings[0, count:].any()  # rows past the count are exactly zero
    np.testing.assert_allclose(logprobs[0, :count].numpy(), REFERENCE["logprobs"][:count], atol=LOGPROB_TOL)


def test_audio_to_text_and_times_match_funasr(model, audio):
    outputs = run(model, audio, container=5 * SAMPLE_RATE)  # in a larger container
    result = ParaformerOutput.from_graph(outputs)
    np.testing.assert_array_equal(result.token_ids, REFERENCE["token_ids"])
    best = REFERENCE["logprobs"][: len(result.token_ids)].max(-1)
    np.testing.assert_allclose(result.token_logprobs, best, atol=LOGPROB_TOL)
    transcript = decode_paraformer(result, TOKENS)
    assert transcript.text == CONFIG["result"]["text"]
    times = [[round(w.start * 1000), round(w.end * 1000)] for w in transcript.words]
    assert times == CONFIG["result"]["timestamp"]


@pytest.mark.parametrize("row", range(4))
def test_cif_matches_funasr(row):
    """Row 0: 60 frames; 1: 41 of 60 valid; 2: seven tiny weights, no token fires; 3: sums near integers."""
    alphas = torch.from_numpy(CIF_CASES["tailed_alphas"][row: row + 1])  # FunASR's, with the tail
    hidden = torch.from_numpy(CIF_CASES["hidden"][row: row + 1])
    hidden = torch.cat([hidden, torch.zeros_like(hidden[:, :1])], 1)  # tail_process_fn's extra frame
    embeddings, fires, counts = cif(hidden, alphas)
    count = int(CIF_CASES["token_num"][row])
    assert int(counts[0]) == count
    np.testing.assert_allclose(fires[0].numpy(), CIF_CASES["fires"][row], atol=CIF_TOL)
    np.testing.assert_allclose(fires[0].numpy(), CIF_CASES["loop_fires"][row], atol=CIF_TOL)
    for reference in (CIF_CASES["embeddings"], CIF_CASES["loop_embeddings"]):
        np.testing.assert_allclose(embeddings[0, :count].numpy(), reference[row, :count], atol=CIF_TOL)
    assert not embeddings[0, count:].any()
    if row == 2:
        assert count == 0


def test_padding_invariance(model, audio):
    alone = ParaformerOutput.from_graph(run(model, audio))
    padded = ParaformerOutput.from_graph(run(model, audio, container=9 * SAMPLE_RATE))
    np.testing.assert_array_equal(alone.token_ids, padded.token_ids)
    for name in ("token_logprobs", "alphas", "peaks"):
        np.testing.assert_allclose(getattr(alone, name), getattr(padded, name), atol=4e-6)


@pytest.mark.parametrize("rows", ["count", "count + 3", "all"])
def test_decoder_stage_on_fewer_token_rows(model, audio, rows):
    """Stage two on the first K >= count token rows (a token container) gives the valid rows of all T + 1."""
    samples = torch.from_numpy(np.pad(audio, (0, 3 * SAMPLE_RATE)))[None]
    with torch.no_grad():
        memory, lengths, embeddings, counts, *_ = model.encoder_stage(samples, torch.tensor([len(audio)]))
        count = int(counts[0])
        k = {"count": count, "count + 3": count + 3, "all": embeddings.shape[1]}[rows]
        ids, logprobs = model.decoder_stage(memory, lengths, embeddings[:, :k], counts)
        all_ids, all_logprobs = model.decoder_stage(memory, lengths, embeddings, counts)
    assert 0 < count < embeddings.shape[1] - 3
    np.testing.assert_array_equal(ids[0, :count], all_ids[0, :count])
    np.testing.assert_allclose(logprobs[0, :count], all_logprobs[0, :count], atol=1e-6)
    assert not ids[0, count:].any() and not logprobs[0, count:].any()


def test_silence_gives_no_tokens(model, audio):
    """A predictor that sees no speech (alphas near 0): only the 0.45 tail, below one token."""
    quiet = Paraformer(model.dims)
    quiet.load_state_dict(model.state_dict())
    with torch.no_grad():
        quiet.predictor.cif_output.weight.zero_()
        quiet.predictor.cif_output.bias.fill_(-30.0)
    outputs = run(quiet.eval(), audio, container=4 * SAMPLE_RATE)
    assert int(outputs[2][0]) == 0 and not outputs[0].any()
    assert decode_paraformer(ParaformerOutput.from_graph(outputs), TOKENS).text == ""


def test_full_preset_is_paraformer_large():
    with torch.device("meta"):
        model = Paraformer(ParaformerDimensions.preset("full"))
    state = model.state_dict()
    assert state["decoder.output_layer.weight"].shape == (8404, 512)
    assert len([k for k in state if k.startswith("decoder.decoders.")]) == 16 * 18
    assert sum(p.numel() for p in model.parameters()) == 220_084_533  # paraformer-large: "220M"
