"""Smoke test of `python -m bench frameworks`: every door, pipecat's and LiveKit's included, is measured
through a server the command starts, on held-out espeak-ng speech."""
from __future__ import annotations

from pathlib import Path

import pytest
from test_bench import bench

from bench.frameworks import DOORS

pytest.importorskip("pipecat", reason="pipecat-ai is not installed (pip install -e '.[frameworks]')")
pytest.importorskip("livekit.plugins.openai", reason="livekit-plugins-openai is not installed")
pytest.importorskip("livekit.plugins.deepgram", reason="livekit-plugins-deepgram is not installed")


def test_frameworks_bench_measures_every_door(test_model_dir: Path) -> None:
    code, result, err = bench("frameworks", "--model", str(test_model_dir), "--utterances", "2")
    assert code == 0, err
    row = result["wer"]["0.5"]
    assert set(row) == set(DOORS)
    assert all(row[d]["words"] == row["upload"]["words"] > 0 and row[d]["errors"] >= 0 for d in DOORS)
    assert "| silence 0.5 s |" in err and "pipecat" in err and "livekit" in err and "dg-livekit" in err
    timing = result["deepgram_timing"]
    assert timing["interims"] > 0 and timing["speech_final_after_end_silence"]["count"] == 2
