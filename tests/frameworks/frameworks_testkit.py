"""Helpers of the framework tests (test_pipecat.py, test_livekit.py, test_openai_agents.py): the held-out speech
recording."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import soundfile

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "server"))  # openai_testkit: the token, words(), knows_words()

from openai_testkit import HELD_OUT, knows_words, words  # noqa: E402

FRAME_MS = 20  # what transports deliver: 20 ms audio frames


def pcm_frames(path: Path = HELD_OUT) -> list[bytes]:
    """The recording (16 kHz mono) as 20 ms PCM16 frames, with 1 s of silence after it (the last turn ends)."""
    audio, rate = soundfile.read(path, dtype="int16")
    assert rate == 16000 and audio.ndim == 1
    audio = np.concatenate([audio, np.zeros(rate, np.int16)])
    step = rate * FRAME_MS // 1000
    return [audio[i:i + step].tobytes() for i in range(0, len(audio) - step + 1, step)]


def expected_words(model_dir: Path) -> list[str]:
    """The recording's words when the trained demo model is served; [] for the random test graph."""
    if not knows_words(model_dir):
        return []
    speech = json.loads(HELD_OUT.with_suffix(".json").read_text())["speech"]
    return words(" ".join(u["text"] for u in speech))


