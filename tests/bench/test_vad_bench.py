"""Smoke test of `python -m bench vad`: every VAD, noise and rate is measured on held-out espeak-ng speech
(no model, no server); in digital silence both VADs start a segment near the speech and nowhere else."""
from __future__ import annotations

from pathlib import Path

from test_bench import bench


def test_vad_bench_measures_every_vad_noise_and_rate(test_model_dir: Path) -> None:
    code, result, err = bench("vad", "--model", str(test_model_dir), "--utterances", "3", "--levels", "-50",
                              "--noises", "none,room", "--vads", "webrtc:3,silero:0.5")
    assert code == 0, err
    rows = result["rows"]
    assert [(r["vad"], r["noise"], r["rate"]) for r in rows] == [
        (vad, noise, rate) for vad in ("webrtc:3", "silero:0.5") for rate in (16000, 24000) for noise in ("none", "room")]
    for r in rows:
        assert r["missed"] == 0 and r["early_min"] <= r["early_p50"] <= r["early_max"]
        if r["noise"] == "none":
            assert r["noise_segments"] == r["alone"] == 0 and -0.2 < r["early_min"] and r["early_max"] < 0.3
    assert "| silero:0.5 | room | -50 | 24 kHz |" in err


def test_vad_bench_refuses_an_unknown_vad() -> None:
    code, _, err = bench("vad", "--vads", "rnnoise")
    assert code == 2 and "vad" in err
