"""`python -m export train-demo` and `eval`: bad input exits with one clear line; the training loop runs."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from export import synth
from pipeline.audio import SAMPLE_RATE
from export.demo_card import demo_notice
from export.evaluate import word_errors
from export.demo_data import cmvn_from, length_batches
from export.train_demo import TrainOptions, build_model, demo_tokens, train, training_precision

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args: str, env: dict | None = None, prelude: str = "", timeout: float = 120) -> subprocess.CompletedProcess:
    code = f"import sys; {prelude}from export.__main__ import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True,
                          env=env, timeout=timeout)


def assert_one_line_error(proc: subprocess.CompletedProcess, words: str, code: int = 1) -> None:
    assert proc.returncode == code, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and words in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_existing_output_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "demo").mkdir()
    assert_one_line_error(run_cli("train-demo", "--out", str(tmp_path / "demo")), "already exists")


def test_a_budget_too_short_for_export_and_evaluation_is_refused(tmp_path: Path) -> None:
    assert_one_line_error(run_cli("train-demo", "--out", str(tmp_path / "demo"), "--minutes", "2"), "too short")
    assert not (tmp_path / "demo").exists()


def test_a_long_silence_share_outside_0_to_1_is_refused(tmp_path: Path) -> None:
    assert_one_line_error(run_cli("train-demo", "--out", str(tmp_path / "demo"), "--long-silence", "1.5"),
                          "--long-silence must be from 0 to 1")


def test_missing_espeak_is_reported(tmp_path: Path) -> None:
    env = dict(os.environ, PATH=str(tmp_path))  # an empty PATH: no espeak-ng anywhere
    assert_one_line_error(run_cli("train-demo", "--out", str(tmp_path / "demo"), env=env), "espeak-ng is not installed")


def test_missing_torch_is_reported(tmp_path: Path) -> None:
    try:
        synth.require_espeak()
    except RuntimeError:
        pytest.skip("espeak-ng is not installed here")
    proc = run_cli("train-demo", "--out", str(tmp_path / "demo"), prelude="sys.modules['torch'] = None; ")
    assert_one_line_error(proc, "torch", code=2)


@pytest.mark.parametrize("content", [None, "[]"])
def test_missing_or_empty_eval_set(tmp_path: Path, content: str | None) -> None:
    data = tmp_path / "set"
    data.mkdir()
    if content is not None:
        (data / "transcripts.json").write_text(content)
    proc = run_cli("eval", str(tmp_path / "no-model"), "--data", str(data))
    assert_one_line_error(proc, "empty" if content else "no transcripts.json")
    assert_one_line_error(run_cli("eval", str(tmp_path / "no-model"), "--data", str(tmp_path / "nope")), "does not exist")


def test_vocabulary_and_tokens() -> None:
    tokens = demo_tokens()
    assert tokens[0] == "<blank>" and len(set(tokens)) == len(tokens)
    words = {t[1:] for t in tokens if t.startswith("\u2581")}
    assert set(synth.DIGITS) <= words and {"start", "stop", "next", "yes", "no"} <= words
    assert [t for t in tokens if t.startswith("<|")] == ["<|en|>", "<|Speech|>", "<|NEUTRAL|>", "<|withitn|>", "<|woitn|>"]


def test_utterances_are_seeded_and_held_out_voices_are_unseen() -> None:
    a, b = synth.sample_utterances(50, 3), synth.sample_utterances(50, 3)
    assert a == b and a != synth.sample_utterances(50, 4)
    assert all(1 <= len(u.text.split()) <= 6 for u in a if u.text)
    train_variants = {u.voice.partition("+")[2] for u in synth.sample_utterances(500, 0)}
    held = synth.sample_utterances(50, 0, heldout=True, exclude=frozenset(u.text for u in a))
    assert not train_variants & {u.voice.partition("+")[2] for u in held}
    assert not {u.text for u in held} & {u.text for u in a}


def test_noise_only_utterances_have_no_text_and_their_level() -> None:
    noise = [u for u in synth.sample_utterances(400, 0) if not u.text]
    assert noise and all(u.noise_kind in synth.NOISE_KINDS for u in noise)
    audio = synth.render(noise[0])
    assert len(audio) == int(noise[0].noise_seconds * SAMPLE_RATE)
    assert abs(10 * np.log10(np.mean(audio.astype(np.float64) ** 2)) - noise[0].noise_dbfs) < 1.0
    assert not [u for u in synth.sample_utterances(400, 0, heldout=True) if not u.text]


def test_rooms_touch_only_training_audio_and_leave_texts_and_voices_alone() -> None:
    roomless = synth.Recipe(echo_probability=0.0, reverb_probability=0.0)
    train = synth.sample_utterances(1000, 0)
    plain = synth.sample_utterances(1000, 0, recipe=roomless)
    assert [(u.text, u.voice, u.speed) for u in train] == [(u.text, u.voice, u.speed) for u in plain]
    speech = [u for u in train if u.text]
    echoes, rooms = sum(u.echo_delay > 0 for u in speech), sum(u.rt60 > 0 for u in speech)
    recipe = synth.Recipe()
    assert abs(echoes / len(speech) - recipe.echo_probability) < 0.05
    assert abs(rooms / len(speech) - recipe.reverb_probability) < 0.05
    assert not any(u.echo_delay or u.rt60 for u in plain)
    assert not any(u.echo_delay or u.rt60 for u in synth.sample_utterances(300, 0, heldout=True))


def test_long_silences_touch_only_training_speech_and_leave_texts_and_voices_alone() -> None:
    recipe = synth.Recipe(long_silence_probability=0.35)
    plain, long = synth.sample_utterances(1000, 0), synth.sample_utterances(1000, 0, recipe=recipe)
    assert [(u.text, u.voice, u.speed, u.echo_delay) for u in plain] == [(u.text, u.voice, u.speed, u.echo_delay) for u in long]
    speech = [(p, u) for p, u in zip(plain, long) if u.text]
    changed = [(p, u) for p, u in speech if (p.lead, p.trail) != (u.lead, u.trail)]
    assert abs(len(changed) / len(speech) - 0.35) < 0.05
    lo, hi = recipe.long_silence
    for p, u in changed:
        assert (u.lead == p.lead or lo <= u.lead <= hi) and (u.trail == p.trail or lo <= u.trail <= hi)
    assert any(u.lead != p.lead for p, u in changed) and any(u.trail != p.trail for p, u in changed)
    assert synth.sample_utterances(300, 0, heldout=True) == synth.sample_utterances(300, 0, heldout=True, recipe=recipe)
    assert plain == synth.sample_utterances(1000, 0, recipe=synth.Recipe(long_silence_probability=0.0))


def test_feedback_echo_repeats_with_decaying_gain() -> None:
    impulse = np.zeros(1000, np.float32)
    impulse[0] = 1.0
    out = synth.feedback_echo(impulse, 160, 0.4)
    assert np.flatnonzero(out).tolist() == [0, 160, 320, 480, 640, 800, 960]
    np.testing.assert_allclose(out[::160], 0.4 ** np.arange(7), rtol=1e-6)


def test_reverberation_keeps_the_direct_sound_and_its_ratio() -> None:
    impulse = np.zeros(SAMPLE_RATE, np.float32)
    impulse[100] = 1.0
    out = synth.reverberate(impulse, rt60=0.3, direct_to_reverb_db=6.0, seed=1)
    assert len(out) == len(impulse) and np.abs(out[:100]).max() < 1e-6 and out[100] == pytest.approx(1.0, abs=1e-5)
    tail = out[101:].astype(np.float64)
    assert 10 * np.log10(1.0 / np.sum(tail**2)) == pytest.approx(6.0, abs=0.01)
    assert np.sum(tail[int(0.25 * SAMPLE_RATE):] ** 2) < 1e-4 * np.sum(tail**2)  # 50 dB down well before rt60


def test_word_errors() -> None:
    assert word_errors("three five oh nine", "three five oh nine") == 0
    assert word_errors("three five oh nine", "three oh nine one") == 2
    assert word_errors("stop", "") == 1 and word_errors("", "go") == 1


def test_length_batches_cover_everything_once() -> None:
    lengths = np.random.default_rng(0).integers(10, 80, 300)
    batches = length_batches(lengths, 600, np.random.default_rng(1))
    assert sorted(np.concatenate(batches).tolist()) == list(range(300))
    assert all(lengths[b].max() * len(b) <= 600 or len(b) == 1 for b in batches)


def test_training_precision_auto_follows_the_cpu() -> None:
    import torch

    native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    assert training_precision("auto") == ("bf16" if native else "fp32")
    assert training_precision("fp32") == "fp32" and training_precision("bf16") == "bf16"
    with pytest.raises(ValueError, match="unknown precision 'fp16'"):
        training_precision("fp16")


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_few_training_steps_reduce_nothing_to_nan(precision: str) -> None:
    """The training loop end to end on random features (no espeak-ng): 3 steps, finite loss, a summary."""
    import torch

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    features = [rng.standard_normal((int(rng.integers(20, 40)), 560)).astype(np.float16) for _ in range(12)]
    texts = [" ".join(rng.choice(synth.DIGITS, 3)) for _ in range(12)]
    model = build_model(len(demo_tokens()))
    model.set_cmvn(*cmvn_from(features))
    before = [p.detach().clone() for p in model.parameters()]
    options = TrainOptions(steps=3, minutes=5, warmup=1, max_frames=200, threads=1, log_every=1, precision=precision)
    lines: list[str] = []
    summary = train(model, features, texts, (features[:4], texts[:4]), options, log=lines.append)
    assert summary["precision"] == precision and all(p.dtype == torch.float32 for p in model.parameters())
    assert summary["steps"] == 3 and 0 <= summary["heldout_greedy_wer_torch"] <= 1.5
    assert all("nan" not in line for line in lines)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.slow
def test_one_step_smoke_run(tmp_path: Path) -> None:
    """The whole command with a 1-step budget: data, training, export, held-out eval, card, rename."""
    out = tmp_path / "demo"
    checkpoint = tmp_path / "checkpoint"
    proc = run_cli("train-demo", "--out", str(out), "--utterances", "40", "--steps", "1", "--eval-utterances", "4",
                   "--checkpoint", str(checkpoint), timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # fine-tuned from that checkpoint on room noise and the 24 kHz round trip (issue 36)
    tuned = tmp_path / "tuned"
    proc = run_cli("train-demo", "--out", str(tuned), "--utterances", "40", "--steps", "1", "--eval-utterances", "4",
                   "--init-from", str(checkpoint), "--room-noise", "0.5", "--round-trip", "0.5", "--peak-lr", "1e-4",
                   timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    source = json.loads((tuned / "manifest.json").read_text())["source"]
    assert source["recipe"]["room_noise_probability"] == 0.5 and f"--init-from {checkpoint}" in source["command"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["source"]["training"]["steps"] == 1
    assert manifest["notice"] == demo_notice()  # the page's and the log's line about the demo model
    assert {"model.onnx", "model.int8.onnx", "tokens.txt", "README.md"} <= {p.name for p in out.iterdir()}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary directory left


def test_room_noise_touches_only_training_speech_and_leaves_the_rest_alone() -> None:
    """--room-noise and --round-trip (issue 36) change neither texts, voices, rooms nor silences, nor the
    held-out set; their shares and levels are the recipe's."""
    recipe = synth.Recipe(long_silence_probability=0.35, room_noise_probability=0.5, round_trip_probability=0.3)
    before = synth.sample_utterances(1000, 0, recipe=synth.Recipe(long_silence_probability=0.35))
    after = synth.sample_utterances(1000, 0, recipe=recipe)
    keep = ("text", "voice", "speed", "lead", "trail", "echo_delay", "rt60", "snr_db", "noise_seed")
    assert [[getattr(u, k) for k in keep] for u in before] == [[getattr(u, k) for k in keep] for u in after]
    speech = [u for u in after if u.text]
    noisy = [u for u in speech if u.room_noise]
    assert abs(len(noisy) / len(speech) - 0.5) < 0.05 and {u.room_noise for u in noisy} == set(synth.ROOM_NOISE_KINDS)
    assert all(-60 <= u.room_noise_dbfs <= -35 for u in noisy) and not any(u.room_noise for u in after if not u.text)
    assert abs(sum(u.round_trip for u in speech) / len(speech) - 0.3) < 0.05
    assert synth.sample_utterances(300, 0, heldout=True) == synth.sample_utterances(300, 0, heldout=True, recipe=recipe)


