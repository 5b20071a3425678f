"""Qwen3-ASR against the `qwen-asr` package's own model on the committed fixture (no qwen-asr needed).

tests/fixtures/qwen3/ was made by tests/fixtures/make_qwen3_fixture.py: the reference
Qwen3ASRForConditionalGeneration at the tiny preset with seeded random weights, on three clips (several
attention windows with a partial tail chunk; whole chunks; a lone chunk under 1 s). Our model loads its
state_dict strictly and must match its WhisperFeatureExtractor's log-mel (computed here from raw audio),
its encoder output and prefill logits within 1e-4 (fp32) and its greedy tokens exactly, with each clip
alone and padded into a larger fixed container.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch

from models.qwen3_asr import Qwen3ASR, Qwen3ASRDimensions, build_prompt_ids, load_qwen3_state, prompt_capacity
from models.qwen3_audio import audio_token_lengths

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "qwen3"
CONFIG = json.loads((FIXTURE / "config.json").read_text(encoding="utf-8"))
REFERENCE = np.load(FIXTURE / "reference.npz")
CLIPS = list(CONFIG["clips"])
TOL = 1e-4
FEATURE_TOL = 1e-4  # float32 DFT-as-conv against torch.stft (measured 3.0e-5)
CONTAINER_FRAMES = 800  # 8 s: larger than every clip, several attention windows of the tiny preset


@pytest.fixture(scope="module")
def model() -> Qwen3ASR:
    dims = Qwen3ASRDimensions.from_dict(CONFIG["dims"])
    assert dims == Qwen3ASRDimensions.preset("tiny")
    model = Qwen3ASR(dims)
    load_qwen3_state(model, torch.load(FIXTURE / "model.pt", map_location="cpu", weights_only=True))
    return model.eval()


def container(mel: np.ndarray, frames: int) -> tuple[torch.Tensor, torch.Tensor]:
    """mel [n_mels, T] zero-padded to `frames` (garbage would do too: frames past the length are ignored)."""
    padded = np.zeros((1, mel.shape[0], frames), dtype=np.float32)
    padded[0, :, : mel.shape[1]] = mel
    return torch.from_numpy(padded), torch.tensor([mel.shape[1]])


def own_container(mel: np.ndarray) -> int:
    return -(-mel.shape[1] // 100) * 100


@pytest.mark.parametrize("clip", CLIPS)
@pytest.mark.parametrize("frames", ["own", CONTAINER_FRAMES])
def test_encoder_matches_reference(model, clip, frames):
    mel = REFERENCE[f"mel_{clip}"]
    expected = REFERENCE[f"encoder_{clip}"]
    with torch.no_grad():
        embeds, lengths = model.encode(*container(mel, own_container(mel) if frames == "own" else frames))
    assert int(lengths[0]) == expected.shape[0]
    np.testing.assert_allclose(embeds[0, : expected.shape[0]].numpy(), expected, atol=TOL, rtol=0)
    assert not embeds[0, expected.shape[0]:].any()  # padded rows are exactly zero


def test_token_lengths_follow_the_reference_formula():
    lengths = torch.tensor([1, 37, 99, 100, 101, 230, 1000, 3000, 2999])
    # the reference's _get_feat_extract_output_lengths, written out
    leave = lengths % 100
    feat = (leave - 1) // 2 + 1
    expected = ((feat - 1) // 2 + 1 - 1) // 2 + 1 + (lengths // 100) * 13
    assert torch.equal(audio_token_lengths(lengths, 100), expected)


@pytest.mark.parametrize("clip", CLIPS)
def test_prefill_logits_match_reference_in_a_padded_container(model, clip):
    mel = REFERENCE[f"mel_{clip}"]
    with torch.no_grad():
        embeds, lengths = model.encode(*container(mel, CONTAINER_FRAMES))
        slots = prompt_capacity(model.dims, embeds.shape[1])
        ids, prompt_lengths = build_prompt_ids(model.dims, [int(lengths[0])], slots)
        assert ids[0, : int(prompt_lengths[0])].tolist() == REFERENCE[f"prompt_{clip}"].tolist()
        ids[0, int(prompt_lengths[0]):] = 7  # whatever fills the padded slots must not matter
        logits, keys, values = model.prefill(ids, prompt_lengths, embeds)
    np.testing.assert_allclose(logits[0].numpy(), REFERENCE[f"logits_{clip}"], atol=TOL, rtol=0)
    assert keys.shape[3] == slots


@pytest.mark.parametrize("clip", CLIPS)
def test_greedy_tokens_match_reference(model, clip):
    mel = REFERENCE[f"mel_{clip}"]
    expected = REFERENCE[f"tokens_{clip}"].tolist()
    max_new = CONFIG["max_new_tokens"]
    alone = model.greedy_decode(*container(mel, own_container(mel)), max_new_tokens=max_new)
    padded = model.greedy_decode(*container(mel, CONTAINER_FRAMES), max_new_tokens=max_new, cache_slots=200)
    assert alone == padded == [expected]


def test_batch_rows_are_independent(model):
    """Two clips in one batch decode as each does alone (row masks, no cross-row leakage)."""
    mels = [REFERENCE[f"mel_{clip}"] for clip in CLIPS[:2]]
    batch = torch.zeros(2, mels[0].shape[0], CONTAINER_FRAMES)
    for row, mel in enumerate(mels):
        batch[row, :, : mel.shape[1]] = torch.from_numpy(mel)
    lengths = torch.tensor([mel.shape[1] for mel in mels])
    tokens = model.greedy_decode(batch, lengths, max_new_tokens=CONFIG["max_new_tokens"])
    assert tokens == [REFERENCE[f"tokens_{clip}"].tolist() for clip in CLIPS[:2]]


def test_state_dict_is_the_references(model):
    state = torch.load(FIXTURE / "model.pt", map_location="cpu", weights_only=True)
    assert set(state) == set(model.state_dict())
    with pytest.raises(ValueError, match="missing"):
        load_qwen3_state(Qwen3ASR(model.dims), {k: v for k, v in state.items() if "proj2" not in k})


def clip_audio(clip: str) -> np.ndarray:
    samples, rate = soundfile.read(FIXTURE.parent / "three_utterances.wav", dtype="float32")
    start, seconds = CONFIG["clips"][clip]
    return samples[int(start * rate): int(start * rate) + int(seconds * rate)]


@pytest.mark.parametrize("clip", CLIPS)
def test_features_from_raw_audio_match_whisper_feature_extractor(model, clip):
    audio = clip_audio(clip)
    expected = REFERENCE[f"mel_{clip}"]
    container = np.zeros((1, 8 * 16000), dtype=np.float32)
    container[0, : len(audio)] = audio
    container[0, len(audio):] = 0.5  # garbage past the valid length must not be read
    with torch.no_grad():
        alone, alone_lengths = model.features(torch.from_numpy(audio[None]), torch.tensor([len(audio)]))
        padded, padded_lengths = model.features(torch.from_numpy(container), torch.tensor([len(audio)]))
    assert int(alone_lengths[0]) == int(padded_lengths[0]) == expected.shape[1]
    np.testing.assert_allclose(alone[0].numpy(), expected, atol=FEATURE_TOL, rtol=0)
    np.testing.assert_allclose(padded[0, :, : expected.shape[1]].numpy(), expected, atol=FEATURE_TOL, rtol=0)
    assert not padded[0, :, expected.shape[1]:].any()
    tokens = model.greedy_decode(padded, padded_lengths, max_new_tokens=CONFIG["max_new_tokens"])
    assert tokens == [REFERENCE[f"tokens_{clip}"].tolist()]


def test_tied_embeddings_load_without_lm_head(model):
    """The released 0.6B ties lm_head to the token embedding; its checkpoint may omit lm_head.weight."""
    import dataclasses

    dims = dataclasses.replace(model.dims, text=dataclasses.replace(model.dims.text, tie_word_embeddings=True))
    tied = Qwen3ASR(dims)
    state = {k: v for k, v in model.state_dict().items() if k != "thinker.lm_head.weight"}
    load_qwen3_state(tied, state)
    embedding = state["thinker.model.embed_tokens.weight"]
    assert torch.equal(tied.thinker.lm_head.weight, embedding)
    assert tied.thinker.lm_head.weight.data_ptr() == tied.thinker.model.embed_tokens.weight.data_ptr()
