"""The shipped demo model (models/demo) through the serving engine, on committed held-out espeak-ng fixtures.

Fixtures: tests/fixtures/demo (made by tests/fixtures/make_demo_fixtures.py): voices whose variants the
model never heard in training, saying word sequences that were not training texts.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import soundfile

from export.demo_card import REAL_SPEECH, real_speech_block
from export.evaluate import evaluate, load_eval_dir, word_errors
from export.synth import NOISE_KINDS, colored_noise
from export.train_demo import LANGUAGE_PROMPTS, LANGUAGES
from export.verify import MAX_SCALED_ERR, errors, verify
from pipeline.audio import PROMPT_FRAMES, SAMPLE_RATE, seconds_to_samples
from pipeline.families.sensevoice.decoding import decode_ctc
from pipeline.engine import Engine, EngineOptions
from pipeline.errors import ProtocolError
from pipeline.modeldir import read_model_directory
from server.model_info import model_info

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "models" / "demo"
FIXTURES = ROOT / "tests" / "fixtures" / "demo"

pytestmark = pytest.mark.skipif(not (DEMO / "manifest.json").is_file(), reason="models/demo is not built")


@pytest.fixture(scope="module", params=["fp32", "int8"])
def engine(request) -> Engine:
    return Engine(DEMO, EngineOptions(device="cpu", precision=request.param, threads=1)).load()


@pytest.fixture(scope="module")
def singles():
    return load_eval_dir(FIXTURES)


def test_model_directory_is_small_and_described() -> None:
    model = read_model_directory(DEMO)
    size = sum(p.stat().st_size for p in DEMO.iterdir())
    assert size < 20 * 1024 * 1024
    assert set(model.manifest.files) == {"fp32", "int8"}
    source = model.manifest.source
    assert source["kind"] == "trained" and "train-demo" in source["command"]
    assert {"seed", "utterances", "recipe"} <= set(source)
    assert model.tokens[0] == "<blank>"
    assert all(t.startswith("\u2581") or t.startswith("<|") for t in model.tokens[1:])
    assert "demonstration model" in (DEMO / "README.md").read_text(encoding="utf-8")


def test_demo_model_says_only_english() -> None:
    """Trained on English with the auto and en prompts only: its manifest (so /v1/model, the page, the
    startup log, a refused `language`) lists those, not SenseVoiceSmall's five languages."""
    manifest = read_model_directory(DEMO).manifest
    assert manifest.languages == LANGUAGES == {"auto": 0, "en": 4}
    assert tuple(manifest.languages.values()) == LANGUAGE_PROMPTS
    assert model_info(read_model_directory(DEMO))["languages"] == ["en"]
    with pytest.raises(ProtocolError, match="unknown language 'zh'; this model knows auto, en"):
        Engine(DEMO, EngineOptions(device="cpu")).language_id("zh")


def test_demo_card_shows_pull_not_the_manual_export() -> None:
    card = (DEMO / "README.md").read_text(encoding="utf-8")
    assert real_speech_block() in card and "python -m export pull sensevoice-small" in real_speech_block()
    assert "--checkpoint" not in card and "unipad --model models/" not in card
    assert all(command in read_model_directory(DEMO).manifest.notice for command in REAL_SPEECH)


def test_held_out_voices(engine: Engine, singles) -> None:
    errors = words = 0
    for item in singles:
        t = engine.transcribe(item.audio)
        assert (t.language, t.emotion, t.event) == ("en", "NEUTRAL", "Speech")
        errors += word_errors(item.text, t.text)
        words += len(item.text.split())
    assert errors <= 1, f"{errors} word errors in {words} words"


def test_eval_reports_wer_by_held_out_voice(singles) -> None:
    result = evaluate(DEMO, singles, "int8", threads=1)
    voices = json.loads((FIXTURES / "transcripts.json").read_text(encoding="utf-8"))
    assert {g for g, _, _ in result.groups} == {v["voice"].partition("+")[2] for v in voices}
    assert sum(e for _, e, _ in result.groups) == result.word_errors
    assert sum(n for _, _, n in result.groups) == result.words
    rates = [e / n for _, e, n in result.groups]
    assert rates == sorted(rates, reverse=True)


