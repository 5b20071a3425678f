"""Helpers of the OpenAI API tests (test_openai_http.py, test_openai_realtime.py)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import openai

from clients.client import connect
from pipeline.audio import SAMPLE_RATE

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "tests" / "fixtures" / "demo"
HELD_OUT = DEMO / "multi.wav"  # three utterances the demo model never trained on
TOKEN = "openai-test-token"


def knows_words(model_dir: Path) -> bool:
    """The trained demo model is served: compare words; otherwise (tiny random graph) shapes only."""
    return Path(model_dir).resolve() == (ROOT / "models" / "demo").resolve()


def words(text: str) -> list[str]:
    return re.sub(r"[^\w' ]+", " ", text.lower()).split()


def sdk(url: Any, key: str = TOKEN) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url.http}/v1", api_key=key, max_retries=0)


async def own_protocol_text(url: Any, audio: np.ndarray) -> str:
    """What our own WebSocket protocol answers for the same audio (sent at once, then stop)."""
    async with connect(str(url), token=TOKEN, sample_rate=SAMPLE_RATE) as stream:
        pcm = np.clip(np.round(audio * 32767), -32768, 32767).astype(np.int16)
        for i in range(0, len(pcm), SAMPLE_RATE // 10):
            await stream.send(pcm[i:i + SAMPLE_RATE // 10])
        await stream.stop()
    return " ".join(f.text for f in stream.finals)
