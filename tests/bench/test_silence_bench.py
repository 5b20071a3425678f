"""Smoke test of `python -m bench silence`: every door and every silence is measured, through a server the
command starts, on held-out espeak-ng speech (no figure is asserted beyond what the trim rule guarantees)."""
from __future__ import annotations

from pathlib import Path

from test_bench import bench

from bench.silence import DOORS


def test_silence_bench_measures_every_door_silence_and_noise(test_model_dir: Path, tmp_path: Path) -> None:
    """Digital silence and room noise before the speech, the 24 kHz doors, the server on Silero VAD."""
    save = tmp_path / "silence.json"
    code, result, err = bench("silence", "--model", str(test_model_dir), "--utterances", "3", "--silences", "0,1",
                              "--noises", "none,room", "--vad", "silero", "--save", str(save))
    assert code == 0, err
    assert list(result["wer"]) == ["0", "1", "room 0", "room 1"] and save.is_file()
    assert result["vad"] == "silero" and "| room 1 s |" in err
    for row in result["wer"].values():
        assert set(row) == set(DOORS)
        assert all(row[d]["words"] == row["model"]["words"] > 0 and row[d]["errors"] >= 0 for d in DOORS)
    assert "| silence 1 s |" in err and result["machine"]["cpu"]


def test_silence_bench_refuses_negative_silence() -> None:
    code, _, err = bench("silence", "--silences", "0,-1")
    assert code == 2 and "--silences" in err
    code, _, err = bench("silence", "--noises", "white")
    assert code == 2 and "--noises" in err