def test_itn_prompt_gives_the_same_words(engine: Engine, singles) -> None:
    item = singles[0]
    assert engine.transcribe(item.audio, language="en", itn=True).text == engine.transcribe(item.audio).text


def test_padding_does_not_change_the_text(singles) -> None:
    """The engine's container padding vs. the graph run on exactly the clip's own length."""
    engine = Engine(DEMO, EngineOptions(device="cpu", precision="fp32", containers=(30.0,), threads=1)).load()
    model = read_model_directory(DEMO)
    session = ort.InferenceSession(str(model.onnx_path("fp32")), providers=["CPUExecutionProvider"])
    for item in singles[:3]:
        n = len(item.audio)
        logprobs, lengths = session.run(["logprobs", "logprob_lengths"], {
            "audio": item.audio[None].astype(np.float32), "audio_lengths": np.array([n], np.int32),
            "language": np.array([0], np.int32), "textnorm": np.array([15], np.int32)})
        unpadded = decode_ctc(logprobs[0], int(lengths[0]), model.tokens)
        padded_logprobs, padded_length = engine.run(item.audio)
        assert padded_length == lengths[0]
        np.testing.assert_allclose(padded_logprobs[:padded_length], logprobs[0][: lengths[0]], atol=2e-3)
        assert engine.transcribe(item.audio).text == unpadded.text
        assert padded_length > PROMPT_FRAMES


def test_shipped_model_passes_verify() -> None:
    """`python -m export verify models/demo` on this CPU: padding and batch invariance within the scaled
    1e-5 bound, int8 bit-identical, the in-graph decoding equal to the host's, static shapes."""
    report = verify(DEMO, None, None, (5.0, 29.0))
    assert report["passed"], report
    assert report["max_scaled_err"] <= MAX_SCALED_ERR and report["tokens_equal"]
    assert all(r["max_abs_err"] == 0 for r in report["precisions"]["int8"]["lengths"].values())
    assert all(r["batch"]["max_abs_err"] == 0 for r in report["precisions"]["fp32"]["lengths"].values())


def test_verify_scales_the_error_by_the_log_prob() -> None:
    """The bound's measure: absolute for |log-prob| <= 1, relative beyond (float32's resolution)."""
    alone = np.array([-0.5, -24.5, -40.0])
    figures = errors(alone, alone + np.array([4e-6, 2e-5, 0.0]))
    assert figures["max_abs_err"] == pytest.approx(2e-5)
    assert figures["max_scaled_err"] == pytest.approx(4e-6)  # -0.5 counts absolutely; -24.5's is 8.2e-7
    assert errors(alone, alone + np.array([0.0, 0.0, 1e-3]))["max_scaled_err"] == pytest.approx(2.5e-5)


def test_multi_utterance_recording(engine: Engine) -> None:
    audio, rate = soundfile.read(FIXTURES / "multi.wav", dtype="float32")
    assert rate == SAMPLE_RATE
    sidecar = json.loads((FIXTURES / "multi.json").read_text(encoding="utf-8"))
    # Cut as the server's segmenter would (the model never heard 1 s pauses inside an utterance).
    for u in sidecar["speech"]:
        clip = audio[max(0, seconds_to_samples(u["start"] - 0.2)): seconds_to_samples(u["end"] + 0.3)]
        t = engine.transcribe(clip, offset=u["start"] - 0.2)
        assert word_errors(u["text"], t.text) <= 1, (u["text"], t.text)
        if t.words:  # token times fall inside the clip
            assert u["start"] - 0.25 <= t.words[0].start and t.words[-1].end <= u["end"] + 0.35


@pytest.mark.parametrize("kind", NOISE_KINDS)
def test_loud_noise_gives_no_words(engine: Engine, kind: str) -> None:
    for dbfs in (-30.0, -10.0):
        assert engine.transcribe(colored_noise(kind, seconds_to_samples(3.0), dbfs, seed=7)).text == ""