def test_room_noise_lies_under_the_whole_utterance_and_the_round_trip_keeps_its_length() -> None:
    try:
        synth.require_espeak()
    except RuntimeError:
        pytest.skip("espeak-ng is not installed here")
    u = synth.Utterance(text="stop one", voice="en-us", words_per_minute=165, pitch=50, word_gap=2, speed=1.0,
                        gain=1.0, lead=0.5, trail=0.5, snr_db=None, tilt=0.0, noise_seed=3)
    clean = synth.render(u)
    noisy = synth.render(dataclasses.replace(u, room_noise="brown", room_noise_dbfs=-45.0))
    lead = int(0.5 * SAMPLE_RATE)
    assert not clean[:lead].any() and noisy[:lead].all()  # digital silence before the speech, noise now ...
    added = (noisy - clean).astype(np.float64)  # ... and under it, at its level
    assert 20 * np.log10(np.sqrt(np.mean(added**2))) == pytest.approx(-45, abs=0.1)
    tripped = synth.render(dataclasses.replace(u, round_trip=True))
    assert len(tripped) == len(clean) and np.abs(tripped - clean).max() > 0
    np.testing.assert_allclose(tripped, clean, atol=0.05)  # band-limited and requantised, the same speech


def test_fine_tuning_needs_a_checkpoint_and_shares_are_checked(tmp_path: Path) -> None:
    assert_one_line_error(run_cli("train-demo", "--out", str(tmp_path / "demo"), "--room-noise", "2"),
                          "--room-noise must be from 0 to 1")
    assert_one_line_error(run_cli("train-demo", "--out", str(tmp_path / "demo"), "--init-from", str(tmp_path)),
                          "no model.pt and am.mvn there")
